"""Paged prefill / chunked-prefill attention: new tokens attend causally over the paged KV.

New tokens' K/V are first scattered into the cache (kernels/cache_write.py); then query token i
of a sequence with `q_len` new tokens and `ctx` tokens in all sits at position
`past + i` (past = ctx - q_len) and attends to cache positions 0..past + i: cached blocks from
earlier chunks or prefix-cache hits, and itself.

GQA packing. Grid (seq, kv_head, query block). A program takes BLOCK_Q = BLOCK_M // group query
tokens and all `group` query heads that share its KV head, folded into the M dimension of the
dots, so each KV tile is loaded once for the whole group:

    row r of the [BLOCK_M, HEAD_DIM_PAD] query tile  =  token first_q + r // group, head kv_head*group + r % group
    (group 4, BLOCK_M 64: rows 0-3 = token 0 heads 0-3, rows 4-7 = token 1 heads 0-3, ... 16 tokens)

Masked and unmasked tiles apart. Keys 0..past + first_q are visible to every row; keys up to
past + last_q to some. Tiles wholly inside the first range run without a causal mask, the rest
(at most cdiv(BLOCK_Q, TILE) + 1 of them) with it:

    keys   |0 ........................ past+first_q|...... past+last_q|
    tiles  [  unmasked  ][  unmasked  ][  masked   ][  masked  ]

Both loops are software-pipelined (`tl.range(..., num_stages)`).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kernels.layout import (
    FP8_DTYPE,
    check_cache,
    check_tables,
    dot_in_fp32,
    head_dim_pad,
    load_tile,
    output_like,
    softmax_update,
    to_dot_dtype,
    token_rows,
)

PREFILL_BLOCK_M = 64  # query rows (tokens x heads of a group) per program
PREFILL_TILE = 32  # KV tokens per loop iteration
PREFILL_NUM_STAGES = 3


# Warps per program. With 4 warps head_dim 128 spilled 104-160 bytes of stack on sm_90 (fp16, fp8;
# Triton 3.9); with 8 it takes 200-218 registers (252 for fp8 at head_dim 96), no stack.
PREFILL_NUM_WARPS = 8


def prefill_meta(group: int, head_dim: int, block_size: int, fp8: bool, dot_fp32: bool = False) -> dict[str, Any]:
    """The constexprs and launch options of `_prefill_kernel` (the wrapper's and compile_check's)."""
    block_m = max(PREFILL_BLOCK_M, triton.next_power_of_2(group))
    return {"QUERY_GROUP": group, "HEAD_DIM": head_dim, "HEAD_DIM_PAD": head_dim_pad(head_dim),
            "BLOCK_SIZE": block_size, "TILE": PREFILL_TILE, "BLOCK_M": block_m, "BLOCK_Q": block_m // group,
            "IS_FP8": fp8, "DOT_FP32": dot_fp32, "NUM_STAGES": PREFILL_NUM_STAGES,
            "num_warps": PREFILL_NUM_WARPS}


@triton.jit
def _prefill_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, query_start_ptr,
    scale, k_scale, v_scale,
    stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bts,
    stride_ot, stride_oh,
    QUERY_GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, IS_FP8: tl.constexpr,
    DOT_FP32: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    first_q = tl.program_id(2) * BLOCK_Q
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    if first_q >= q_len:
        return
    ctx = tl.load(context_lens_ptr + seq)
    past = ctx - q_len

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_DIM_PAD)
    t = tl.arange(0, TILE)
    q_tok = first_q + r // QUERY_GROUP
    heads = kv_head * QUERY_GROUP + r % QUERY_GROUP
    r_mask = (r < BLOCK_Q * QUERY_GROUP) & (q_tok < q_len)  # rows past either hold no query
    pos = past + q_tok
    q_mask = r_mask[:, None] & (d < HEAD_DIM)[None, :]
    q_rows = (q_start + q_tok).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=q_mask,
                other=0.0)
    q = to_dot_dtype(q, k_cache_ptr, IS_FP8, DOT_FP32)
    seq_row = seq.to(tl.int64) * stride_bts
    qk_scale = scale * k_scale

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    num_unmasked = (past + first_q + 1) // TILE  # tiles every row sees whole
    for tile in tl.range(0, num_unmasked, num_stages=NUM_STAGES):
        block, slot = token_rows(block_tables_ptr, seq_row, tile * TILE + t, BLOCK_SIZE)
        k = load_tile(k_cache_ptr, block * stride_kb + slot * stride_kt + kv_head * stride_kh, d, HEAD_DIM,
                      HEAD_DIM_PAD, IS_FP8, DOT_FP32)
        v = load_tile(v_cache_ptr, block * stride_vb + slot * stride_vt + kv_head * stride_vh, d, HEAD_DIM,
                      HEAD_DIM_PAD, IS_FP8, DOT_FP32)
        m, l_sum, acc = softmax_update(tl.dot(q, tl.trans(k)) * qk_scale, v, m, l_sum, acc, v_scale)

    num_tiles = tl.cdiv(past + tl.minimum(first_q + BLOCK_Q, q_len), TILE)  # through the last row's key
    for tile in tl.range(num_unmasked, num_tiles, num_stages=NUM_STAGES):
        tokens = tile * TILE + t
        block, slot = token_rows(block_tables_ptr, seq_row, tl.minimum(tokens, ctx - 1), BLOCK_SIZE)
        k = load_tile(k_cache_ptr, block * stride_kb + slot * stride_kt + kv_head * stride_kh, d, HEAD_DIM,
                      HEAD_DIM_PAD, IS_FP8, DOT_FP32)
        v = load_tile(v_cache_ptr, block * stride_vb + slot * stride_vt + kv_head * stride_vh, d, HEAD_DIM,
                      HEAD_DIM_PAD, IS_FP8, DOT_FP32)
        # key 0 <= pos is visible to every row, so no row's scores are all -inf
        visible = (tokens[None, :] <= pos[:, None]) & (tokens < ctx)[None, :]
        s = tl.where(visible, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m, l_sum, acc = softmax_update(s, v, m, l_sum, acc, v_scale)

    out = acc / l_sum[:, None]
    tl.store(out_ptr + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_attention_prefill(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, query_start_loc: torch.Tensor, max_query_len: int,
    scale: float | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal attention of new tokens over paged KV (which already holds them: `write_kv_cache`).

    `q`: [total_new_tokens, heads, head_dim], sequences packed; `query_start_loc` [seqs + 1] int32
    gives each sequence's first row; `context_lens` counts cached + new tokens (>= the new ones).
    """
    _, block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
    assert q.dim() == 3 and q.shape[2] == head_dim and q.stride(2) == 1, "q is [tokens, heads, head_dim]"
    assert q.dtype in (torch.float16, torch.bfloat16, torch.float32)
    num_heads = q.shape[1]
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    num_seqs = context_lens.shape[0]
    check_tables(block_tables, context_lens, num_seqs)
    assert query_start_loc.dtype == torch.int32 and query_start_loc.shape == (num_seqs + 1,)
    scale = head_dim**-0.5 if scale is None else scale
    meta = prefill_meta(num_heads // num_kv_heads, head_dim, block_size, k_cache.dtype == FP8_DTYPE,
                        dot_in_fp32(k_cache))
    out = output_like(q)
    _prefill_kernel[(num_seqs, num_kv_heads, triton.cdiv(max_query_len, meta["BLOCK_Q"]))](
        out, q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale, k_scale, v_scale,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        **meta,
    )
    return out
