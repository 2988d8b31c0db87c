"""Float64 reference for the paged-attention kernels: gather the blocks, then dense attention."""

from __future__ import annotations

import torch


def gather(cache: torch.Tensor, block_table: torch.Tensor, num_tokens: int, scale: float = 1.0) -> torch.Tensor:
    """The first `num_tokens` tokens of one sequence as a dense [tokens, kv_heads, dim] float64 tensor."""
    block_size = cache.shape[1]
    num_blocks = -(-num_tokens // block_size)
    blocks = cache[block_table[:num_blocks].long()].to(torch.float64) * scale
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[:num_tokens]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal_offset: int | None) -> torch.Tensor:
    """q [n, heads, d], k/v [ctx, kv_heads, d] → [n, heads, d]; query i sees keys ≤ causal_offset + i."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.to(torch.float64), k) * scale
    if causal_offset is not None:
        rows = torch.arange(q.shape[0])[:, None] + causal_offset
        scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > rows, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


def reference_decode(q, k_cache, v_cache, block_tables, context_lens, scale=None, k_scale=1.0, v_scale=1.0):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = []
    for s in range(q.shape[0]):
        n = int(context_lens[s])
        k = gather(k_cache, block_tables[s], n, k_scale)
        v = gather(v_cache, block_tables[s], n, v_scale)
        out.append(_attend(q[s : s + 1], k, v, scale, None)[0])
    return torch.stack(out)


def reference_prefill(q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale=None,
                      k_scale=1.0, v_scale=1.0):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = []
    for s in range(context_lens.shape[0]):
        start, end = int(query_start_loc[s]), int(query_start_loc[s + 1])
        n = int(context_lens[s])
        k = gather(k_cache, block_tables[s], n, k_scale)
        v = gather(v_cache, block_tables[s], n, v_scale)
        out.append(_attend(q[start:end], k, v, scale, n - (end - start)))
    return torch.cat(out)
