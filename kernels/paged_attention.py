"""Paged attention in Triton: decode (with a split-K path), chunked prefill, and the cache write.

Memory layout (vLLM's):

    k_cache, v_cache   [num_blocks, block_size, num_kv_heads, head_dim]   fp16 / bf16 / fp8 (e4m3)
    block_tables       [num_seqs, max_blocks_per_seq]  int32: logical block i of seq s lives in
                       physical block block_tables[s, i]; rows need not be contiguous or sorted
    context_lens       [num_seqs] int32: tokens of each sequence in the cache (1 ≤ len)

    token t of sequence s  →  k_cache[block_tables[s, t // block_size], t % block_size, kv_head, :]

Decode (one query token per sequence). Program (s, kv_head, split) loads the query rows of all
`num_heads / num_kv_heads` query heads that share `kv_head` (GQA), so every KV block is read
once per program, and walks its range of logical blocks, a tile of `DECODE_TILE` tokens at a
time (a tile never crosses a block), with an online softmax in fp32:

    m ← max(m, max_j s_j);  l ← l·e^(m_old − m) + Σ_j e^(s_j − m);  acc ← acc·e^(m_old − m) + Σ_j e^(s_j − m)·v_j

With one split it writes acc / l. With several (flash-decoding, for long contexts and small
batches) each split writes (acc, m, l) and `_reduce_splits_kernel` combines them:
out = Σ_i acc_i·e^(m_i − M) / Σ_i l_i·e^(m_i − M), M = max_i m_i.

Prefill / chunked prefill. New tokens' K/V are first scattered into the cache
(`write_kv_cache`); then query token i of a sequence with `q_len` new tokens and `ctx`
tokens in all sits at position `ctx − q_len + i` and attends causally to cache positions
0..that position: cached blocks from earlier chunks or prefix-cache hits, and itself
(`PREFILL_TILE` cached tokens per step).

fp8 KV: the cache holds e4m3fn values x / scale (one scale per tensor, for K and for V), rounded
to nearest-even and saturated at ±448 as vLLM writes them; the kernels multiply by the scale
after loading. Dots run on the cache dtype (fp16/bf16; fp8 is
upcast to fp16) with fp32 accumulation.

Importing this module has no side effects; the wrappers assert shapes, dtypes and strides.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

FP8_DTYPE = torch.float8_e4m3fn
KV_DTYPES = (torch.float16, torch.bfloat16, FP8_DTYPE)
BLOCK_SIZES = (16, 32, 64, 128)
# Tokens of KV each loop iteration loads, at most one block. A whole 128-token block of head_dim
# 128 (32 KiB each for K and V) spilled registers to the stack on sm_90 (4-5 KiB of stack frame,
# `python -m kernels.compile_check`); these tiles compile without spills. The sizes are vLLM's
# Triton backend defaults (vllm/v1/attention/ops/triton_unified_attention.py: TILE_SIZE_DECODE
# 16 for 2-byte caches, TILE_SIZE_PREFILL 32); fp8 is upcast to fp16 before the dots here.
DECODE_TILE = 16
PREFILL_TILE = 32


def prefill_num_warps(tile: int, fp8: bool) -> int:
    """Warps per prefill program: 8 where 4 would spill or sit at the 255-register ceiling on sm_90.

    With 4 warps and head_dim 128: fp16 tile 32 took 160 registers, fp8 tile 32 took 254, fp8 tile
    16 spilled 8 bytes; with 8 warps they took 127, 148 and 168, no stack (compile_check's report).
    """
    return 8 if fp8 or tile >= 32 else 4


@triton.jit
def _to_dot_dtype(x, cache_ptr, IS_FP8: tl.constexpr, DOT_FP32: tl.constexpr):
    """The dtype dots run in: fp16 for fp8 caches, fp32 where the interpreter needs it, else the cache's."""
    if IS_FP8:
        x = x.to(tl.float16)
    elif DOT_FP32:
        x = x.to(tl.float32)
    else:
        x = x.to(cache_ptr.dtype.element_ty)
    return x


@triton.jit
def _load_tile(cache_ptr, block, rows, d, t_mask, stride_b, stride_t, head, stride_h,
               IS_FP8: tl.constexpr, DOT_FP32: tl.constexpr):
    """`rows` of one KV block of one head: [TILE, HEAD_DIM], rows past the context zeroed."""
    x = tl.load(cache_ptr + block * stride_b + rows[:, None] * stride_t + head * stride_h + d[None, :],
                mask=t_mask[:, None], other=0.0)
    return _to_dot_dtype(x, cache_ptr, IS_FP8, DOT_FP32)


@triton.jit
def _online_softmax_step(q, k, v, visible, m, l_sum, acc, qk_scale, v_scale):
    """Fold one KV block into the running max `m`, denominator `l_sum` and numerator `acc`."""
    s = tl.dot(q, tl.trans(k)) * qk_scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l_sum = l_sum * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v) * v_scale
    return m_new, l_sum, acc


@triton.jit
def _decode_kernel(
    out_ptr, part_out_ptr, part_m_ptr, part_l_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    scale, k_scale, v_scale, blocks_per_split,
    stride_qs, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bts,
    stride_os, stride_oh,
    stride_ps, stride_ph, stride_pp,
    QUERY_GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr, IS_FP8: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + seq)
    TILES_PER_BLOCK: tl.constexpr = BLOCK_SIZE // TILE
    first_tile = split * blocks_per_split * TILES_PER_BLOCK
    last_tile = tl.minimum(first_tile + blocks_per_split * TILES_PER_BLOCK, tl.cdiv(ctx, TILE))

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    t = tl.arange(0, TILE)
    heads = kv_head * QUERY_GROUP + g
    g_mask = g < QUERY_GROUP
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :], mask=g_mask[:, None], other=0.0)
    q = _to_dot_dtype(q, k_cache_ptr, IS_FP8, DOT_FP32)

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for i in range(first_tile, last_tile):
        block = tl.load(block_tables_ptr + seq * stride_bts + i // TILES_PER_BLOCK).to(tl.int64)
        rows = (i % TILES_PER_BLOCK) * TILE + t
        t_mask = i * TILE + t < ctx
        k = _load_tile(k_cache_ptr, block, rows, d, t_mask, stride_kb, stride_kt, kv_head, stride_kh, IS_FP8, DOT_FP32)
        v = _load_tile(v_cache_ptr, block, rows, d, t_mask, stride_vb, stride_vt, kv_head, stride_vh, IS_FP8, DOT_FP32)
        m, l_sum, acc = _online_softmax_step(q, k, v, t_mask[None, :], m, l_sum, acc, scale * k_scale, v_scale)

    if NUM_SPLITS == 1:
        out = acc / l_sum[:, None]
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:
        part = seq * stride_ps + heads * stride_ph + split * stride_pp
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=g_mask[:, None])
        tl.store(part_m_ptr + part, m, mask=g_mask)
        tl.store(part_l_ptr + part, l_sum, mask=g_mask)


@triton.jit
def _reduce_splits_kernel(
    out_ptr, part_out_ptr, part_m_ptr, part_l_ptr,
    stride_os, stride_oh, stride_ps, stride_ph, stride_pp,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    i = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM)
    i_mask = i < NUM_SPLITS
    part = seq * stride_ps + head * stride_ph + i * stride_pp
    m = tl.load(part_m_ptr + part, mask=i_mask, other=float("-inf"))
    l_sum = tl.load(part_l_ptr + part, mask=i_mask, other=0.0)
    acc = tl.load(part_out_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=i_mask[:, None], other=0.0)
    m_max = tl.max(m, 0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_max))  # empty splits weigh nothing
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l_sum * w, 0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + d, out.to(out_ptr.dtype.element_ty))


@triton.jit
def _prefill_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, query_start_ptr,
    scale, k_scale, v_scale,
    stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bts,
    stride_ot, stride_oh,
    QUERY_GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
    BLOCK_M: tl.constexpr, IS_FP8: tl.constexpr, DOT_FP32: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    m_block = tl.program_id(2)
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    if m_block * BLOCK_M >= q_len:
        return
    ctx = tl.load(context_lens_ptr + seq)
    past = ctx - q_len
    kv_head = head // QUERY_GROUP

    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    r_mask = rows < q_len
    pos = past + rows
    d = tl.arange(0, HEAD_DIM)
    t = tl.arange(0, TILE)
    TILES_PER_BLOCK: tl.constexpr = BLOCK_SIZE // TILE
    q = tl.load(q_ptr + (q_start + rows)[:, None] * stride_qt + head * stride_qh + d[None, :],
                mask=r_mask[:, None], other=0.0)
    q = _to_dot_dtype(q, k_cache_ptr, IS_FP8, DOT_FP32)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    last_key = tl.minimum(past + (m_block + 1) * BLOCK_M, ctx)  # keys this tile can see: [0, last_key)
    for i in range(0, tl.cdiv(last_key, TILE)):
        block = tl.load(block_tables_ptr + seq * stride_bts + i // TILES_PER_BLOCK).to(tl.int64)
        key_pos = i * TILE + t
        t_mask = key_pos < ctx
        block_rows = (i % TILES_PER_BLOCK) * TILE + t
        k = _load_tile(k_cache_ptr, block, block_rows, d, t_mask, stride_kb, stride_kt, kv_head, stride_kh, IS_FP8,
                       DOT_FP32)
        v = _load_tile(v_cache_ptr, block, block_rows, d, t_mask, stride_vb, stride_vt, kv_head, stride_vh, IS_FP8,
                       DOT_FP32)
        visible = (key_pos[None, :] <= pos[:, None]) & t_mask[None, :]
        m, l_sum, acc = _online_softmax_step(q, k, v, visible, m, l_sum, acc, scale * k_scale, v_scale)

    out = acc / l_sum[:, None]
    tl.store(out_ptr + (q_start + rows)[:, None] * stride_ot + head * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=r_mask[:, None])


@triton.jit
def _e4m3fn_bits(x):
    """fp32 → the bit pattern of the nearest e4m3fn value (ties to even), saturated at ±448; NaN → 0x7f.

    This is vLLM's cache write: `__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3)`
    (csrc/quantization/fp8/nvidia/quant_utils.cuh). torch's `.to(torch.float8_e4m3fn)` agrees up
    to 464, but beyond it torch 2.11 gives NaN (it rounds to 480, whose pattern is NaN) where
    torch 2.13 saturates (`fp8e4m3fn_from_fp32_value`, c10/util/Float8_e4m3fn.h): clamp first.
    The bits are computed in integers and stored through a uint8 view, with no float → fp8 cast:
    Triton's CPU interpreter rounds that cast wrongly (126 → 64 when the mantissa carries, seen with
    3.9), drops the sign of -0.0 (3.6) and turns NaN into a finite value.

    With e = max(exponent of |x|, -6) the spacing is 2^(e-3) (3 mantissa bits; below 2^-6 the
    subnormals keep 2^-9), |x| = n·2^(e-3) after rounding to an integer n, and the pattern is
    (e + 6)·8 + n: n in [8, 16] walks the mantissa (16 carries into the next exponent), and for
    subnormals (e = -6) n in [0, 8] is the pattern itself. Every step is exact.
    """
    ax = tl.minimum(tl.abs(x), 448.0)
    exponent = tl.maximum((ax.to(tl.int32, bitcast=True) >> 23) - 127, -6)
    inverse_ulp = (((127 + 3) - exponent) << 23).to(tl.float32, bitcast=True)  # 2^(3 - exponent)
    steps = ax * inverse_ulp  # exact: a power of two
    whole = tl.floor(steps)
    frac = steps - whole
    n = whole.to(tl.int32)
    n = tl.where((frac > 0.5) | ((frac == 0.5) & ((n & 1) == 1)), n + 1, n)
    bits = (exponent + 6) * 8 + n
    bits = tl.where(x != x, 0x7F, bits)
    return tl.where(x.to(tl.int32, bitcast=True) < 0, bits | 0x80, bits)  # the sign bit, -0.0 included


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, k_scale, v_scale,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_ct, stride_ch, stride_db, stride_dt, stride_dh,
    num_kv_heads,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEADS_PAD: tl.constexpr, IS_FP8: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return  # padding token: nothing to store
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_DIM)
    mask = (h < num_kv_heads)[:, None]
    k = tl.load(key_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask, other=0.0)
    v = tl.load(value_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask, other=0.0)
    if IS_FP8:
        # IEEE division like vLLM's CUDA `x / scale` (Triton's `/` on fp32 may be approximate on a GPU);
        # the caches arrive as uint8 views and take the bits
        k = _e4m3fn_bits(tl.math.div_rn(k.to(tl.float32), k_scale))
        v = _e4m3fn_bits(tl.math.div_rn(v.to(tl.float32), v_scale))
    tl.store(k_cache_ptr + block * stride_cb + offset * stride_ct + h[:, None] * stride_ch + d[None, :],
             k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + block * stride_db + offset * stride_dt + h[:, None] * stride_dh + d[None, :],
             v.to(v_cache_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- host wrappers


def _dot_in_fp32(k_cache: torch.Tensor) -> bool:
    """Triton's CPU interpreter computes bf16 `tl.dot` wrongly (seen with triton 3.9); upcast there only."""
    return k_cache.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int, int]:
    assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape, "caches are [blocks, block_size, kv_heads, dim]"
    assert k_cache.dtype == v_cache.dtype and k_cache.dtype in KV_DTYPES, f"unsupported KV dtype {k_cache.dtype}"
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "head_dim must be contiguous"
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    assert block_size in BLOCK_SIZES, f"block_size {block_size} not in {BLOCK_SIZES}"
    assert head_dim >= 16 and head_dim & (head_dim - 1) == 0, "head_dim must be a power of two >= 16"
    return num_blocks, block_size, num_kv_heads, head_dim


def _check_tables(block_tables: torch.Tensor, context_lens: torch.Tensor, num_seqs: int) -> None:
    assert block_tables.dtype == torch.int32 and block_tables.dim() == 2 and block_tables.shape[0] == num_seqs
    assert block_tables.stride(1) == 1, "block table rows must be contiguous"
    assert context_lens.dtype == torch.int32 and context_lens.shape == (num_seqs,)


def default_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, block_size: int,
                       num_sms: int = 132) -> int:
    """Split the context when the (seq, kv_head) grid alone would leave most SMs idle.

    Aim for about two waves of programs, each split keeping at least 8 blocks of work.
    """
    programs = num_seqs * num_kv_heads
    if programs >= num_sms:
        return 1
    max_blocks = triton.cdiv(max_context, block_size)
    return max(1, min(triton.cdiv(2 * num_sms, programs), max_blocks // 8, 64))


def paged_attention_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
    num_splits: int | None = None, max_context: int | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged KV. `q`: [seqs, heads, dim].

    `num_splits=None` picks flash-decoding splits from the shapes (`max_context` avoids a sync).
    """
    num_blocks, block_size, num_kv_heads, head_dim = _check_cache(k_cache, v_cache)
    assert q.dim() == 3 and q.shape[2] == head_dim and q.stride(2) == 1, "q is [seqs, heads, head_dim]"
    assert q.dtype in (torch.float16, torch.bfloat16, torch.float32)
    num_seqs, num_heads, _ = q.shape
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    _check_tables(block_tables, context_lens, num_seqs)
    group = num_heads // num_kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    if num_splits is None:
        longest = max_context if max_context is not None else int(context_lens.max())
        num_splits = default_num_splits(num_seqs, num_kv_heads, longest, block_size)
    blocks_per_split = triton.cdiv(block_tables.shape[1], num_splits)
    out = torch.empty(q.shape, dtype=q.dtype if q.dtype != torch.float32 else torch.float16, device=q.device)
    part_out = part_m = part_l = out  # unused with one split
    if num_splits > 1:
        part_m = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_out = torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
    stride_ps, stride_ph, stride_pp = (part_m.stride() if num_splits > 1 else (0, 0, 0))
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        out, part_out, part_m, part_l, q, k_cache, v_cache, block_tables, context_lens,
        scale, k_scale, v_scale, blocks_per_split,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        stride_ps, stride_ph, stride_pp,
        QUERY_GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, TILE=min(block_size, DECODE_TILE), NUM_SPLITS=num_splits,
        IS_FP8=k_cache.dtype == FP8_DTYPE,
        DOT_FP32=_dot_in_fp32(k_cache),
    )
    if num_splits > 1:
        _reduce_splits_kernel[(num_seqs, num_heads)](
            out, part_out, part_m, part_l, out.stride(0), out.stride(1), stride_ps, stride_ph, stride_pp,
            HEAD_DIM=head_dim, NUM_SPLITS=num_splits, SPLITS_PAD=triton.next_power_of_2(num_splits),
        )
    return out


def paged_attention_prefill(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, query_start_loc: torch.Tensor, max_query_len: int,
    scale: float | None = None, k_scale: float = 1.0, v_scale: float = 1.0, block_m: int = 16,
) -> torch.Tensor:
    """Causal attention of new tokens over paged KV (which already holds them: `write_kv_cache`).

    `q`: [total_new_tokens, heads, dim], sequences packed; `query_start_loc` [seqs + 1] int32
    gives each sequence's first row; `context_lens` counts cached + new tokens.
    """
    num_blocks, block_size, num_kv_heads, head_dim = _check_cache(k_cache, v_cache)
    assert q.dim() == 3 and q.shape[2] == head_dim and q.stride(2) == 1, "q is [tokens, heads, head_dim]"
    num_heads = q.shape[1]
    assert num_heads % num_kv_heads == 0
    num_seqs = context_lens.shape[0]
    _check_tables(block_tables, context_lens, num_seqs)
    assert query_start_loc.dtype == torch.int32 and query_start_loc.shape == (num_seqs + 1,)
    scale = head_dim**-0.5 if scale is None else scale
    out = torch.empty(q.shape, dtype=q.dtype if q.dtype != torch.float32 else torch.float16, device=q.device)
    grid = (num_seqs, num_heads, triton.cdiv(max_query_len, block_m))
    tile, fp8 = min(block_size, PREFILL_TILE), k_cache.dtype == FP8_DTYPE
    _prefill_kernel[grid](
        out, q, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale, k_scale, v_scale,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        QUERY_GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        TILE=tile, BLOCK_M=block_m, IS_FP8=fp8, DOT_FP32=_dot_in_fp32(k_cache),
        num_warps=prefill_num_warps(tile, fp8),
    )
    return out


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Scatter new tokens' K/V ([tokens, kv_heads, dim]) to cache slots (`slot = block · bs + offset`).

    A slot of -1 skips its token. For fp8 caches the values are divided by the scale, rounded to
    the nearest e4m3fn value (ties to even) and saturated at ±448, as vLLM does (`_e4m3fn_bits`).
    """
    num_blocks, block_size, num_kv_heads, head_dim = _check_cache(k_cache, v_cache)
    assert key.shape == value.shape and key.dim() == 3 and key.shape[1:] == (num_kv_heads, head_dim)
    assert key.stride(2) == 1 and value.stride(2) == 1
    assert slot_mapping.dtype == torch.int64 and slot_mapping.shape == (key.shape[0],)
    fp8 = k_cache.dtype == FP8_DTYPE
    if fp8:  # the kernel writes e4m3fn bit patterns
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    _write_kv_kernel[(key.shape[0],)](
        key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        num_kv_heads,
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size, HEADS_PAD=triton.next_power_of_2(num_kv_heads), IS_FP8=fp8,
    )
