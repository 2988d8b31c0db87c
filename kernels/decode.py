"""Paged decode attention: one query token per sequence, split-K (flash-decoding) over long contexts.

Grid (seq, kv_head, split). Program (s, h, i) loads the query rows of the `group = heads /
kv_heads` query heads that share KV head h (GQA; padded to GROUP_PAD >= 16 rows for tl.dot), so
every KV tile is read once per program, and walks its share of the sequence's tiles (TILE tokens
each, gathered across pages: kernels/layout.py) with an online softmax in fp32. The KV loads are
software-pipelined (`tl.range(..., num_stages)`: on sm_80+ the next tiles' K and V arrive by
asynchronous copies while this tile's dots run).

Each sequence is split by its own length, so a short sequence in a ragged batch has no empty
splits to launch work for while a long one waits on its last:

    num_tiles = cdiv(ctx_s, TILE)      used_s = min(num_splits, num_tiles)
    split i < used_s  takes tiles [i*num_tiles // used_s, (i+1)*num_tiles // used_s)   (never empty)
    split i >= used_s exits at once and writes nothing

    ctx 300, TILE 32, num_splits 3 -> 10 tiles: [0, 3) [3, 6) [6, 10)
    ctx 40,  TILE 32, num_splits 3 -> 2 tiles:  [0, 1) [1, 2), split 2 idle

With one split the program writes acc / l. With several each writes (acc, m, l) into

    part_out [seqs, heads, num_splits, head_dim] fp32     part_m, part_l [seqs, heads, num_splits] fp32

and `_reduce_splits_kernel` combines the sequence's used_s splits:
out = sum_i acc_i*e^(m_i - M) / sum_i l_i*e^(m_i - M), M = max_i m_i.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
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

DECODE_TILE = 32  # KV tokens per loop iteration (vLLM's Triton decode uses 16-64)
DECODE_NUM_STAGES = 3
# Registers per thread the split heuristic assumes a decode program holds, by warps per program;
# the sm_90 compile report (kernels/compile_check.py, tests/kernel_tests/test_compile_hopper.py)
# asserts every decode kernel stays within it. Triton 3.9, head_dim 128, 4 query heads per KV head:
# 166-168 registers with 4 warps (fp16, bf16); fp8, or head_dim 80/96 padded to 128, took 213-254
# with 4 warps and 166-178 with 8 (no stack in either).
DECODE_REGISTERS = {4: 168, 8: 255}


def decode_num_warps(head_dim: int, fp8: bool) -> int:
    """8 warps where 4 would sit near the 255-register ceiling (fp8 upcasts, padded head_dim); else 4."""
    return 8 if fp8 or head_dim != head_dim_pad(head_dim) else 4


def decode_meta(group: int, head_dim: int, block_size: int, fp8: bool, split: bool,
                dot_fp32: bool = False) -> dict[str, Any]:
    """The constexprs and launch options of `_decode_kernel` (the wrapper's and compile_check's)."""
    return {"QUERY_GROUP": group, "GROUP_PAD": max(16, triton.next_power_of_2(group)), "HEAD_DIM": head_dim,
            "HEAD_DIM_PAD": head_dim_pad(head_dim), "BLOCK_SIZE": block_size, "TILE": DECODE_TILE,
            "SPLIT": split, "IS_FP8": fp8, "DOT_FP32": dot_fp32, "NUM_STAGES": DECODE_NUM_STAGES,
            "num_warps": decode_num_warps(head_dim, fp8)}


@triton.jit
def _decode_kernel(
    out_ptr, part_out_ptr, part_m_ptr, part_l_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    scale, k_scale, v_scale, num_splits,
    stride_qs, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bts,
    stride_os, stride_oh,
    stride_ps, stride_ph, stride_pp,
    QUERY_GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, SPLIT: tl.constexpr, IS_FP8: tl.constexpr,
    DOT_FP32: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + seq)
    num_tiles = tl.cdiv(ctx, TILE)
    used = tl.minimum(num_splits, num_tiles)
    if split >= used:
        return
    first_tile = split * num_tiles // used
    last_tile = (split + 1) * num_tiles // used

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    t = tl.arange(0, TILE)
    heads = kv_head * QUERY_GROUP + g
    g_mask = g < QUERY_GROUP
    d_mask = d < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    q = to_dot_dtype(q, k_cache_ptr, IS_FP8, DOT_FP32)
    seq_row = seq.to(tl.int64) * stride_bts
    qk_scale = scale * k_scale

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    for tile in tl.range(first_tile, last_tile, num_stages=NUM_STAGES):
        tokens = tile * TILE + t
        t_mask = tokens < ctx  # only the sequence's last tile has tokens past it
        block, slot = token_rows(block_tables_ptr, seq_row, tl.minimum(tokens, ctx - 1), BLOCK_SIZE)
        k = load_tile(k_cache_ptr, block * stride_kb + slot * stride_kt + kv_head * stride_kh, d, HEAD_DIM,
                      HEAD_DIM_PAD, IS_FP8, DOT_FP32)
        v = load_tile(v_cache_ptr, block * stride_vb + slot * stride_vt + kv_head * stride_vh, d, HEAD_DIM,
                      HEAD_DIM_PAD, IS_FP8, DOT_FP32)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(t_mask[None, :], s, float("-inf"))  # every tile holds at least one token
        m, l_sum, acc = softmax_update(s, v, m, l_sum, acc, v_scale)

    out_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        part = seq * stride_ps + heads * stride_ph + split * stride_pp
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=out_mask)
        tl.store(part_m_ptr + part, m, mask=g_mask)
        tl.store(part_l_ptr + part, l_sum, mask=g_mask)
    else:
        out = acc / l_sum[:, None]
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _reduce_splits_kernel(
    out_ptr, part_out_ptr, part_m_ptr, part_l_ptr, context_lens_ptr, num_splits,
    stride_os, stride_oh, stride_ps, stride_ph, stride_pp,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, TILE: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    used = tl.minimum(num_splits, tl.cdiv(tl.load(context_lens_ptr + seq), TILE))  # as _decode_kernel
    i = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    i_mask = i < used
    d_mask = d < HEAD_DIM
    part = seq * stride_ps + head * stride_ph + i * stride_pp
    m = tl.load(part_m_ptr + part, mask=i_mask, other=float("-inf"))
    l_sum = tl.load(part_l_ptr + part, mask=i_mask, other=0.0)
    acc = tl.load(part_out_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=i_mask[:, None] & d_mask[None, :],
                  other=0.0)
    w = tl.where(i_mask, tl.exp(m - tl.max(m, 0)), 0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l_sum * w, 0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


@dataclass(frozen=True)
class SmLimits:
    """What one streaming multiprocessor holds at once (sm_90, H100/H200: CUDA's occupancy tables)."""

    num_sms: int = 132
    registers: int = 65536
    warps: int = 64
    programs: int = 32
    shared_bytes: int = 228 * 1024


def resident_programs_per_sm(num_warps: int, registers_per_thread: int, shared_bytes: int,
                             limits: SmLimits = SmLimits()) -> int:
    """Programs of one kernel an SM runs at once: the tightest of registers, warps, shared memory, slots.

    Registers are allocated per warp in units of 256 (8 per thread).
    """
    registers_per_warp = 32 * -(-registers_per_thread // 8) * 8
    by_registers = limits.registers // (registers_per_warp * num_warps)
    by_shared = limits.shared_bytes // shared_bytes if shared_bytes else limits.programs
    return max(1, min(by_registers, limits.warps // num_warps, by_shared, limits.programs))


def decode_shared_bytes(head_dim: int, kv_bytes: int) -> int:
    """Shared memory a pipelined decode program stages: K and V tiles for each stage in flight."""
    return 2 * DECODE_NUM_STAGES * DECODE_TILE * head_dim_pad(head_dim) * kv_bytes


def default_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, head_dim: int = 128, kv_bytes: int = 2,
                       limits: SmLimits = SmLimits(), min_tiles_per_split: int = 4, max_splits: int = 64) -> int:
    """Split contexts when the (seq, kv_head) programs alone would not fill every resident slot.

    The target is one full wave: num_sms * resident programs per SM (from the decode kernel's
    warps, register budget and shared memory). Splits keep at least `min_tiles_per_split` tiles
    of the longest context each and are at most `max_splits` (the reduce reads them all at once).
    """
    programs = num_seqs * num_kv_heads
    warps = decode_num_warps(head_dim, kv_bytes == 1)
    resident = resident_programs_per_sm(warps, DECODE_REGISTERS[warps], decode_shared_bytes(head_dim, kv_bytes),
                                        limits)
    target = limits.num_sms * resident
    if programs >= target:
        return 1
    tiles = triton.cdiv(max_context, DECODE_TILE)
    return max(1, min(triton.cdiv(target, programs), tiles // min_tiles_per_split, max_splits))


@functools.cache
def _sm_limits(device_index: int) -> SmLimits:
    props = torch.cuda.get_device_properties(device_index)
    return SmLimits(num_sms=props.multi_processor_count)


def paged_attention_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
    num_splits: int | None = None, max_context: int | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged KV. `q`: [seqs, heads, head_dim].

    `num_splits=None` picks the split count from the shapes and the device's SM count
    (`default_num_splits`; `max_context` spares a device sync to find the longest context).
    """
    _, block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
    assert q.dim() == 3 and q.shape[2] == head_dim and q.stride(2) == 1, "q is [seqs, heads, head_dim]"
    assert q.dtype in (torch.float16, torch.bfloat16, torch.float32)
    num_seqs, num_heads, _ = q.shape
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    check_tables(block_tables, context_lens, num_seqs)
    scale = head_dim**-0.5 if scale is None else scale
    if num_splits is None:
        longest = max_context if max_context is not None else int(context_lens.max())
        limits = _sm_limits(q.device.index or 0) if q.is_cuda else SmLimits()
        num_splits = default_num_splits(num_seqs, num_kv_heads, longest, head_dim, k_cache.element_size(), limits)
    assert 1 <= num_splits <= 64, f"num_splits {num_splits}: 1 to 64"
    meta = decode_meta(num_heads // num_kv_heads, head_dim, block_size, k_cache.dtype == FP8_DTYPE, num_splits > 1,
                       dot_in_fp32(k_cache))
    out = output_like(q)
    part_out = part_m = part_l = out  # unused with one split
    stride_ps = stride_ph = stride_pp = 0
    if num_splits > 1:
        part_m = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_out = torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
        stride_ps, stride_ph, stride_pp = part_m.stride()
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        out, part_out, part_m, part_l, q, k_cache, v_cache, block_tables, context_lens,
        scale, k_scale, v_scale, num_splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        stride_ps, stride_ph, stride_pp,
        **meta,
    )
    if num_splits > 1:
        _reduce_splits_kernel[(num_seqs, num_heads)](
            out, part_out, part_m, part_l, context_lens, num_splits,
            out.stride(0), out.stride(1), stride_ps, stride_ph, stride_pp,
            HEAD_DIM=head_dim, HEAD_DIM_PAD=meta["HEAD_DIM_PAD"], TILE=meta["TILE"],
            SPLITS_PAD=triton.next_power_of_2(num_splits),
        )
    return out
