"""Metamorphic relations, thirteenth round: the features the core relations do not reach (disaggregation, KV
offload, speculation, priority classes, routers, a lockstep data-parallel group).

`test_metamorphic.py` to `test_metamorphic12.py` hold the earlier rounds; round twelve the core scheduler and
allocator, round eleven planning and queueing. Here, each expected value the other run of a pair or derived by hand:

* an isolated request on a 1P1D fleet is the single synchronous engine split in two, step for step at the roofline
  (Llama-3.1-8B, H100): the prefill instance runs the engine's prefill steps, the decode instance one step more
  than the engine's decodes, that step pricing exactly as the decode step of a prompt one token shorter (1 new
  token over P − 1 computed: vLLM's remote prefill recomputes the last prompt token), then the engine's decodes;
  a finite link moves every instant after the hand-off by latency + ceil(P / 16) · 16 · 128 KiB / bandwidth less
  the reference link's bytes / 10^18 (to 1e-12 s);
* on a loaded 1P1D fleet whose prefill pool never binds, the prefill instance's requests do not depend on the link
  (P keeps a prompt's blocks until its transfer ends, which only a binding pool could feel);
* a decode instance that never waits for blocks (4,000 of them, a 10 ms step, up to 49 running) follows vLLM's
  schedule loop: a hand-off is reserved (WAITING_FOR_REMOTE_KVS, the read started) at D's next step boundary,
  within one step; the KV arrives no sooner than latency + ceil(P / 16) · 16 · 128 KiB / bandwidth later; D
  learns of it at the end of the step it arrived in (`finished_recving`) and admits the request at that boundary,
  within one step of the arrival; its first token one step later and its end O steps after admission;
* a CPU offload tier that is stored into but never hit changes nothing: prompts sharing no block under prefix
  caching, `max_num_seqs` 4 so no request is preempted, a 200-block pool that evicts cached blocks (1,411 stored
  to a 300-block tier, 1,111 of them evicted from it): the same requests and steps as without the tier (stores
  drain on their own link and hold no GPU block the scheduler needs);
* a CPU tier hit costs exactly its load: a prompt's 50 blocks evicted from a 61-block pool by a 945-token prompt and
  asked for again load in 50 · 2 MiB / (tp · bandwidth) (8 and 64 GB/s; TP 1, 2, 4: each rank moves its shard of
  8 / tp KV heads over its own host link), after which the request takes the step a GPU hit of the same 800
  tokens takes in a pool that kept them: TTFT and `queue_s` later by exactly the load (vLLM stamps SCHEDULED once
  the KV has arrived), `prefix_hit_tokens` 800 either way (vLLM's `num_cached_tokens` counts the connector's
  tokens), the GPU's hit counter 0 and 800;
* speculation that never accepts is no speculation (n-gram, K = 1 and 3, acceptance 0, a 10 ms step, a roomy
  pool): every request and step time as the synchronous engine without it (vLLM schedules n-gram drafts
  synchronously, so the pair's other run is the synchronous engine: the asynchronous default ends 39 of the 40
  requests one step later), each of a request's O − 1 decodes batching its K drafts beside its token: K · Σ (O − 1)
  tokens more, and Σ (O − 1) verifies of K drafts counted; at acceptance 1 each request's decode phase is
  ceil((O − 1) / (K + 1)) steps, counted by hand, under load, and its first token does not depend on K;
* two priority classes where the urgent class (priority 0) arrives after the other (priority 5) has finished:
  the priority scheduler serves every request as FCFS, under preemption within each class;
* N · k requests arriving at one instant on N identical replicas go k to each, under every router (round robin
  in turn; least outstanding, least KV and affinity on unshared prompts by the outstanding count, which includes
  the requests dispatched that instant, so any tie rule gives the same), for the asynchronous and synchronous
  engine, and on a 3P2D fleet's prefill pool (12 requests, 4 each; round robin's decode pool 6 each); given every
  row three times at one instant, three replicas with an offload tier or n-gram drafts accepted whole mirror each
  other under every router (random acceptance would not: the run's one generator draws for every replica);
* a lockstep data-parallel group (Qwen3-30B-A3B, an MoE, DP 2) whose requests never overlap sends each to rank 0
  (vLLM's balancer takes the first engine on a tie) and, at a constant step, serves them as one engine: the idle
  rank records no step and delays none; given every row twice at one instant, a DP 2 group (lockstep MoE or
  independent dense ranks, asynchronous or not, under preemption) sends the first of each pair to rank 0 and the
  second to rank 1 (4 · waiting + running) and the two ranks mirror each other, request for request.

Relations tried and kept out (the relation is wrong for vLLM itself):

* a slower KV link does not make every request slower: on a loaded 1P1D fleet (`random_rows(default_rng(5), 60,
  4.0)`, 4,000-block pools, no preemption) a 2 GB/s, 2 ms link against a 10^18 B/s one ended 2 of 60 requests
  earlier, by up to 8.1 ms, and at 20 GB/s 25 of 60, by up to 0.22 ms: a request handed to the decode instance
  later can find it idle, or in a smaller and faster batch, instead of waiting for the step in flight. vLLM's
  decode engine batches the same way, so only the isolated request's shift (above) and the prefill side's
  independence are kept; the link's own model is `tests/test_link.py`'s;
* "an idle rank of a lockstep MoE group costs nothing" is one vLLM itself breaks, and kvsim keeps: when the ranks'
  synced CUDA-graph mode is not NONE (decode batches within the capture sizes), `coordinate_batch_across_dp`
  (vllm/v1/worker/dp_utils.py) pads every rank's batch to the largest, so the idle rank's dummy batch carries as
  many tokens as the busy one's and the MoE layers' all-gather dp · max(T) tokens, where kvsim's roofline takes the
  group's Σ T (`StepPlan.num_dp_group_tokens`; kvsim models no CUDA graphs, so no capture sizes to decide when).
  Only the constant-step relation (above) is kept; the padding is reported, not modelled.

Covered in earlier rounds and not repeated: TP 2 at the bare roofline against its formula, an MoE with every expert
active against the dense MLP of the same width, and a sliding window longer than every context against full
attention (round nine); the radix tree against the hash chain while nothing is evicted (round four); a tier of zero
blocks (`tests/test_offload_scenario.py`) and a tier hit's load in a hand-built engine
(`tests/test_offload_connector.py`); pipeline parallelism, which kvsim does not model; the priority victim, max over
running of (priority, arrival) (`tests/test_priority.py`, round six). The fleet's routers break a tie at a rotating
start (`kvsim.fleet.router`), not at replica 0 as vLLM's data-parallel balancer does
(`kvsim.engine.loop.least_loaded`, checked below): a documented choice for a router in front of independent
replicas, so idle fleets spread requests.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvsim
from tests.test_metamorphic2 import random_rows, traced, write_trace

SYNC = {"max_model_len": 4096, "async_scheduling": False}  # a disaggregated instance steps synchronously
NEAR_INFINITE = {"kv_link_bandwidth_bytes_per_s": 1e18, "kv_link_latency_s": 0.0}
BLOCK_BYTES = 16 * 2 * 32 * 8 * 128 * 2  # Llama-3.1-8B: 16 tokens · K and V · 32 layers · 8 KV heads · 128 · fp16


def one_p_one_d(raw, link, decode=None):
    return {**raw, "replicas": [{"count": 1, "kv_role": "kv_producer"},
                                {"count": 1, "kv_role": "kv_consumer", "engine": decode or {}}],
            "kv_transfer_config": {"kv_connector": "NixlConnector", **link}}


@pytest.mark.parametrize(("bandwidth", "latency_s"), [(3e9, 0.004), (50e9, 2e-5)])
def test_an_isolated_1p1d_request_is_the_single_engine_split_step_for_step(tmp_path, bandwidth, latency_s):
    rng = np.random.default_rng(6)
    for prompt, output in zip(rng.integers(17, 3000, 3), rng.integers(2, 30, 3), strict=True):
        path = write_trace(tmp_path / "one.jsonl", [(0, prompt, output)])
        engine = kvsim.simulate(traced(path, SYNC)).steps.duration_s.tolist()
        shorter = kvsim.simulate(traced(write_trace(tmp_path / "short.jsonl", [(0, prompt - 1, 2)]), SYNC))
        fleets = [kvsim.simulate(one_p_one_d(traced(path, SYNC), link)) for link in (
            NEAR_INFINITE, {"kv_link_bandwidth_bytes_per_s": bandwidth, "kv_link_latency_s": latency_s})]
        for fleet in fleets:
            prefill = fleet.steps[fleet.steps.replica == 0].duration_s.tolist()
            decode = fleet.steps[fleet.steps.replica == 1].duration_s.tolist()
            assert len(prefill) == 1 and len(decode) == output  # one chunk (v1's budget); the recompute + O − 1
            assert prefill + decode[1:] == engine
            assert decode[0] == shorter.steps.duration_s.iloc[-1]  # 1 token over P − 1 computed
        num_bytes = -(-prompt // 16) * BLOCK_BYTES
        shift_s = latency_s + num_bytes / bandwidth - num_bytes / 1e18
        near, slow = (fleet.requests.iloc[0] for fleet in fleets)
        for column in ("first_token_s", "finish_s"):
            assert slow[column] - near[column] == pytest.approx(shift_s, abs=1e-12)
        assert slow.first_scheduled_s == near.first_scheduled_s


def test_a_1p1d_prefill_instance_does_not_see_the_link_while_its_pool_never_binds(tmp_path):
    path = write_trace(tmp_path / "rows.jsonl", random_rows(np.random.default_rng(5), 60, 4.0))
    raw = traced(path, {**SYNC, "num_gpu_blocks_override": 4000})
    near = kvsim.simulate(one_p_one_d(raw, NEAR_INFINITE))
    slow = kvsim.simulate(one_p_one_d(raw, {"kv_link_bandwidth_bytes_per_s": 2e9, "kv_link_latency_s": 0.002}))
    assert near.replicas[0].requests.equals(slow.replicas[0].requests)
    assert near.requests.queue_s.equals(slow.requests.queue_s)
    assert not near.requests.finish_s.equals(slow.requests.finish_s)  # the decode side did feel it


@pytest.mark.parametrize(("seed", "bandwidth", "latency_s"), [(10, 5e9, 0.003), (11, 1e9, 0.0)])
def test_a_decode_side_that_never_waits_admits_at_its_next_step_boundary(tmp_path, seed, bandwidth, latency_s):
    step_s = 0.01
    path = write_trace(tmp_path / "rows.jsonl", random_rows(np.random.default_rng(seed), 80, 3.0))
    raw = traced(path, {**SYNC, "num_gpu_blocks_override": 4000, "max_num_batched_tokens": 512, "max_num_seqs": 256},
                 latency={"model": "constant", "step_s": step_s})
    fleet = kvsim.simulate(one_p_one_d(raw, {"kv_link_bandwidth_bytes_per_s": bandwidth,
                                             "kv_link_latency_s": latency_s}))
    requests, transfers = fleet.requests, fleet.tables["transfers"]
    assert transfers.request_id.tolist() == requests.request_id.tolist()
    assert fleet.steps[fleet.steps.replica == 1]["vllm:num_requests_running"].max() >= 20
    reserved_s = (transfers.start_s - transfers.handoff_s).to_numpy()
    assert (reserved_s >= 0).all() and (reserved_s < step_s).all()
    assert transfers.num_bytes.tolist() == [-(-p // 16) * BLOCK_BYTES for p in requests.prompt_tokens]
    alone_s = latency_s + transfers.num_bytes / bandwidth  # shared, a transfer takes at least that
    assert ((transfers.end_s - transfers.start_s - alone_s).to_numpy() > -1e-12).all()
    admitted_s = (requests.finish_s - requests.output_tokens * step_s).to_numpy()  # then O steps: 1 + (O − 1)
    lag_s = admitted_s - transfers.end_s.to_numpy()
    assert (lag_s > -1e-12).all() and (lag_s < step_s).all()
    np.testing.assert_allclose(requests.first_token_s, admitted_s + step_s, rtol=0, atol=1e-12)


def test_an_offload_tier_never_hit_changes_nothing_though_it_stores_every_block(tmp_path):
    rows = random_rows(np.random.default_rng(1), 60, 6.0, max_prompt=600, max_output=100)
    raw = traced(write_trace(tmp_path / "rows.jsonl", rows), {"num_gpu_blocks_override": 200, "max_num_seqs": 4})
    alone = kvsim.simulate(raw)
    tiered = kvsim.simulate({**raw, "engine": {**raw["engine"], "kv_offload": {"num_cpu_blocks": 300,
                                                                                "offload_prompt_only": False}}})
    cpu = tiered.summary["kv_offload"]["tiers"]["cpu"]
    assert alone.summary["num_preemptions"] == 0 and cpu["num_hit_blocks"] == 0
    # every full block written (decoded tokens' too: offload_prompt_only false) goes to the tier (write-through),
    # far more than the GPU pool holds: the pool
    # evicted cached blocks to reuse them, and the tier its own oldest
    assert cpu["num_stored_blocks"] > 1000 and cpu["num_evicted_blocks"] > 1000
    assert tiered.requests.equals(alone.requests)
    assert tiered.steps[alone.steps.columns].equals(alone.steps)


@pytest.mark.parametrize(("bandwidth", "tensor_parallel_size"), [(8e9, 1), (64e9, 1), (8e9, 2), (8e9, 4)])
def test_a_cpu_tier_hit_costs_exactly_its_load_over_the_link(tmp_path, bandwidth, tensor_parallel_size):
    def row(arrival_s, ids):
        return {"arrival_time_ns": int(arrival_s * 1e9), "input_toks": len(ids), "output_toks": 2, "input_tok_ids": ids}

    rows = [row(0, list(range(800))),  # 50 full blocks, written through to the tier
            row(5, list(range(10**6, 10**6 + 945))),  # 60 blocks: all 60 usable, so every block of the first goes
            row(10, list(range(800)) + list(range(2 * 10**6, 2 * 10**6 + 100)))]  # the first's 800 tokens again
    raw = traced(write_trace(tmp_path / "rows.jsonl", rows), {"max_model_len": 960,
                                                               "tensor_parallel_size": tensor_parallel_size})
    raw["latency"] = {"model": "roofline"}
    tiered = kvsim.simulate({**raw, "engine": {**raw["engine"], "num_gpu_blocks_override": 61, "kv_offload": {
        "num_cpu_blocks": 400, "bandwidth_bytes_per_s": bandwidth}}})
    roomy = kvsim.simulate({**raw, "engine": {**raw["engine"], "num_gpu_blocks_override": 400}})  # a GPU hit
    assert tiered.summary["kv_offload"]["tiers"]["cpu"]["num_hit_blocks"] == 50
    assert tiered.summary["num_prefix_cache_hit_tokens"] == 0 and roomy.summary["num_prefix_cache_hit_tokens"] == 800
    assert tiered.summary["kv_offload"]["bytes_loaded"] == 50 * BLOCK_BYTES  # every rank's shard together
    load_s = 50 * BLOCK_BYTES / tensor_parallel_size / bandwidth  # each rank its 8 / tp KV heads, on its own link
    late, early = tiered.requests.iloc[2], roomy.requests.iloc[2]
    assert late.prefix_hit_tokens == early.prefix_hit_tokens == 800
    assert late.queue_s == pytest.approx(load_s, abs=1e-12)  # vLLM stamps SCHEDULED once the KV has arrived
    assert late.ttft_s - early.ttft_s == pytest.approx(load_s, abs=1e-12)  # then the same 100-token step
    assert tiered.requests.iloc[:2].equals(roomy.requests.iloc[:2])


ROOMY_CONSTANT = {"max_model_len": 2048, "num_gpu_blocks_override": 4000, "async_scheduling": False}


def speculating(tmp_path, drafts=None, acceptance=None):
    rows = random_rows(np.random.default_rng(2), 40, 2.0, max_prompt=800, max_output=120)
    raw = traced(write_trace(tmp_path / "rows.jsonl", rows), ROOMY_CONSTANT, latency={"model": "constant", "step_s": 0.01})
    if drafts is not None:
        raw["engine"]["speculative_config"] = {"method": "ngram", "num_speculative_tokens": drafts,
                                               "acceptance_rates": acceptance}
    return kvsim.simulate(raw)


@pytest.mark.parametrize("drafts", [1, 3])
def test_speculation_that_never_accepts_is_the_synchronous_engine_without_it(tmp_path, drafts):
    plain = speculating(tmp_path)
    spec = speculating(tmp_path, drafts, 0.0)
    assert plain.summary["max_running"] >= 8
    assert spec.requests[plain.requests.columns].equals(plain.requests)
    assert spec.steps.time_s.equals(plain.steps.time_s)
    # tokens a step: every decode verifies its K drafts beside its one token; each of a request's O − 1 decodes does
    decodes = int((plain.requests.output_tokens - 1).sum())
    assert spec.summary["spec_decode"]["num_drafts"] == decodes
    assert spec.summary["spec_decode"]["num_draft_tokens"] == drafts * decodes
    assert int((spec.steps.num_batched_tokens - plain.steps.num_batched_tokens).sum()) == drafts * decodes
    assert ((spec.steps.num_batched_tokens - plain.steps.num_batched_tokens) % drafts == 0).all()


def test_full_acceptance_decodes_k_plus_1_tokens_a_step_counted_by_hand(tmp_path):
    firsts = []
    for drafts in (1, 2):
        requests = speculating(tmp_path, drafts, 1.0).requests
        steps = ((requests.finish_s - requests.first_token_s) / 0.01).round().astype(int)
        assert steps.tolist() == [-(-(o - 1) // (drafts + 1)) for o in requests.output_tokens]
        firsts.append(requests.first_token_s)
    assert firsts[0].equals(firsts[1])


def test_two_priority_classes_apart_in_time_are_fcfs(tmp_path):
    late = random_rows(np.random.default_rng(3), 30, 2.0)
    early = kvsim.simulate(traced(write_trace(tmp_path / "early.jsonl", late), {"num_gpu_blocks_override": 150}))
    start_ns = int((early.requests.finish_s.max() + 0.5) * 1e9)  # the urgent class comes after the rest ended
    rows = [(a, p, o, 5) for a, p, o in late] + \
        [(a + start_ns, p, o, 0) for a, p, o in random_rows(np.random.default_rng(4), 30, 2.0)]
    fcfs = kvsim.simulate(traced(write_trace(tmp_path / "fcfs.jsonl", [r[:3] for r in rows]),
                                 {"num_gpu_blocks_override": 150}))
    raw = traced(write_trace(tmp_path / "prio.jsonl", [{"arrival_time_ns": int(a), "input_toks": int(p),
                                                         "output_toks": int(o), "prio": c} for a, p, o, c in rows]),
                 {"num_gpu_blocks_override": 150, "scheduling_policy": "priority"})
    raw["workload"]["trace"]["priority_column"] = "prio"
    priority = kvsim.simulate(raw).requests
    assert priority.priority.tolist() == [5] * 30 + [0] * 30
    assert priority[priority.priority == 0].num_preemptions.sum() > 0
    assert priority[priority.priority == 5].num_preemptions.sum() > 0
    assert priority.drop(columns="priority").equals(fcfs.requests)


@pytest.mark.parametrize("policy", ["round_robin", "least_outstanding", "least_kv", "affinity"])
@pytest.mark.parametrize(("replicas", "each"), [(3, 4), (2, 5)])
@pytest.mark.parametrize("engine", [{}, {"async_scheduling": False}], ids=["async", "sync"])
def test_n_times_k_requests_at_one_instant_go_k_to_each_replica(tmp_path, policy, replicas, each, engine):
    rng = np.random.default_rng(replicas)
    rows = [(10**6, p, o) for p, o in zip(rng.integers(1, 500, replicas * each), rng.integers(1, 50, replicas * each),
                                         strict=True)]
    raw = traced(write_trace(tmp_path / "rows.jsonl", rows), engine, replicas=replicas, router={"policy": policy})
    served = kvsim.simulate(raw).requests.replica
    assert np.bincount(served, minlength=replicas).tolist() == [each] * replicas
    assert served.tolist() == [i % replicas for i in range(replicas * each)]  # one to each in turn, in arrival order


@pytest.mark.parametrize("policy", ["round_robin", "least_outstanding", "least_kv", "affinity"])
@pytest.mark.parametrize("engine", [{"kv_offload": {"num_cpu_blocks": 200}}, {
    "async_scheduling": False, "speculative_config": {"method": "ngram", "num_speculative_tokens": 2,
                                                      "acceptance_rates": 1.0}}], ids=["offload", "ngram"])
def test_a_fleet_given_every_row_three_times_at_once_runs_three_mirror_replicas(tmp_path, policy, engine):
    rows = [row for row in random_rows(np.random.default_rng(13), 30, 3.0) for _ in range(3)]
    raw = traced(write_trace(tmp_path / "triples.jsonl", rows), {"num_gpu_blocks_override": 150, **engine},
                 replicas=3, router={"policy": policy})
    requests = kvsim.simulate(raw).requests
    copies = [requests.iloc[k::3].reset_index(drop=True) for k in range(3)]
    assert [set(copy.replica) for copy in copies] == [{0}, {1}, {2}]
    assert requests.num_preemptions.sum() > 0
    columns = ["first_scheduled_s", "first_token_s", "finish_s", "num_preemptions", "prefix_hit_tokens"]
    assert copies[1][columns].equals(copies[0][columns]) and copies[2][columns].equals(copies[0][columns])


@pytest.mark.parametrize("policy", ["round_robin", "least_outstanding", "least_kv", "affinity"])
def test_a_prefill_pool_spreads_simultaneous_requests_as_a_fleet_does(tmp_path, policy):
    rng = np.random.default_rng(3)
    rows = [(10**6, p, o) for p, o in zip(rng.integers(1, 500, 12), rng.integers(2, 50, 12), strict=True)]
    raw = one_p_one_d(traced(write_trace(tmp_path / "rows.jsonl", rows), {}), {
        "prefill_router": {"policy": policy}, "decode_router": {"policy": policy}})
    raw["replicas"] = [{"count": 3, "kv_role": "kv_producer"}, {"count": 2, "kv_role": "kv_consumer"}]
    routes = kvsim.simulate(raw).tables["routes"]
    assert np.bincount(routes[routes.pool == "prefill"].replica).tolist() == [4, 4, 4]
    if policy == "round_robin":  # the hand-offs in turn, whenever they come
        assert np.bincount(routes[routes.pool == "decode"].replica).tolist() == [0, 0, 0, 6, 6]


def test_a_lockstep_groups_idle_rank_delays_nothing(tmp_path):
    rng = np.random.default_rng(5)
    rows = [(i * 2 * 10**9, p, o) for i, (p, o) in enumerate(zip(rng.integers(1, 1500, 8), rng.integers(1, 60, 8),
                                                                  strict=True))]
    raw = traced(write_trace(tmp_path / "rows.jsonl", rows), {}, model="qwen3-30b-a3b",
                 latency={"model": "constant", "step_s": 0.01})
    one = kvsim.simulate(raw)
    two = kvsim.simulate({**raw, "engine": {**raw["engine"], "data_parallel_size": 2}})
    assert one.requests.e2e_s.max() < 2.0  # no two requests overlap
    assert set(two.requests.dp_rank) == {0} and set(two.steps.dp_rank) == {0}
    assert two.requests.drop(columns="dp_rank").equals(one.requests)
    assert two.steps.time_s.equals(one.steps.time_s)


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "llama-3.1-8b"])  # lockstep (MoE) and independent ranks
@pytest.mark.parametrize("engine", [{}, {"async_scheduling": False}], ids=["async", "sync"])
def test_a_dp_group_given_every_request_twice_at_once_runs_two_mirror_ranks(tmp_path, model, engine):
    rows = [row for row in random_rows(np.random.default_rng(13), 30, 3.0) for _ in range(2)]
    raw = traced(write_trace(tmp_path / "pairs.jsonl", rows), {"data_parallel_size": 2, "num_gpu_blocks_override": 150,
                                                               **engine}, model=model)
    requests = kvsim.simulate(raw).requests
    first, second = (requests.iloc[k::2].reset_index(drop=True) for k in (0, 1))
    assert set(first.dp_rank) == {0} and set(second.dp_rank) == {1}  # the first on a tie, then the one not waiting
    assert requests.num_preemptions.sum() > 0
    columns = ["first_scheduled_s", "first_token_s", "finish_s", "num_preemptions", "prefix_hit_tokens"]
    assert first[columns].equals(second[columns])

