"""The builder resolves a scenario once into an immutable engine spec; everything is built from it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import kvsim.engine.builder
import kvsim.model.capacity
from kvsim.engine.builder import build_engine, resolve_engine
from kvsim.model.engine_config import EngineConfig
from kvsim.workload.scenario import load_scenario

LLAMA_8B = ["model=llama-3.1-8b", "engine.num_gpu_blocks_override=1000", "engine.block_size=16",
            "engine.max_model_len=4096", "workload.num_requests=10"]


def test_spec_by_hand_paged_v0():
    spec = resolve_engine(load_scenario(None, [*LLAMA_8B, "engine.scheduler=v0"]))
    # 2 (K, V) · 32 layers · 8 KV heads · 128 · 2 B = 128 KiB a token; 16 tokens a block
    assert (spec.bytes_per_token, spec.bytes_per_block) == (131_072, 2_097_152)
    # vLLM v0's block manager hands out all num_gpu_blocks: no null block (CpuGpuBlockAllocator.create
    # gives the GPU allocator block ids range(num_gpu_blocks))
    assert spec.num_gpu_blocks == 1000 and spec.num_kv_slots == 1000 * 16
    assert spec.num_cpu_blocks == 4 * 2**30 // 2_097_152 == 2048  # swap_space 4 GiB
    # v0's 1 % watermark, in whole blocks: int(0.01 · num_gpu_blocks) = int(0.01 · 1,000) = 10 blocks
    # (vllm/core/block_manager.py, SelfAttnBlockSpaceManager.__init__: watermark_blocks)
    assert spec.limits.watermark_slots == 10 * 16 and spec.max_model_len == 4096
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.num_gpu_blocks = 2  # type: ignore[misc]


@pytest.mark.parametrize("overrides", [["engine.scheduler=v1"], ["engine.scheduler=static"],
                                       ["engine.scheduler=v0", "engine.preemption_mode=recompute"]])
def test_no_swap_space_where_preemption_never_swaps(overrides):
    """vLLM v1 takes --swap-space and never swaps (nor does the static scheduler, nor v0 told to recompute):
    no CPU pool (a checked run recounted an unused one of 2,048 blocks at every step)."""
    spec = resolve_engine(load_scenario(None, [*LLAMA_8B, *overrides]))
    assert (spec.num_cpu_blocks, spec.num_cpu_slots) == (0, 0)


def test_slab_spec_has_no_null_block():
    spec = resolve_engine(load_scenario(None, [*LLAMA_8B, "engine.allocator=slab-max", "engine.scheduler=v0"]))
    assert spec.num_kv_slots == 1000 * 16 and spec.num_cpu_slots == 4 * 2**30 // 131_072


def test_build_engine_sizes_the_pool_once_and_from_the_spec(monkeypatch):
    """The pool is sized once, and the KV layout and `max_model_len` it needs are resolved once
    (`resolve_engine` hands both to `num_gpu_blocks`, which derived them again)."""
    calls: dict[str, int] = {}

    def counted(owner, name):
        real = getattr(owner, name)

        def count(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, count)

    counted(kvsim.engine.builder, "num_gpu_blocks")
    counted(kvsim.engine.builder, "model_kv_layout")
    counted(kvsim.model.capacity, "model_kv_layout")
    counted(EngineConfig, "resolved_max_model_len")
    parts = build_engine(load_scenario(None, LLAMA_8B), np.random.default_rng(0))
    assert calls == {"num_gpu_blocks": 1, "model_kv_layout": 1, "resolved_max_model_len": 1}
    assert parts.scheduler.alloc.num_total_slots == parts.spec.num_kv_slots == 15_984
    assert parts.scheduler.limits is parts.spec.limits
    assert parts.facts["num_gpu_blocks"] == 1000 and parts.facts["max_model_len"] == 4096
    # vLLM's "maximum concurrency": 1,000 blocks / cdiv(4,096, 16) blocks a request
    assert parts.facts["vllm_max_concurrency"] == 1000 / 256
