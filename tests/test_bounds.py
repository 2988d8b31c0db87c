"""The first-principles replica floor, worked out by hand on a constant-step world."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.planning.bounds import replica_floor
from kvsim.workload.scenario import make_scenario


def world(max_num_seqs=8, blocks=401, prompt=64, output=20, max_model_len=1024):
    return make_scenario({
        "name": "floor", "model": "llama-3.1-8b", "gpu": "h100-80gb",
        "engine": {"max_num_seqs": max_num_seqs, "max_model_len": max_model_len, "num_gpu_blocks_override": blocks,
                   "max_num_batched_tokens": 512},
        "latency": {"model": "constant", "step_s": 0.01},
        "workload": {"num_requests": 50, "arrival": {"process": "poisson", "rate": 1.0},
                     "prompt_len": {"dist": "fixed", "value": prompt}, "output_len": {"dist": "fixed", "value": output}}})


def test_compute_and_kv_floors_by_hand():
    """τ = 10 ms per step whatever it holds. Compute: a prompt token costs at best τ/512 (a full chunk), an
    output token τ/8 (8 decodes a step): 64·τ/512 + 20·τ/8 = 1.25 ms + 25 ms = 26.25 ms a request, so at
    100 req/s, 2.625 replicas. KV: (20 − 1) decode steps of ≥ τ each, holding ≥ 64 + 10 tokens on average:
    19 · 74 · 10 ms = 14.06 token-seconds a request; 100 req/s hold 1406 tokens; the pool has (401 − 1)
    blocks of 16 = 6400 slots: 0.2197 replicas. Compute binds: 3 replicas."""
    floor = replica_floor(world(), 100.0)
    assert floor.compute_replicas == pytest.approx(100 * (64 * 0.01 / 512 + 20 * 0.01 / 8))
    assert floor.kv_replicas == pytest.approx(100 * 19 * 74 * 0.01 / 6400)
    assert floor.binds == "compute" and floor.replicas == 3


def test_a_small_pool_makes_kv_bind():
    """Same traffic, 41 blocks (640 slots): KV needs 1406 / 640 = 2.2 replicas; with 64 sequences a step the
    compute floor drops to 100 · (1.25 ms + 20 · 10 ms / 64) = 0.4375: KV binds, 3 replicas."""
    floor = replica_floor(world(max_num_seqs=64, blocks=41, max_model_len=512), 100.0)
    assert floor.kv_replicas == pytest.approx(100 * 19 * 74 * 0.01 / 640)
    assert floor.binds == "kv" and floor.replicas == 3


def test_a_pool_without_a_null_block_counts_every_block():
    """vLLM v0's block manager keeps no null block (v1's `BlockPool` keeps block 0 back): the same traffic on
    v0 holds its 1406 tokens against all 401 blocks of 16 = 6416 slots, not 6400."""
    raw = world(max_model_len=512).model_dump(mode="json")  # v0 needs max_num_batched_tokens (512) >= it
    raw["engine"]["scheduler"] = "v0"
    floor = replica_floor(make_scenario(raw), 100.0)
    assert floor.kv_replicas == pytest.approx(100 * 19 * 74 * 0.01 / 6416)


def test_refused_requests_are_left_out():
    floor = replica_floor(world(prompt=2000, max_model_len=1024), 100.0)
    assert floor.num_requests == 0 and floor.replicas == 1


def test_the_floor_is_for_the_served_rate(tmp_path):
    """Half of a trace's requests are refused (2,000-token prompts over max_model_len 1,024), so of 100 req/s
    offered the engine serves 50: the floor is the all-servable world's at 50 req/s, by hand
    50 · (64·τ/512 + 20·τ/8) = 1.3125 replicas of compute and 50 · 19 · 74 · τ / 6400 of KV (2 replicas),
    not the 2.625 that pricing every offered request at the servable ones' mean would give."""
    trace = tmp_path / "half.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 00:00:0{i}.000000,{64 if i % 2 else 2000},20\n" for i in range(8)))
    raw = world().model_dump(mode="json")
    raw["workload"] = {"num_requests": 8, "arrival": {"process": "trace"}, "trace": {"format": "azure", "path": str(trace)}}
    floor = replica_floor(make_scenario(raw), 100.0)
    assert floor.num_requests == 4 and floor.rate_per_s == pytest.approx(50.0)
    assert floor.compute_replicas == pytest.approx(50 * (64 * 0.01 / 512 + 20 * 0.01 / 8))
    assert floor.kv_replicas == pytest.approx(50 * 19 * 74 * 0.01 / 6400)
    assert floor.replicas == 2


def test_the_gap_breakdown_sums_to_the_replicas_and_is_right_by_hand():
    """One replica, evenly spaced arrivals at 2 req/s (0.5 s apart), the world above: each request runs alone,
    its 64-token prompt in one step (which yields the first token) and 19 decode steps: 20 steps of τ, 0.2 s
    of steps a request (w), B = 50 · 0.2 = 10 replica-seconds in all. The run lasts T = 49 · 0.5 + 0.2 = 24.7 s
    (first arrival to the last request's last step), so it served λ = 50 / 24.7 req/s, and the floor and gap are
    that run's (`run_floor`). The floor prices a request at w_min = 64·τ/512 + 20·τ/8 = 26.25 ms: compute floor
    λ · 26.25 ms = 0.053138 replicas; busy B / T = 0.404858, so batching (one sequence a step where 8 fit)
    0.404858 − 0.053138; nothing preempted, nothing recomputed; idle 1 − 0.404858 = 0.595142, the share of the
    24.7 s the replica did not step. They sum to the one replica; the KV floor is λ · 19 · 74 · τ / 6400 slots;
    the gap to the binding (compute) floor is 1 − 0.053138."""
    from kvsim.planning.bounds import GAP_PARTS, gap_breakdown, gap_text, run_floor
    from kvsim.planning.plan import point_metrics

    raw = world().model_dump(mode="json")
    raw["workload"]["arrival"] = {"process": "constant", "rate": 2.0}
    raw.update(replicas=1, steps="none")
    scenario = make_scenario(raw)
    metrics = point_metrics(scenario)
    assert metrics["duration_s"] == pytest.approx(24.7) and metrics["num_finished"] == 50
    floor = run_floor(scenario, metrics["num_finished"], metrics["duration_s"])
    rate = 50 / 24.7
    assert floor.rate_per_s == pytest.approx(rate)
    work = metrics["work"]
    parts = gap_breakdown(floor, 1, work["busy_replica_s"], work["recomputed_tokens"])
    assert work["busy_replica_s"] == pytest.approx(50 * 20 * 0.01)
    assert work["recomputed_tokens"] == 0
    assert parts["compute_floor"] == pytest.approx(rate * 0.02625)
    assert parts["batching"] == pytest.approx(10 / 24.7 - rate * 0.02625)
    assert parts["preemption"] == 0.0
    assert parts["idle"] == pytest.approx(1 - 10 / 24.7)
    assert sum(parts[k] for k in GAP_PARTS) == pytest.approx(1.0)
    assert parts["kv_floor"] == pytest.approx(rate * 19 * 74 * 0.01 / 6400)
    assert parts["gap"] == pytest.approx(1 - rate * 0.02625)
    assert gap_text(parts, 1) == "1 replica = compute floor 0.05 + batching 0.35 + preemption 0.00 + idle 0.60; " \
                                 "KV floor 0.00"


def test_idle_is_not_negative_when_the_steps_fill_the_run_up_to_rounding():
    """A replica that steps the whole run is idle 0: its step times sum to the run's duration T. Summed as floats
    they may not (0.1 + 0.2 is 0.30000000000000004 against a clock that ends at 0.3), and idle read -2e-16,
    printed "- idle 0.00" (the README's, now docs/fleets-and-plan.md's, `kvsim plan` example's H100 row read -1.2e-14 over 10,000 requests).
    No replica steps longer than T, so idle is 0 here and the parts still sum to the one replica."""
    from kvsim.planning.bounds import GAP_PARTS, ReplicaFloor, gap_breakdown, gap_text

    floor = ReplicaFloor(rate_per_s=10 / 0.3, compute_replicas=0.25, kv_replicas=0.1, num_requests=10,
                         num_served=10, duration_s=0.3)
    parts = gap_breakdown(floor, 1, 0.1 + 0.2, 0)
    assert 0.1 + 0.2 > 0.3  # the rounding this test is about
    assert parts["idle"] == 0.0
    assert sum(parts[k] for k in GAP_PARTS) == pytest.approx(1.0)
    assert gap_text(parts, 1) == "1 replica = compute floor 0.25 + batching 0.75 + preemption 0.00 + idle 0.00; " \
                                 "KV floor 0.10"


@pytest.mark.parametrize("caching", [True, False])
def test_a_prefix_every_request_shares_is_computed_and_held_once_with_prefix_caching(caching):
    """50 requests of a shared 64-token system prompt (4 blocks of 16) and 64 tokens of their own. With prefix
    caching the first computes all 128 prompt tokens, the 49 others only their own 64 (the cache serves the 4
    shared blocks; their own fifth block is theirs): (128 + 49 · 64) / 50 = 65.28 tokens a request. Compute:
    100 · (65.28 · τ/512 + 20 · τ/8); KV: 100 · 19 · (65.28 + 10) · τ / 6400. Without caching, 128 tokens. The
    floor counted all 128 with caching on, so lab-5 (a 2,000-token shared prompt) at 12 req/s had a floor of 3
    A100s that one A100 met in a 3,000-request run."""
    raw = world().model_dump(mode="json")
    raw["engine"]["enable_prefix_caching"] = caching
    raw["workload"]["shared_prefix"] = {"tokens": 64, "fraction": 1.0}
    floor = replica_floor(make_scenario(raw), 100.0)
    prompt = (128 + 49 * 64) / 50 if caching else 128
    assert floor.compute_replicas == pytest.approx(100 * (prompt * 0.01 / 512 + 20 * 0.01 / 8))
    assert floor.kv_replicas == pytest.approx(100 * 19 * (prompt + 10) * 0.01 / 6400)


@pytest.mark.parametrize(("cpu_bytes", "computed"), [("4GiB", (128 + 49 * 64) / 50), (0, 128)])
def test_with_caching_off_an_offload_tier_spares_the_shared_prefix_s_compute_but_not_its_kv(cpu_bytes, computed):
    """The world above with prefix caching off and a CPU tier (vLLM's --no-enable-prefix-caching with an
    offloading connector): the first request stores the 4 shared blocks and the 49 others load them, so they
    compute only their own 64 tokens as with caching, (128 + 49 · 64) / 50 = 65.28 a request; but each loads them
    into blocks of its own, so it holds all 128 prompt tokens: KV 100 · 19 · (128 + 10) · τ / 6400. The floor
    counted 128 computed, above what such an engine needs. A tier of 0 bytes is no tier: 128."""
    raw = world().model_dump(mode="json")
    raw["engine"].update(enable_prefix_caching=False, kv_offload={"cpu_bytes": cpu_bytes})
    raw["workload"]["shared_prefix"] = {"tokens": 64, "fraction": 1.0}
    floor = replica_floor(make_scenario(raw), 100.0)
    assert floor.compute_replicas == pytest.approx(100 * (computed * 0.01 / 512 + 20 * 0.01 / 8))
    assert floor.kv_replicas == pytest.approx(100 * 19 * (128 + 10) * 0.01 / 6400)


@pytest.mark.parametrize(("engine", "steps"), [({"enable_prefix_caching": True}, 1),
                                                ({"enable_prefix_caching": False}, 2),
                                                ({"enable_prefix_caching": False, "kv_offload": {"cpu_bytes": "4GiB"}}, 1)])
def test_the_ttft_floor_of_an_engine_with_an_offload_tier_is_one_step(engine, steps):
    """1,000-token prompts, chunks of 512, τ = 10 ms: with neither prefix caching nor a tier a prompt takes
    ⌈1000 / 512⌉ = 2 steps; with either, at best all but its last token are found (hit, or loaded: the load's
    time left out of a floor), 1 step. The floor said 2 steps for a tier with caching off, above what it can do."""
    from kvsim.planning.slo_floor import slo_floor

    raw = world(prompt=1000, max_model_len=2048).model_dump(mode="json")
    raw["engine"].update(engine)
    floor = slo_floor(make_scenario(raw))
    assert floor is not None and floor.ttft_s == pytest.approx(steps * 0.01)


def test_speculative_verify_steps_are_not_recompute():
    """The same world with n-gram drafts (K = 3, always accepted): each request runs alone, its prompt in
    one step and its 19 other tokens in ceil(19 / 4) = 5 verify steps of 1 + 3 tokens, 6 steps of τ. Nothing
    is preempted, so nothing is recomputed; the plan counted the verify chunks (4 tokens each, counted with
    the prefill chunks of their steps) as recompute: 50 · 5 · 4 = 1,000 tokens, a preemption part of
    2 req/s · 1,000 / 50 · τ/512 replicas where there was none."""
    from kvsim.planning.bounds import gap_breakdown, run_floor
    from kvsim.planning.plan import point_metrics

    raw = world().model_dump(mode="json")
    raw["workload"]["arrival"] = {"process": "constant", "rate": 2.0}
    raw["engine"]["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rates": 1.0}
    raw.update(replicas=1, steps="none")
    scenario = make_scenario(raw)
    metrics = point_metrics(scenario)
    work = metrics["work"]
    assert metrics["num_preemptions"] == 0
    assert work["busy_replica_s"] == pytest.approx(50 * 6 * 0.01)
    assert work["recomputed_tokens"] == 0
    floor = run_floor(scenario, metrics["num_finished"], metrics["duration_s"])
    parts = gap_breakdown(floor, 1, work["busy_replica_s"], work["recomputed_tokens"])
    assert parts["preemption"] == 0.0


@pytest.mark.parametrize("scheduler, prefix_caching, prompt, prompt_tokens", [
    ("v1", True, 40, 40 + 2 * 8),  # children 2 and 3 hit blocks [0, 32) of child 1's and compute the 8-token tail
    ("v1", True, 32, 32 + 2 * 16),  # a prompt ending on a block boundary: the hit stops one block short
    ("v1", False, 40, 3 * 40),  # no prefix cache: every child computes the whole prompt
    ("v0", True, 40, 40),  # v0 forks the samples from one prefill
])
def test_parallel_sampling_computes_n_outputs_and_the_prompt_as_vllm_fans_it_out(scheduler, prefix_caching, prompt,
                                                                                   prompt_tokens):
    """n = 3 samples of 20 tokens: 60 output tokens a request at τ/8 each, and the prompt tokens vLLM computes
    for it (v1: one child request per sample, sharing only the prefix cache's full blocks, never the block
    holding the prompt's last token: vllm/v1/engine/parallel_sampling.py, KVCacheManager.get_computed_blocks;
    v0: one prefill, then fork) at τ/512 each. KV: 19 decode steps of ≥ τ holding ≥ the prompt once and the
    3 samples' outputs, 10 tokens each on average."""
    raw = world(max_model_len=512, prompt=prompt).model_dump(mode="json")
    raw["engine"].update(scheduler=scheduler, enable_prefix_caching=prefix_caching)
    raw["workload"]["n"] = 3
    floor = replica_floor(make_scenario(raw), 100.0)
    assert floor.compute_replicas == pytest.approx(100 * (prompt_tokens * 0.01 / 512 + 3 * 20 * 0.01 / 8))
    assert floor.kv_replicas == pytest.approx(100 * 19 * (prompt + 3 * 10) * 0.01 / (6416 if scheduler == "v0" else 6400))


@pytest.mark.parametrize("prefix_caching, prompt, prompt_tokens", [
    (False, 32, 32 + 2 * 1),  # children 2 and 3 load both full blocks and compute only the last token
    (True, 32, 32 + 2 * 1),  # the GPU hits block 0, the tier serves block 1 (the one holding the last token)
    (False, 40, 40 + 2 * 8),  # 40 // 16 = 2 full blocks loaded: the 8-token tail, as a GPU hit leaves it
])
def test_parallel_sampling_beside_an_offload_tier_computes_the_prompts_last_token_only(prefix_caching, prompt,
                                                                                         prompt_tokens):
    """n = 3 samples with a 4 GiB CPU tier: vLLM's OffloadingConnector asks for `num_tokens // block_size` blocks
    (`get_num_new_matched_tokens`), the last full one included, and a load covering the whole prompt leaves one
    token to compute (`Scheduler._update_waiting_for_remote_kv`): a 32-token child computes 1 token, not the
    16 of the block a GPU hit stops short of. The floor said 16, above what such an engine computes."""
    raw = world(max_model_len=512, prompt=prompt).model_dump(mode="json")
    raw["engine"].update(enable_prefix_caching=prefix_caching, kv_offload={"cpu_bytes": "4GiB"})
    raw["workload"]["n"] = 3
    floor = replica_floor(make_scenario(raw), 100.0)
    assert floor.compute_replicas == pytest.approx(100 * (prompt_tokens * 0.01 / 512 + 3 * 20 * 0.01 / 8))
    assert floor.kv_replicas == pytest.approx(100 * 19 * (prompt + 3 * 10) * 0.01 / 6400)


@pytest.mark.parametrize("caching", [True, False])
def test_an_offload_tier_serves_a_repeated_prompt_but_its_last_token(caching):
    """A (32 tokens) and later B, the same 32 tokens, in 16-token blocks: a GPU prefix cache serves B block 0
    only (16 tokens: never the block holding the last token); a tier serves both blocks, 31 tokens, leaving the
    last to compute; the engine (tier beside caching on or off) loads exactly that, so no floor may count
    more than 1 token computed for B."""
    from kvsim.planning.bounds import cacheable_prompt_tokens
    from tests.test_offload_connector import connector, req
    from tests.test_offload_no_prefix_caching import run

    a, b = req(0, 0.0, list(range(32))), req(1, 1.0, list(range(32)))
    assert list(cacheable_prompt_tokens([a, b], 16)) == [0, 16]
    assert list(cacheable_prompt_tokens([a, b], 16, last_block=True)) == [0, 31]
    _, rows = run([a, b], connector(), caching=caching, budget=64)
    assert list(rows["prefix_hit_tokens"]) == [0, 31]


def gemma(prompt, blocks=1001, output=20):
    raw = world(blocks=blocks, prompt=prompt, output=output, max_model_len=4096).model_dump(mode="json")
    raw["model"] = "gemma-3-27b"
    return make_scenario(raw)


@pytest.mark.parametrize(("prompt", "held_per_request"), [
    # contexts 65..83, all inside the 1,024-token window: every one of the 7 groups holds them, 7 · 19 · 74
    (64, 7 * 19 * 74),
    # contexts 2,001..2,019: the full group holds 19 · 2,010; each of the 6 sliding groups its window less one, 1,023
    (2000, 19 * 2010 + 6 * 19 * 1023),
    # contexts 1,016..1,034: the sliding groups hold 1,016..1,023 (k = 1..8), then 1,023 for the 11 steps after
    (1015, 19 * (1015 + 10) + 6 * (8 * 1015 + 36 + 11 * 1023)),
])
def test_a_hybrid_pools_kv_floor_counts_every_groups_slots(prompt, held_per_request):
    """Gemma 3 27B: 62 layers, 10 full-attention and 52 sliding (window 1,024), grouped 10 to a group: 1 full
    group and 6 sliding (vLLM's get_kv_cache_groups), every group's block table drawing on one pool of
    (1,001 − 1) blocks of 16 = 16,000 slots. A request holds its context in the full group and at most 1,023
    tokens (the window less one, SlidingWindowManager) in each sliding one, in each of its 19 decode steps of
    ≥ 10 ms; 100 req/s hold 100 · 0.01 · that token-seconds. It was priced as one group's: the first case 7x low."""
    floor = replica_floor(gemma(prompt), 100.0)
    assert floor.kv_replicas == pytest.approx(100 * 0.01 * held_per_request / 16000)


@pytest.mark.parametrize(("group", "prompt", "samples", "output", "held"), [
    (("full", None), 10, 2, 6, 12 + 14 + 16 + 18 + 20),  # contexts 10 + 2k, k = 1..5
    (("sliding_window", 16), 10, 2, 6, 12 + 14 + 15 + 15 + 15),  # at most the window less one, 15
    (("chunked_local", 10), 5, 1, 10, 6 + 7 + 8 + 9 + 0 + 1 + 2 + 3 + 4),  # contexts 6..14, their current chunk's
    (("chunked_local", 10), 5, 1, 25, 6 + 7 + 8 + 9 + 45 + 45),  # contexts 6..29: two chunks crossed
    (("chunked_local", 10), 5, 3, 10, 6 + 7 + 8 + 9 + 0 + 1 + 2 + 3 + 4),  # one sample's chunk, the fewest held
])
def test_held_token_steps_per_group_kind_by_hand(group, prompt, samples, output, held):
    import numpy as np

    from kvsim.model.kv_layout import KVGroup
    from kvsim.planning.bounds import held_token_steps
    kind, window = group
    steps = held_token_steps((KVGroup(kind, 1, window),), np.array([prompt * 1.0]), np.array([samples * 1.0]),
                             np.array([output * 1.0]))
    assert steps.tolist() == [held]


@pytest.mark.parametrize(("prompt", "cached", "output", "held"), [
    # chunk 10, a 21-token prompt of which 8 cached: contexts 22..24, chunk [20, ..): 2 + 3 + 4 own tokens
    # ((13 + k) mod 10 read 4 + 5 + 6, more than the request holds: no floor)
    (13, 8, 4, 2 + 3 + 4),
    # chunk 20, 17 tokens of which 8 cached: contexts 18, 19 lie in chunk [0, 20), holding 10, 11 tokens after the
    # cached 8; contexts 20..22 in chunk [20, ..) hold 0, 1, 2
    (9, 8, 6, 10 + 11 + 0 + 1 + 2),
    (9, 0, 6, 10 + 11 + 12 + 13 + 14),  # nothing cached: contexts 10..14, all in chunk [0, 20)
])
def test_a_chunked_local_floor_counts_the_current_chunk_of_the_whole_context(prompt, cached, output, held):
    """`prompts` is a request's own tokens, the prompt less its cached prefix: a chunked-local group holds the
    current chunk of the whole context, of which the cached prefix's part is left out (it may be shared)."""
    import numpy as np

    from kvsim.model.kv_layout import KVGroup
    from kvsim.planning.bounds import held_token_steps
    chunk = 20 if prompt == 9 else 10
    steps = held_token_steps((KVGroup("chunked_local", 1, chunk),), np.array([prompt * 1.0]), np.array([1.0]),
                             np.array([output * 1.0]), np.array([cached * 1.0]))
    assert steps.tolist() == [held]


def test_a_cached_prefix_in_an_earlier_chunk_leaves_the_chunked_groups_the_current_chunk():
    """Llama 4 Scout (TP 4): 3 chunked-local groups (chunk 8,192) and 1 full one over (5,001 − 1) · 16 = 80,000
    slots; 50 requests of a shared 1,024-token prefix and 7,232 tokens of their own (8,256 in all), 20 outputs,
    prefix caching on: the first holds its 8,256 tokens, the 49 others 7,232 of their own (the cache serves the
    prefix's 64 blocks). Each decode step k = 1..19 is at context 8,256 + k, inside chunk [8,192, 16,384): every
    chunked group holds 64 + k of it (the cached prefix lies in chunk 0, already dropped), 19 · 74 = 1,406 per
    group. The full group holds 19 · (own + 10). The floor read (7,232 + k) mod 8,192 for the 49: 19 · 7,242 in
    each chunked group, 3.8x the whole floor."""
    raw = world(blocks=5001, prompt=7232, max_model_len=16384).model_dump(mode="json")
    raw["model"] = "llama-4-scout"
    raw["engine"].update(tensor_parallel_size=4, enable_prefix_caching=True)
    raw["workload"]["shared_prefix"] = {"tokens": 1024, "fraction": 1.0}
    held = 19 * (8266 + 49 * 7242) / 50 + 3 * 19 * 74
    assert replica_floor(make_scenario(raw), 100.0).kv_replicas == pytest.approx(100 * 0.01 * held / 80000)


def two_rate_traffic(tmp_path):
    """An Azure trace of 100 requests of 64 prompt and 20 output tokens, 10 arriving 0.25 s apart then 90 0.5 s
    apart, served by `world()`; the scenario's traffic its first 10 (4 req/s)."""
    arrivals_s = [0.25 * i for i in range(10)] + [2.25 + 0.5 * i for i in range(1, 91)]
    trace = tmp_path / "two_rates.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 00:{int(t // 60):02d}:{t % 60:09.6f},64,20\n" for t in arrivals_s))
    raw = world().model_dump(mode="json")
    raw["workload"] = {"num_requests": 10, "arrival": {"process": "trace"},
                       "trace": {"format": "azure", "path": str(trace)}}
    return make_scenario(raw)


def test_a_plan_rows_floor_and_gap_are_its_long_runs_not_the_probes_traffic(tmp_path):
    """A trace whose first 10 requests come 0.25 s apart (4 req/s) and its next 90 0.5 s apart: the plan's
    base traffic is the first 10, its long run all 100 on one replica of the world above (each request alone:
    20 steps of τ = 0.2 s, under either spacing). That run lasts T = 9 · 0.25 + 90 · 0.5 + 0.2 = 47.45 s and
    serves λ = 100 / 47.45 = 2.1075 req/s; its replica steps B = 100 · 0.2 = 20 s. So the row's floor is the
    long run's: compute λ · 26.25 ms = 0.05532 replicas (1 replica), KV λ · 19 · 74 · τ / 6400, and the gap
    1 = compute floor + batching (B / T − compute) + preemption 0 + idle (1 − B / T = 0.5785). Priced at the
    base traffic's 4 req/s, as it was, the compute floor read 0.105 and idle 1 − 4 · 0.2 = 0.2: the long run
    was busy 42 % of its time, not 80 %."""
    from kvsim.planning.bounds import GAP_PARTS
    from kvsim.planning.plan import answer_floor, point_metrics
    from kvsim.planning.plan_rate import offered_rate_per_s, scaled_traffic
    from kvsim.planning.spec import Candidate, make_plan_spec

    base = two_rate_traffic(tmp_path)
    assert offered_rate_per_s(base) == pytest.approx(4.0)  # the base traffic: the first 10 arrivals
    shape, spec = Candidate("h100-80gb", 1), make_plan_spec({"slo": {"ttft_s.p90": 1.0}, "gpus": ["h100-80gb"]})
    metrics = point_metrics(shape.scenario(scaled_traffic(base, 1.0, 100), 1, spec.router))
    assert metrics["num_finished"] == 100 and metrics["work"]["busy_replica_s"] == pytest.approx(20.0)
    floor, gap = answer_floor(base, shape, spec, {"replicas": 1}, metrics)
    rate, busy = 100 / 47.45, 20 / 47.45
    assert floor.rate_per_s == pytest.approx(rate) and floor.num_requests == 100
    assert floor.compute_replicas == pytest.approx(rate * 0.02625) == gap["compute_floor"]
    assert floor.kv_replicas == pytest.approx(rate * 19 * 74 * 0.01 / 6400) == gap["kv_floor"]
    assert gap["batching"] == pytest.approx(busy - rate * 0.02625) and gap["preemption"] == 0.0
    assert gap["idle"] == pytest.approx(1 - busy)
    assert sum(gap[k] for k in GAP_PARTS) == pytest.approx(1.0)
    # with nothing run (no requests stated), the floor is the base traffic's, at its own rate, and there is no gap
    floor, gap = answer_floor(base, shape, spec, {"replicas": None}, None)
    assert floor.rate_per_s == pytest.approx(4.0) and floor.num_requests == 10 and gap == {}


@pytest.mark.parametrize("row", [
    {"replicas": None, "requests_per_probe": 100},  # no answer: its probes ran 100 requests
    {"replicas": 3, "evidence_num_requests": 100, "requests_per_probe": 10},  # a split, a rate search's probe
])
def test_a_row_with_no_run_behind_its_answer_has_the_floor_of_the_traffic_its_runs_offered(tmp_path, row):
    """The trace above (10 arrivals 0.25 s apart, then 90 0.5 s apart) with the plan's base traffic its first 10.
    A row whose runs served 100 requests but none behind its answer (an infeasible row's probes, a split's fixed
    fleet, a rate search without long runs whose one-replica probe ran a fraction of those 100) read the floor of
    the base traffic, 10 requests at 4 req/s: the rate of no run it reports. Its floor is now the 100 requests'
    at the rate they were offered, (100 − 1) / (2.25 + 90 · 0.5) = 99 / 47.25 = 2.0952 req/s (offered rate:
    requests − 1 over first to last arrival), compute 26.25 ms each, and it has no gap."""
    from kvsim.planning.plan import answer_floor
    from kvsim.planning.spec import Candidate, make_plan_spec

    shape, spec = Candidate("h100-80gb", 1), make_plan_spec({"slo": {"ttft_s.p90": 1.0}, "gpus": ["h100-80gb"]})
    floor, gap = answer_floor(two_rate_traffic(tmp_path), shape, spec, row, None)
    assert floor.rate_per_s == pytest.approx(99 / 47.25) and floor.num_requests == 100 and gap == {}
    assert floor.compute_replicas == pytest.approx(99 / 47.25 * 0.02625)


def test_the_output_token_floor_is_no_dearer_than_a_smaller_capture_size_batch():
    """max_num_seqs 257 and a 2,048-token budget: vLLM's capture sizes reach 512 in steps of 16 past 256, so a
    257-sequence decode runs a 272-token graph, while 256 sequences (which the engine also runs) run exactly 256:
    on the roofline the 256-batch is cheaper a token, and the floor may not price an output token above it."""
    from kvsim.engine.builder import make_latency, resolve_engine
    from kvsim.latency.step_plan import StepPlan

    raw = world(max_num_seqs=257, blocks=4001).model_dump(mode="json")
    raw["engine"]["max_num_batched_tokens"] = 2048
    raw["latency"] = {"model": "roofline"}
    scenario = make_scenario(raw)
    latency = make_latency(resolve_engine(scenario))

    def per_token(num_seqs):
        step = StepPlan()
        step.add(1, 64 + 10 - 1, num_seqs, logits_row=True)  # the traffic's mean context, 64 + 20 / 2
        return latency.step_time(step) / num_seqs

    assert per_token(256) < per_token(257)
    assert replica_floor(scenario, 100.0).output_token_s == per_token(256)


@settings(max_examples=12, deadline=None)
@given(max_num_seqs=st.integers(1, 520), budget=st.sampled_from([520, 2048]))
def test_the_output_token_floor_is_the_least_over_every_batch_the_engine_runs(max_num_seqs, budget):
    """Whatever max_num_seqs B and budget, with CUDA-graph padding: no decode batch of b <= B sequences (the
    traffic's mean context) computes an output token in less time than the floor says, and one of them takes
    exactly that (a naive minimum over every b)."""
    from kvsim.engine.builder import make_latency, resolve_engine
    from kvsim.latency.step_plan import StepPlan

    raw = world(max_num_seqs=max_num_seqs, blocks=4001).model_dump(mode="json")
    raw["engine"]["max_num_batched_tokens"] = budget
    raw["latency"] = {"model": "roofline"}
    scenario = make_scenario(raw)
    latency = make_latency(resolve_engine(scenario))
    least = math.inf
    for num_seqs in range(1, max_num_seqs + 1):
        step = StepPlan()
        step.add(1, 64 + 10 - 1, num_seqs, logits_row=True)
        least = min(least, latency.step_time(step) / num_seqs)
    assert replica_floor(scenario, 100.0).output_token_s == least
