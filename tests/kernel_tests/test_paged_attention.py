"""Kernels against the float64 reference, on fresh random inputs every run.

The seed is printed in pytest's header and on a failure (`KVSIM_TEST_SEED` replays it; see
conftest.py). Outputs are poisoned with NaN first, so an element the kernel forgets to write
fails the test.

torch and the kernels (which import triton) are imported in the tests, not when pytest collects this module:
both xdist workers collect every test, and the import costs ~1.6 CPU s, which the worker that runs no kernel test
now never pays (tests/conftest.py gives the kernel tests to one worker). The cases name their dtypes for the same
reason (`dtype_of`).
"""

import pytest


def dtype_of(name):
    """The torch dtype a case names: "float16", "bfloat16" or "fp8" (the kernels' FP8_DTYPE, e4m3fn)."""
    import torch

    from kernels.paged_attention import FP8_DTYPE

    return FP8_DTYPE if name == "fp8" else getattr(torch, name)


def device():
    """Where the kernels run: the GPU if there is one, else the CPU under Triton's interpreter (conftest.py)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def random_world(num_seqs, context_lens, block_size, num_kv_heads, head_dim, dtype, extra_blocks=5):
    """A shuffled pool: each sequence's blocks are random physical blocks, in random order."""
    import torch

    from kernels.paged_attention import FP8_DTYPE

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
    return k.to(device()), v.to(device()), tables.to(device()), lens.to(device()), scale_k, scale_v


def assert_close(out, ref, dtype):
    import torch

    from kernels.paged_attention import FP8_DTYPE

    assert not torch.isnan(out).any(), "an output element was never written"
    err = (out.double().cpu() - ref).abs().max() / ref.abs().max()
    tolerance = {torch.float16: 1e-2, torch.bfloat16: 3e-2, FP8_DTYPE: 2e-2}[dtype]
    assert err < tolerance, f"relative error {err:.2e}"


def poison(fn):
    """Run with torch.empty returning NaN-filled tensors so unwritten elements show."""
    import torch

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
    # dtype, block_size, heads, kv_heads, head_dim, context lengths: ragged batches with 1, exact multiples
    # of the block and of the 32-token tile, and tails; block 16 makes every full tile span two pages
    ("float16", 16, 4, 4, 64, [1, 16, 37, 64, 200]),
    ("bfloat16", 32, 8, 2, 64, [5, 32, 95]),
    ("fp8", 16, 8, 1, 64, [17, 48, 3]),  # 8 query heads per KV head
    ("float16", 64, 6, 2, 80, [64, 130]),  # head_dim 80 padded to 128; 3 heads per KV head
    ("bfloat16", 128, 4, 2, 96, [128, 1, 200]),  # head_dim 96; a tile is a quarter page
    ("fp8", 32, 4, 2, 80, [33, 90]),
    # Llama-3's head shape (head_dim 128, 4 query heads per KV head) at the largest block size
    ("float16", 128, 8, 2, 128, [128, 1, 300]),
    ("fp8", 64, 4, 1, 128, [65, 20]),
]


def query(num_rows, heads, head_dim, dtype):
    import torch

    from kernels.paged_attention import FP8_DTYPE

    return torch.randn(num_rows, heads, head_dim, dtype=torch.float16 if dtype == FP8_DTYPE else dtype,
                       device=device())


def check_decode(dtype_name, block_size, heads, kv_heads, head_dim, lens, num_splits):
    from kernels.paged_attention import paged_attention_decode
    from kernels.reference import reference_decode

    dtype = dtype_of(dtype_name)
    k, v, tables, ctx, ks, vs = random_world(len(lens), lens, block_size, kv_heads, head_dim, dtype)
    q = query(len(lens), heads, head_dim, dtype)
    out = poison(lambda: paged_attention_decode(q, k, v, tables, ctx, k_scale=ks, v_scale=vs,
                                                num_splits=num_splits))
    ref = reference_decode(q.cpu(), k.cpu(), v.cpu(), tables.cpu(), ctx.cpu(), k_scale=ks, v_scale=vs)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize(("dtype", "block_size", "heads", "kv_heads", "head_dim", "lens"), CASES)
@pytest.mark.parametrize("num_splits", [1, 3, None], ids=["splits1", "splits3", "auto"])
def test_decode_matches_reference(dtype, block_size, heads, kv_heads, head_dim, lens, num_splits):
    check_decode(dtype, block_size, heads, kv_heads, head_dim, lens, num_splits)


def test_decode_splits_each_sequence_by_its_own_length():
    """7 splits over a ragged batch: sequences of 1 and 2 tiles leave splits idle (nothing written for
    them, none read back), the 16-tile one takes 2-3 tiles a split."""
    check_decode("float16", 16, 4, 2, 64, [1, 31, 33, 500], 7)


def test_automatic_split_count():
    """Worked by hand. fp16 head_dim 128: 4 warps of 168 registers (21,504 a program: 3 fit in 65,536),
    48 KiB of staged K/V (4 fit), 16 by warps: 3 resident, a wave of 396 programs on 132 SMs.
    fp8: 8 warps of 255 (rounded to 256) registers fill the register file: 1 resident, 132."""
    from kernels.decode import resident_programs_per_sm
    from kernels.paged_attention import SmLimits, default_num_splits

    assert resident_programs_per_sm(4, 168, 48 * 1024) == 3
    assert resident_programs_per_sm(8, 255, 24 * 1024) == 1
    assert resident_programs_per_sm(4, 64, 0) == 8  # 8,192 registers a program
    assert default_num_splits(num_seqs=1, num_kv_heads=2, max_context=640) == 5  # 20 tiles, >= 4 each
    assert default_num_splits(1, 8, 100_000) == 50  # ceil(396 / 8)
    assert default_num_splits(1, 1, 100_000) == 64  # 396 wanted, capped at 64
    assert default_num_splits(4, 8, 100_000) == 13  # 32 programs: ceil(396 / 32)
    assert default_num_splits(50, 8, 100_000) == 1  # 400 programs already fill the wave
    assert default_num_splits(16, 8, 100_000, kv_bytes=1) == 2  # fp8: ceil(132 / 128)
    assert default_num_splits(1, 1, 100_000, limits=SmLimits(num_sms=10)) == 30


@pytest.mark.parametrize(("dtype", "block_size", "lens"), [("float16", 16, [640]), ("fp8", 16, [300, 640]),
                                                          ("bfloat16", 32, [1100, 7])])
def test_decode_with_the_automatic_split_count(dtype, block_size, lens):
    import torch

    from kernels.paged_attention import default_num_splits

    element_size = torch.empty((), dtype=dtype_of(dtype)).element_size()
    assert default_num_splits(len(lens), 2, max(lens), 64, element_size) > 1
    check_decode(dtype, block_size, 8, 2, 64, lens, None)


@pytest.mark.parametrize(("dtype", "block_size", "heads", "kv_heads", "head_dim", "lens"), CASES)
def test_chunked_prefill_over_cached_prefix(dtype, block_size, heads, kv_heads, head_dim, lens):
    """New tokens (some sequences all-new, some after a cached prefix) attend causally. Query blocks of
    64 // group tokens (64, 21, 16, 8) start at every offset against the 32-token tiles, so programs
    see no, some and many unmasked tiles before the masked ones."""
    import torch

    from kernels.paged_attention import paged_attention_prefill
    from kernels.reference import reference_prefill

    dtype = dtype_of(dtype)
    k, v, tables, ctx, ks, vs = random_world(len(lens), lens, block_size, kv_heads, head_dim, dtype)
    q_lens = [max(1, n // 2) if i % 2 else n for i, n in enumerate(lens)]
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device())
    q = query(sum(q_lens), heads, head_dim, dtype)
    out = poison(lambda: paged_attention_prefill(q, k, v, tables, ctx, starts, max(q_lens), k_scale=ks,
                                                 v_scale=vs))
    ref = reference_prefill(q.cpu(), k.cpu(), v.cpu(), tables.cpu(), ctx.cpu(), starts.cpu(), k_scale=ks,
                            v_scale=vs)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "fp8"])
def test_cache_write_scatters_to_slots(dtype):
    import torch

    from kernels.paged_attention import FP8_DTYPE, write_kv_cache

    dtype = dtype_of(dtype)
    block_size, kv_heads, head_dim, tokens = 16, 3, 80, 7  # head_dim 80: the padded columns stay unwritten
    k_cache = torch.zeros(6, block_size, kv_heads, head_dim, dtype=dtype, device=device())
    v_cache = torch.zeros_like(k_cache)
    src_dtype = torch.float16 if dtype == FP8_DTYPE else dtype
    key = torch.randn(tokens, kv_heads, head_dim, dtype=src_dtype, device=device())
    value = torch.randn(tokens, kv_heads, head_dim, dtype=src_dtype, device=device())
    slots = torch.tensor([5 * 16 + 3, 0, -1, 17, 2 * 16 + 15, 40, 41], dtype=torch.int64, device=device())
    scale = 0.02 if dtype == FP8_DTYPE else 1.0
    write_kv_cache(key, value, k_cache, v_cache, slots, k_scale=scale, v_scale=scale)
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        for cache, src in ((k_cache, key), (v_cache, value)):
            got = bits(cache[slot // block_size, slot % block_size])
            want = naive_e4m3fn_bits(src[i].float() / scale) if dtype == FP8_DTYPE else bits(src[i])
            assert torch.equal(got, want)
    assert k_cache.double().abs().sum() > 0
    written = {s for s in slots.tolist() if s >= 0}
    untouched = [s for s in range(6 * block_size) if s not in written]
    assert k_cache.reshape(-1, kv_heads, head_dim)[untouched].double().abs().sum() == 0


def bits(x):
    """The stored bit patterns, for bit-exact comparisons."""
    import torch

    return x.cpu().view({1: torch.uint8, 2: torch.int16}[x.element_size()])


def e4m3fn_value(code: int) -> float:
    """Decode one positive e4m3fn bit pattern (OCP FP8 spec: bias 7, no infinities, 0x7f is NaN)."""
    exponent, mantissa = code >> 3, code & 7
    return mantissa / 8 * 2.0**-6 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def naive_e4m3fn_bits(x):
    """vLLM's fp8 cache write, by brute force: the nearest of the 127 finite magnitudes, ties to the even
    code, |x| above 448 saturated (`__NV_SATFINITE`), sign copied; a second implementation, not the kernel's."""
    import torch

    grid = torch.tensor([e4m3fn_value(c) for c in range(127)], dtype=torch.float64)
    mag = x.double().cpu().abs().clamp(max=448.0).flatten()
    below = torch.searchsorted(grid, mag, right=True) - 1  # largest grid value <= mag
    above = (below + 1).clamp(max=126)
    d_below, d_above = mag - grid[below], grid[above] - mag
    pick_above = (d_above < d_below) | ((d_above == d_below) & (below % 2 == 1))
    code = torch.where(pick_above, above, below).to(torch.int32)
    code |= torch.signbit(x.cpu().flatten()).to(torch.int32) << 7
    return code.to(torch.uint8).view(torch.uint8).reshape(x.shape)


def write_fp8(values, scale: float):
    """Write `values` (any count) as the keys of one fp8 block and return the stored bytes."""
    import torch

    from kernels.paged_attention import FP8_DTYPE, write_kv_cache

    head_dim, per_token = 16, 32
    n = -(-values.numel() // per_token)
    key = torch.zeros(n * per_token, dtype=values.dtype)
    key[: values.numel()] = values.flatten()
    key = key.reshape(n, 2, head_dim).to(device())
    k_cache = torch.zeros(1, 128, 2, head_dim, dtype=FP8_DTYPE, device=device())
    v_cache = torch.zeros_like(k_cache)
    write_kv_cache(key, key.clone(), k_cache, v_cache, torch.arange(n, dtype=torch.int64, device=device()),
                   k_scale=scale, v_scale=scale)
    return bits(k_cache[0, :n]).flatten()[: values.numel()]


def test_fp8_write_rounds_ties_to_even_and_saturates_bit_exactly():
    """Every midpoint between neighbouring e4m3fn values (the ties), every value itself, both signs,
    zeros, and values beyond the largest finite 448 up to infinity, with scale 1 (no division rounding)."""
    import torch

    grid = [e4m3fn_value(c) for c in range(127)]
    mids = [(a + b) / 2 for a, b in zip(grid, grid[1:], strict=False)]
    over = [448.5, 463.75, 464.0, 464.25, 479.0, 480.0, 500.0, 1e4, 65504.0, float("inf")]
    magnitudes = torch.tensor(grid + mids + over, dtype=torch.float16)
    assert magnitudes.double().tolist() == grid + mids + over  # every value exact in fp16
    values = torch.cat([magnitudes, -magnitudes])
    want = naive_e4m3fn_bits(values.float())
    assert want[:127].tolist() == list(range(127))  # the grid maps to itself
    assert want[127 + 125].item() == 126 and want[127 + 124].item() == 124  # 432 -> 448 (even), 400 -> 384 (even)
    assert (want[127 + 126 : 127 + 136] == 126).all()  # 448.5 ... inf saturate to 448
    assert torch.equal(write_fp8(values, 1.0), want)


def test_fp8_write_matches_vllm_on_random_values_bit_exactly():
    """Random magnitudes over the whole e4m3fn range and beyond, divided by a scale in fp32 first."""
    import torch

    from kernels.paged_attention import FP8_DTYPE

    x = torch.randn(4096, dtype=torch.float32) * 2.0 ** torch.randint(-14, 6, (4096,)).float()
    x = x.to(torch.float16)
    scale = 0.02
    quotient = x.float() / torch.tensor(scale, dtype=torch.float32)  # IEEE fp32, as in CUDA's `x / scale`
    want = naive_e4m3fn_bits(quotient)
    assert (quotient.abs() > 448).sum() > 100 and (quotient.abs() < 2**-6).sum() > 100  # saturation, subnormals
    # torch's own cast agrees once clamped (unclamped, torch 2.11 turns |x| > 464 into NaN)
    assert torch.equal(quotient.clamp(-448, 448).to(FP8_DTYPE).view(torch.uint8), want)
    assert torch.equal(write_fp8(x, scale), want)


def test_fp8_write_keeps_nan():
    import torch

    stored = write_fp8(torch.tensor([float("nan"), 1.0], dtype=torch.float16), 1.0)
    assert stored[0].item() & 0x7F == 0x7F and stored[1].item() == 0x38  # NaN (S.1111.111); 1.0 = 0.0111.000


def test_write_then_prefill_end_to_end():
    """Cache-write the new tokens, then prefill over them: equals dense causal attention."""
    import torch

    from kernels.paged_attention import paged_attention_prefill, write_kv_cache
    from kernels.reference import reference_prefill

    block_size, heads, kv_heads, head_dim, n = 16, 4, 2, 96, 40
    k_cache = torch.zeros(8, block_size, kv_heads, head_dim, dtype=torch.float16, device=device())
    v_cache = torch.zeros_like(k_cache)
    table = torch.tensor([[6, 1, 4]], dtype=torch.int32, device=device())
    slots = torch.tensor([int(table[0, i // 16]) * 16 + i % 16 for i in range(n)], dtype=torch.int64, device=device())
    key = torch.randn(n, kv_heads, head_dim, dtype=torch.float16, device=device())
    value = torch.randn(n, kv_heads, head_dim, dtype=torch.float16, device=device())
    write_kv_cache(key, value, k_cache, v_cache, slots)
    q = torch.randn(n, heads, head_dim, dtype=torch.float16, device=device())
    lens = torch.tensor([n], dtype=torch.int32, device=device())
    starts = torch.tensor([0, n], dtype=torch.int32, device=device())
    out = paged_attention_prefill(q, k_cache, v_cache, table, lens, starts, n)
    ref = reference_prefill(q.cpu(), k_cache.cpu(), v_cache.cpu(), table.cpu(), lens.cpu(), starts.cpu())
    assert_close(out, ref, torch.float16)


def test_wrappers_reject_bad_shapes():
    import torch

    from kernels.paged_attention import paged_attention_decode

    k, v, tables, ctx, _, _ = random_world(2, [5, 9], 16, 2, 32, torch.float16)
    q = torch.randn(2, 3, 32, dtype=torch.float16, device=device())  # 3 heads over 2 KV heads
    with pytest.raises(AssertionError, match="multiple"):
        paged_attention_decode(q, k, v, tables, ctx)
    with pytest.raises(AssertionError, match="block_size"):
        bad = torch.zeros(4, 8, 2, 32, dtype=torch.float16, device=device())
        paged_attention_decode(torch.randn(2, 2, 32, dtype=torch.float16), bad, bad, tables, ctx)
    with pytest.raises(AssertionError, match="head_dim 20"):
        bad = torch.zeros(4, 16, 2, 20, dtype=torch.float16, device=device())
        paged_attention_decode(torch.randn(2, 2, 20, dtype=torch.float16), bad, bad, tables, ctx)
