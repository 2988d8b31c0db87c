"""The cache write: scatter new tokens' K and V into their paged-cache slots (vLLM's reshape_and_cache).

    key, value   [tokens, kv_heads, head_dim]         slot_mapping [tokens] int64
    slot = physical block * block_size + offset   ->  k_cache[slot // block_size, slot % block_size, :, :]

One program per token writes all its KV heads; a slot of -1 (a padding token) writes nothing.
fp8 caches take e4m3fn bit patterns of x / scale, computed in integers (`_e4m3fn_bits`).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kernels.layout import FP8_DTYPE, check_cache


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
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEADS_PAD: tl.constexpr,
    IS_FP8: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return  # padding token: nothing to store
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    mask = (h < num_kv_heads)[:, None] & (d < HEAD_DIM)[None, :]
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


def write_meta(num_kv_heads: int, head_dim: int, block_size: int, fp8: bool) -> dict[str, Any]:
    """The constexprs of `_write_kv_kernel` (the wrapper's and compile_check's)."""
    return {"HEAD_DIM": head_dim, "HEAD_DIM_PAD": triton.next_power_of_2(head_dim), "BLOCK_SIZE": block_size,
            "HEADS_PAD": triton.next_power_of_2(num_kv_heads), "IS_FP8": fp8}


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Scatter new tokens' K/V ([tokens, kv_heads, dim]) to cache slots (`slot = block · bs + offset`).

    A slot of -1 skips its token. For fp8 caches the values are divided by the scale, rounded to
    the nearest e4m3fn value (ties to even) and saturated at ±448, as vLLM does (`_e4m3fn_bits`).
    """
    _, block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
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
        **write_meta(num_kv_heads, head_dim, block_size, fp8),
    )
