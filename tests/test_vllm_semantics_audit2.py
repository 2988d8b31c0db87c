"""Scheduler and KV semantics checked against vLLM's code (second audit); each expected value is derived by
hand from the vLLM function named beside it."""

import numpy as np
import pytest

from kvsim.engine.builder import build_engine
from kvsim.model.config import load_gpu
from kvsim.model.engine_config import EngineConfig
from kvsim.model.errors import KvsimError
from kvsim.workload.scenario import load_scenario
from tests.conftest import make_request


def built(scheduler: str, num_blocks: int, *extra: str, max_model_len: int = 64):
    """An engine of `num_blocks` blocks of 16 tokens, built from a scenario as every run is."""
    scenario = load_scenario(None, ["model=llama-3.1-8b", f"engine.num_gpu_blocks_override={num_blocks}",
                                    "engine.block_size=16", f"engine.max_model_len={max_model_len}",
                                    f"engine.scheduler={scheduler}", "workload.num_requests=1",
                                    *(extra or ["engine.enable_prefix_caching=false"])])
    return build_engine(scenario, np.random.default_rng(0)).scheduler


@pytest.mark.parametrize(("scheduler", "block_table", "usage"), [
    # v1: block 0 is the null block (vllm/v1/core/block_pool.py, BlockPool.__init__ pops it from the free
    # queue); blocks 1, 2, 3 are handed out, none is left: usage 1 − 0/(4 − 1) (BlockPool.get_usage)
    ("v1", [1, 2, 3], 1.0),
    # v0: CpuGpuBlockAllocator.create gives the GPU allocator block ids range(num_gpu_blocks), no null
    # block; a 40-token prompt takes blocks 0, 1, 2 (can_allocate: 4 − 3 ≥ watermark_blocks = int(0.01 · 4)
    # = 0), one is left: gpu_cache_usage 1 − 1/4 (vllm/engine/llm_engine.py, _get_stats: num_total_gpu)
    ("v0", [0, 1, 2], 0.75),
])
def test_v0_pools_have_no_null_block(scheduler, block_table, usage):
    # max_model_len 48 (3 blocks): v1's 3 usable blocks hold it, so its engine starts (vLLM's startup check
    # leaves the null block out, PR #47272)
    sched = built(scheduler, 4, max_model_len=48)
    req = make_request(0, 0.0, 40, 4)
    assert sched.add(req)
    plan = sched.schedule(0.0)
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(0, 40)]
    assert sched.alloc.seqs[req.seq_ids[0]].block_table == block_table
    assert sched.kv_usage == usage
    sched.check_invariants()


def test_v0_admits_a_prompt_the_whole_pool_holds():
    """64 tokens = 4 blocks: v0's 4 blocks hold them (4 − 4 ≥ int(0.01 · 4) = 0: not AllocStatus.NEVER);
    v1's 3 usable blocks never do, and vLLM v1 does not start such an engine: its startup check
    (vllm/v1/core/kv_cache_utils.py `get_kv_cache_configs`) reserves the null block since PR #47272; before it
    the engine started and kvsim refused the request on arrival."""
    v0 = built("v0", 4)
    assert v0.add(make_request(0, 0.0, 60, 4))
    assert [n for _, n in v0.schedule(0.0).scheduled] == [60]
    with pytest.raises(KvsimError, match=r"max_model_len=64: .* \(4 blocks, one of them v1's null block"):
        built("v1", 4)


@pytest.mark.parametrize(("scheduler", "second_step"), [
    # v0: B needs all cdiv(40, 16) = 3 blocks free beside the watermark int(0.01 · 5) = 0, only 5 − 3 = 2 are
    # (vllm/core/block_manager.py, SelfAttnBlockSpaceManager.can_allocate: LATER): A decodes alone
    ("v0", [(0, 1)]),
    # v1: B's hit covers blocks A holds; it needs 3 − 2 = 1 new block of the 4 − 3 = 1 free
    # (vllm/v1/core/single_type_kv_cache_manager.py, get_num_blocks_to_allocate): A decodes, B is admitted
    ("v1", [(0, 1), (1, 8)]),
])
def test_v0_admission_counts_the_blocks_a_prefix_hit_shares(scheduler, second_step):
    """A and B share a 32-token prefix (2 full blocks) and own 8 tokens each; A's 3 blocks are held when B
    arrives, with B's lookup hitting A's first 2. v0's pool has 5 usable blocks, v1's 4 (5 minus the null)."""
    sched = built(scheduler, 5, "engine.enable_prefix_caching=true")
    a, b = make_request(0, 0.0, 40, 10, prefix=32), make_request(1, 0.5, 40, 10, prefix=32)
    sched.add(a)
    plan = sched.schedule(0.0)
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(0, 40)]
    sched.complete(plan, 1.0)
    sched.add(b)
    assert sched.lookup(b).num_tokens == 32
    plan = sched.schedule(1.0)
    assert [(r.request_id, n) for r, n in plan.scheduled] == second_step
    sched.check_invariants()


def test_v0_max_num_seqs_default_is_256_on_every_gpu():
    """vllm/engine/arg_utils.py, `EngineArgs._set_default_args_v0`: "Set max_num_seqs to 256 for VLLM_V0"
    (the usage-context table, 1024 on an H100 or H200, is v1's `_set_default_args_v1`); v0's token budget
    without chunked prefill is max(max_model_len, 2048)."""
    v0 = EngineConfig(scheduler="v0")
    for name in ("h100-80gb", "h200", "a100-80gb", "l4"):
        gpu = load_gpu(name)
        assert (v0.resolved_max_num_seqs(gpu), v0.resolved_max_num_batched_tokens(4096, gpu)) == (256, 4096)
    assert EngineConfig().resolved_max_num_seqs(load_gpu("h100-80gb")) == 1024
    assert v0.model_copy(update={"max_num_seqs": 64}).resolved_max_num_seqs(load_gpu("h200")) == 64


def test_v0_caches_no_prefix_unless_asked():
    """vllm/engine/arg_utils.py: `EngineArgs.enable_prefix_caching` is None and only `_set_default_args_v1`
    sets it True; the V0 engine runs with it off unless the flag is given."""
    assert EngineConfig().enable_prefix_caching
    assert not EngineConfig(scheduler="v0").enable_prefix_caching
    assert EngineConfig(scheduler="v0", enable_prefix_caching=True).enable_prefix_caching
    assert not built("v0", 5, "seed=0").alloc.enable_caching  # no enable_prefix_caching given
    assert built("v1", 5, "seed=0").alloc.enable_caching
