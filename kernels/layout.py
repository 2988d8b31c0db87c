"""What the paged-attention kernels share: the cache layout, its checks, and the tile helpers.

Memory layout (vLLM's):

    k_cache, v_cache   [num_blocks, block_size, num_kv_heads, head_dim]   fp16 / bf16 / fp8 (e4m3fn)
    block_tables       [num_seqs, max_blocks_per_seq]  int32: logical block i of seq s lives in
                       physical block block_tables[s, i]; rows need not be contiguous or sorted
    context_lens       [num_seqs] int32: tokens of each sequence in the cache (1 <= len)

    token t of sequence s  ->  k_cache[block_tables[s, t // block_size], t % block_size, kv_head, :]

A tile is TILE consecutive tokens of one sequence, independent of the block size: it may span
several pages (TILE > block_size) or part of one (TILE < block_size). Its rows are gathered one
token at a time, each through its own block-table entry (as vLLM's and SGLang's Triton kernels):

    tokens    t0 t0+1 ... t0+TILE-1                       (block_size 16, TILE 32: two pages)
    blocks    bt[s, t // 16]  ->   7  7 ... 7 | 2  2 ... 2
    rows      k_cache[7, 0..15, h, :] ; k_cache[2, 0..15, h, :]   -> one [TILE, HEAD_DIM_PAD] tile

head_dim need not be a power of two (80, 96): tiles are padded to the next power of two
(HEAD_DIM_PAD) with masked loads that read zeros, which add nothing to q.k or p.v, and the
padded columns are never stored.

fp8 KV: the cache holds e4m3fn values x / scale (one scale per tensor, for K and for V); the
kernels multiply by the scale after loading. Dots run on the cache dtype (fp16/bf16; fp8 is
upcast to fp16) with fp32 accumulation.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

FP8_DTYPE = torch.float8_e4m3fn
KV_DTYPES = (torch.float16, torch.bfloat16, FP8_DTYPE)
BLOCK_SIZES = (16, 32, 64, 128)
HEAD_DIMS = (64, 80, 96, 128)  # tested; any head_dim from 16 to 256 compiles (padded to a power of two)


def head_dim_pad(head_dim: int) -> int:
    """The power of two a tile's head dimension is padded to (tl.dot needs at least 16)."""
    return max(16, triton.next_power_of_2(head_dim))


def dot_in_fp32(k_cache: torch.Tensor) -> bool:
    """Triton's CPU interpreter computes bf16 `tl.dot` wrongly (seen with triton 3.9); upcast there only."""
    return k_cache.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """(num_blocks, block_size, num_kv_heads, head_dim) of a valid cache pair; asserts otherwise."""
    assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape, "caches are [blocks, block_size, kv_heads, dim]"
    assert k_cache.dtype == v_cache.dtype and k_cache.dtype in KV_DTYPES, f"unsupported KV dtype {k_cache.dtype}"
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "head_dim must be contiguous"
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    assert block_size in BLOCK_SIZES, f"block_size {block_size} not in {BLOCK_SIZES}"
    assert 16 <= head_dim <= 256 and head_dim % 8 == 0, f"head_dim {head_dim}: a multiple of 8 from 16 to 256"
    return num_blocks, block_size, num_kv_heads, head_dim


def check_tables(block_tables: torch.Tensor, context_lens: torch.Tensor, num_seqs: int) -> None:
    assert block_tables.dtype == torch.int32 and block_tables.dim() == 2 and block_tables.shape[0] == num_seqs
    assert block_tables.stride(1) == 1, "block table rows must be contiguous"
    assert context_lens.dtype == torch.int32 and context_lens.shape == (num_seqs,)


def output_like(q: torch.Tensor) -> torch.Tensor:
    """The attention output: q's shape, q's dtype (fp16 for an fp32 query)."""
    return torch.empty(q.shape, dtype=q.dtype if q.dtype != torch.float32 else torch.float16, device=q.device)


@triton.jit
def to_dot_dtype(x, cache_ptr, IS_FP8: tl.constexpr, DOT_FP32: tl.constexpr):
    """The dtype dots run in: fp16 for fp8 caches, fp32 where the interpreter needs it, else the cache's."""
    if IS_FP8:
        x = x.to(tl.float16)
    elif DOT_FP32:
        x = x.to(tl.float32)
    else:
        x = x.to(cache_ptr.dtype.element_ty)
    return x


@triton.jit
def token_rows(block_tables_ptr, seq_row, tokens, BLOCK_SIZE: tl.constexpr):
    """(physical block, slot in it) of each token: a per-token gather from the sequence's block-table row.

    `seq_row` is the row's offset in the table. Every token must lie inside the context: callers
    clamp a tail tile's tokens to ctx - 1 (re-reading the last token, which the scores then mask),
    so neither this gather nor the KV loads need a token mask.
    """
    block = tl.load(block_tables_ptr + seq_row + tokens // BLOCK_SIZE).to(tl.int64)
    return block, tokens % BLOCK_SIZE


@triton.jit
def load_tile(cache_ptr, offsets, d, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, IS_FP8: tl.constexpr,
              DOT_FP32: tl.constexpr):
    """[TILE, HEAD_DIM_PAD] rows at `offsets` (one per token) in the dot dtype; padded columns read zero."""
    ptrs = cache_ptr + offsets[:, None] + d[None, :]
    x = tl.load(ptrs) if HEAD_DIM == HEAD_DIM_PAD else tl.load(ptrs, mask=(d < HEAD_DIM)[None, :], other=0.0)
    return to_dot_dtype(x, cache_ptr, IS_FP8, DOT_FP32)


@triton.jit
def softmax_update(s, v, m, l_sum, acc, v_scale):
    """Fold one tile's scores `s` [M, TILE] and values `v` [TILE, D] into the running state (fp32):

        m <- max(m, max_j s_j)
        l <- l*e^(m_old - m) + sum_j e^(s_j - m)
        acc <- acc*e^(m_old - m) + sum_j e^(s_j - m)*v_j

    A row may score -inf throughout a tile only once an earlier tile gave it a finite m (the callers'
    first tile shows every row at least key 0), so m, alpha and p never see -inf - (-inf).
    """
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l_sum = l_sum * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v) * v_scale
    return m_new, l_sum, acc
