"""Kernels against the float64 reference, on fresh random inputs every run (no fixed seed).

Outputs are poisoned with NaN first, so an element the kernel forgets to write fails the test.
"""

import pytest
import torch

from kernels.paged_attention import FP8_DTYPE, paged_attention_decode, paged_attention_prefill, write_kv_cache
from kernels.reference import reference_decode, reference_prefill

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 3e-2, FP8_DTYPE: 2e-2}


def random_world(num_seqs, context_lens, block_size, num_kv_heads, head_dim, dtype, extra_blocks=5):
    """A shuffled pool: each sequence's blocks are random physical blocks, in random order."""
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + extra_blocks
    perm = torch.randperm(num_blocks)
    max_blocks = max(blocks_per_seq)
    tables = torch.full((num_seqs, max_blocks), -1, dtype=torch.int32)
    used = 0
    for s, n in enumerate(blocks_per_seq):
        tables[s, :n] = perm[used : used + n].to(torch.int32)
        used += n
    tables[tables < 0] = perm[-1].to(torch.int32)  # padding entries point anywhere valid
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    scale_k = scale_v = 1.0
    if dtype == FP8_DTYPE:
        scale_k, scale_v = 0.05, 0.04
        k = (torch.randn(shape) / scale_k).clamp(-400, 400).to(FP8_DTYPE)
        v = (torch.randn(shape) / scale_v).clamp(-400, 400).to(FP8_DTYPE)
    else:
        k, v = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return k.to(DEVICE), v.to(DEVICE), tables.to(DEVICE), lens.to(DEVICE), scale_k, scale_v


def assert_close(out, ref, dtype):
    assert not torch.isnan(out).any(), "an output element was never written"
    err = (out.double().cpu() - ref).abs().max() / ref.abs().max()
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"


def poison(fn):
    """Run with torch.empty returning NaN-filled tensors so unwritten elements show."""
    original = torch.empty

    def nan_empty(*args, **kwargs):
        t = original(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.empty = nan_empty
    try:
        return fn()
    finally:
        torch.empty = original


CASES = [
    # dtype, block_size, heads, kv_heads, head_dim, context lengths (1, exact multiples, ragged)
    (torch.float16, 16, 4, 4, 32, [1, 16, 37, 64]),
    (torch.bfloat16, 32, 8, 2, 64, [5, 32, 95]),
    (FP8_DTYPE, 16, 8, 1, 32, [17, 48, 3]),
    (torch.float16, 64, 4, 1, 32, [64, 130]),
    (torch.bfloat16, 128, 2, 2, 16, [128, 1, 200]),
]


@pytest.mark.parametrize(("dtype", "block_size", "heads", "kv_heads", "head_dim", "lens"), CASES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_matches_reference(dtype, block_size, heads, kv_heads, head_dim, lens, num_splits):
    k, v, tables, ctx, ks, vs = random_world(len(lens), lens, block_size, kv_heads, head_dim, dtype)
    q = torch.randn(len(lens), heads, head_dim, dtype=torch.float16 if dtype == FP8_DTYPE else dtype, device=DEVICE)
    out = poison(lambda: paged_attention_decode(q, k, v, tables, ctx, k_scale=ks, v_scale=vs,
                                                num_splits=num_splits))
    ref = reference_decode(q.cpu(), k.cpu(), v.cpu(), tables.cpu(), ctx.cpu(), k_scale=ks, v_scale=vs)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize(("dtype", "block_size", "heads", "kv_heads", "head_dim", "lens"), CASES[:3])
def test_chunked_prefill_over_cached_prefix(dtype, block_size, heads, kv_heads, head_dim, lens):
    """New tokens (some sequences all-new, some after a cached prefix) attend causally."""
    k, v, tables, ctx, ks, vs = random_world(len(lens), lens, block_size, kv_heads, head_dim, dtype)
    q_lens = [max(1, n // 2) if i % 2 else n for i, n in enumerate(lens)]
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(q_lens), heads, head_dim, dtype=torch.float16 if dtype == FP8_DTYPE else dtype,
                    device=DEVICE)
    out = poison(lambda: paged_attention_prefill(q, k, v, tables, ctx, starts, max(q_lens), k_scale=ks,
                                                 v_scale=vs))
    ref = reference_prefill(q.cpu(), k.cpu(), v.cpu(), tables.cpu(), ctx.cpu(), starts.cpu(), k_scale=ks,
                            v_scale=vs)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, FP8_DTYPE])
def test_cache_write_scatters_to_slots(dtype):
    block_size, kv_heads, head_dim, tokens = 16, 3, 32, 7
    cache_dtype = dtype
    k_cache = torch.zeros(6, block_size, kv_heads, head_dim, dtype=cache_dtype, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    src_dtype = torch.float16 if dtype == FP8_DTYPE else dtype
    key = torch.randn(tokens, kv_heads, head_dim, dtype=src_dtype, device=DEVICE)
    value = torch.randn(tokens, kv_heads, head_dim, dtype=src_dtype, device=DEVICE)
    slots = torch.tensor([5 * 16 + 3, 0, -1, 17, 2 * 16 + 15, 40, 41], dtype=torch.int64, device=DEVICE)
    scale = 0.02 if dtype == FP8_DTYPE else 1.0
    write_kv_cache(key, value, k_cache, v_cache, slots, k_scale=scale, v_scale=scale)
    def stored(x):  # what the cache should hold: torch's own rounding to the cache dtype
        return (x.double() / scale).to(cache_dtype).double().cpu()

    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        for cache, src in ((k_cache, key), (v_cache, value)):
            got = cache[slot // block_size, slot % block_size].double().cpu()
            # equal up to one unit in the last place (e4m3 has 3 mantissa bits: 1/8 relative)
            assert torch.allclose(got, stored(src[i]), rtol=0.126 if dtype == FP8_DTYPE else 0, atol=4e-3)
    assert k_cache.double().abs().sum() > 0
    written = {s for s in slots.tolist() if s >= 0}
    untouched = [s for s in range(6 * block_size) if s not in written]
    assert k_cache.reshape(-1, kv_heads, head_dim)[untouched].double().abs().sum() == 0


def test_write_then_prefill_end_to_end():
    """Cache-write the new tokens, then prefill over them: equals dense causal attention."""
    block_size, heads, kv_heads, head_dim, n = 16, 4, 2, 32, 40
    k_cache = torch.zeros(8, block_size, kv_heads, head_dim, dtype=torch.float16, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    table = torch.tensor([[6, 1, 4]], dtype=torch.int32, device=DEVICE)
    slots = torch.tensor([int(table[0, i // 16]) * 16 + i % 16 for i in range(n)], dtype=torch.int64, device=DEVICE)
    key = torch.randn(n, kv_heads, head_dim, dtype=torch.float16, device=DEVICE)
    value = torch.randn(n, kv_heads, head_dim, dtype=torch.float16, device=DEVICE)
    write_kv_cache(key, value, k_cache, v_cache, slots)
    q = torch.randn(n, heads, head_dim, dtype=torch.float16, device=DEVICE)
    lens = torch.tensor([n], dtype=torch.int32, device=DEVICE)
    starts = torch.tensor([0, n], dtype=torch.int32, device=DEVICE)
    out = paged_attention_prefill(q, k_cache, v_cache, table, lens, starts, n)
    ref = reference_prefill(q.cpu(), k_cache.cpu(), v_cache.cpu(), table.cpu(), lens.cpu(), starts.cpu())
    assert_close(out, ref, torch.float16)


def test_wrappers_reject_bad_shapes():
    k, v, tables, ctx, _, _ = random_world(2, [5, 9], 16, 2, 32, torch.float16)
    q = torch.randn(2, 3, 32, dtype=torch.float16, device=DEVICE)  # 3 heads over 2 KV heads
    with pytest.raises(AssertionError, match="multiple"):
        paged_attention_decode(q, k, v, tables, ctx)
    with pytest.raises(AssertionError, match="block_size"):
        bad = torch.zeros(4, 8, 2, 32, dtype=torch.float16, device=DEVICE)
        paged_attention_decode(torch.randn(2, 2, 32, dtype=torch.float16), bad, bad, tables, ctx)
