"""The memory floor of a run, derived by hand from the per-item costs in `kvsim.results.budget`."""

import pytest

from kvsim.model.config import load_gpu, load_model
from kvsim.model.errors import KvsimError
from kvsim.results.budget import REQUEST_BYTES, STEP_BYTES, check_run_memory, estimate_run_bytes
from kvsim.workload.scenario import load_scenario


def test_floor_counts_requests_blocks_and_steps():
    s = load_scenario(None, ["workload.num_requests=1000", "workload.output_len={dist: fixed, value: 16}",
                             "engine.max_num_seqs=8", "engine.swap_space=0", "engine.num_gpu_blocks_override=100"])
    model, gpu = load_model(s.model), load_gpu(s.gpu)
    parts = estimate_run_bytes(s, model, gpu, s.engine, 100, 2**21)
    # 1,000 requests; 100 GPU blocks, no swap: 4 list slots of 8 B each, their ids CPython's shared small ints;
    # at least 1,000 x 16 tokens / 8 per step = 2,000 steps
    assert parts == {"requests": 1000 * REQUEST_BYTES, "kv_blocks": 100 * 32, "steps": 2000 * STEP_BYTES}
    check_run_memory(s, model, gpu, s.engine, 100, 2**21, limit_bytes=sum(parts.values()))  # exactly fits
    with pytest.raises(KvsimError, match="workload.num_requests=1000: this run needs at least"):
        check_run_memory(s, model, gpu, s.engine, 100, 2**21, limit_bytes=sum(parts.values()) - 1)


@pytest.mark.parametrize(("overrides", "cpu_bytes"), [
    # v0 swaps: 4 GiB of 2 MiB blocks, 2,048 at 3 list slots of 8 B, an int of 28 B for each id past 256
    (["engine.scheduler=v0"], 2048 * 24 + (2048 - 257) * 28),
    (["engine.scheduler=v0", "engine.preemption_mode=swap"], 2048 * 24 + (2048 - 257) * 28),
    (["engine.scheduler=v0", "engine.preemption_mode=recompute"], 0),  # never swaps: no CPU pool is built
    (["engine.scheduler=v1"], 0),  # vLLM v1 has no swap preemption (it takes --swap-space and ignores it)
    (["engine.scheduler=static"], 0),
])
def test_swap_space_counts_cpu_blocks_where_preemption_swaps(overrides, cpu_bytes):
    s = load_scenario(None, [*overrides, "engine.swap_space=4"])
    model, gpu = load_model(s.model), load_gpu(s.gpu)
    parts = estimate_run_bytes(s, model, gpu, s.engine, 10, 2**21)
    assert parts["kv_blocks"] == 10 * 32 + cpu_bytes  # 10 GPU blocks: 4 slots each, small-int ids


def test_steps_streamed_to_disk_cost_no_memory_per_step():
    """`kvsim run` streams steps to disk (and `sampled`/`none` keep at most a sample): no per-step floor."""
    s = load_scenario(None, ["workload.num_requests=1000", "workload.output_len={dist: fixed, value: 16}",
                             "engine.max_num_seqs=8", "engine.swap_space=0"])
    model, gpu = load_model(s.model), load_gpu(s.gpu)
    kept = estimate_run_bytes(s, model, gpu, s.engine, 100, 2**21)
    streamed = estimate_run_bytes(s, model, gpu, s.engine, 100, 2**21, steps_in_memory=False)
    assert kept["steps"] == 2000 * STEP_BYTES and streamed == {**kept, "steps": 0}


def test_a_slab_pool_costs_nothing_per_block():
    """A slab allocator keeps extents per sequence, not per block: its pool adds nothing to the floor."""
    s = load_scenario(None, ["engine.allocator=slab-max", "engine.scheduler=v0", "engine.swap_space=4"])
    model, gpu = load_model(s.model), load_gpu(s.gpu)
    assert estimate_run_bytes(s, model, gpu, s.engine, 10_000, 2**21)["kv_blocks"] == 0


@pytest.mark.parametrize("overrides", [
    [],  # v1: 27,816 GPU blocks, no CPU pool
    ["engine.num_gpu_blocks_override=600"],  # 600 x 32 + 343 x 28 = 28,804 B, 48 B a block (measured 53.4)
    ["engine.scheduler=v0"],  # v0: the GPU blocks and 4 GiB / 2 MiB = 2,048 CPU blocks
    ["engine.scheduler=v0", "engine.swap_space=16", "engine.num_gpu_blocks_override=600"],  # mostly CPU: 8,192
    ["engine.allocator=slab-max", "engine.scheduler=v0"],
])
def test_the_blocks_part_is_a_floor_of_what_the_allocator_holds(overrides):
    """tracemalloc around building the allocator the run builds: its bytes are at least the estimate's blocks."""
    import tracemalloc

    from kvsim.engine.builder import make_allocator, resolve_engine

    s = load_scenario(None, overrides)
    spec = resolve_engine(s)
    tracemalloc.start()
    try:
        allocator = make_allocator(spec)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert allocator is not None
    estimate = estimate_run_bytes(s, spec.model, spec.gpu, s.engine, spec.num_gpu_blocks, spec.bytes_per_block)
    assert estimate["kv_blocks"] <= held, (estimate["kv_blocks"], held)


def test_a_swapping_run_holds_at_least_its_floor(tmp_path):
    """A whole v0 run with a CPU swap pool (16 GiB of 2 MiB blocks: 8,192 beside the GPU's), measured: its
    traced peak is at least the estimate (it was not when every block, CPU ones included, counted 160 B)."""
    import tracemalloc

    from kvsim.engine.simulate import simulate

    s = load_scenario(None, ["engine.scheduler=v0", "engine.swap_space=16", "workload.num_requests=20"])
    simulate(load_scenario(None, ["workload.num_requests=2"]), out_dir=tmp_path / "warm")  # imports, caches
    tracemalloc.start()
    try:
        result = simulate(s, out_dir=tmp_path / "run", steps_format="csv")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    model, gpu = load_model(s.model), load_gpu(s.gpu)
    num_gpu_blocks = result.summary["num_gpu_blocks"]
    floor = estimate_run_bytes(s, model, gpu, s.engine, num_gpu_blocks, 2**21, steps_in_memory=False)
    assert floor["kv_blocks"] == num_gpu_blocks * 32 + 8_192 * 24 + (num_gpu_blocks + 8_192 - 2 * 257) * 28
    assert sum(floor.values()) <= peak
