"""Metamorphic relations, fifteenth round: offload tiers, priority labels, token names and the time axis.

`test_metamorphic.py` to `test_metamorphic14.py` hold the earlier rounds (a fleet of one under every router, one
priority class is FCFS, a tier of 0 blocks or bytes is no tier, block sizes in a roomy pool, caching on with
unshared prompts, speculation that never accepts, the isolated 1P1D request, a request moved 40 s later: rounds
one to thirteen). Here, each expected value is the other run of a pair or counted by hand:

* a bigger CPU tier never lowers any request's prefix hit on a serial replay (each request alone, so the GPU pool
  sees the same operations in the same order whatever the tier holds) while every tier holds the largest store
  batch: the tier is then vLLM's LRU (`LRUOffloadingManager`), a stack algorithm, whose bigger pool holds at every
  instant what the smaller holds (inclusion), so a lookup's leading run of held blocks is no shorter;
* `offload_prompt_only: false` stores, in a tier that never evicts, the prompt's distinct full blocks (the
  prompt-only count) plus every block the reply fills, floor((P + O − 1) / 16) − floor(P / 16) per request (the
  last sampled token is never computed, so its KV never exists), counted by hand from the rows' token ids;
* a strictly increasing map of the priority values (0, 1, 2 → −7, 4, 1,000) changes nothing but the labels: the
  scheduler only compares (priority, arrival), so the waiting order and every victim are the same; the summary's
  `by_priority` section is the same under the mapped keys, for a trace column and for generated classes;
* on an unloaded engine (every request ends before the next arrives) stretching every gap by k (2 and 7) leaves
  every request's TTFT, TPOT, E2E and queue time and the multiset of step durations unchanged (to 1e-11 s), for
  v1 (asynchronous and not), v0, static batching, an offload tier, n-gram and EAGLE drafts, two DP ranks (dense
  and MoE), a round-robin fleet, 1P1D, a hybrid model, a slab allocator and the radix cache;
* every arrival moved later by 64 s (behind a one-token request at 0, since a trace counts from its first row)
  moves every instant and every step by exactly 64 s and changes no other column, where every duration is a
  multiple of 2^-12 s (a 2^-7 s constant step, arrivals on 1/64 s, a 2^33 B/s link of 2^-10 s latency moving
  2 MiB blocks): no rounding, so a test of equality, for the engines round three (1e-9 s) left out;
* EAGLE drafts never accepted (K = 1, 2, 3, asynchronous: round thirteen held n-gram's, synchronous) take the plain
  engine's steps on an unloaded engine, step for step, each decode K tokens more, every request first scheduled at
  the same instant; only the durations grow (the drafter's forward);
* every prompt token id renamed by a bijection (a shifted permutation of the vocabulary) changes nothing, byte for
  byte, under the hash chain, the radix tree, an offload tier, an affinity router, a 1P2D fleet and n = 2 samples:
  every cache and router asks only whether two blocks' tokens are equal.

Relations tried and kept out (the relation is wrong for vLLM itself):

* a bigger tier does not always hit more when a tier is smaller than one request's store batch: vLLM's
  `prepare_store` returns None (nothing stored, nothing evicted) when it cannot free enough slots without
  evicting the request's own blocks, so a small tier keeps older blocks a bigger one would have replaced. A serial
  replay of 40 requests on 8 documents of 3 to 24 blocks (the first probe's rows, seed 0, a 40-block GPU pool):
  3,232 hit tokens with a 10-block tier, 3,008 with 20, 2,960 with 30 (which, smaller than the GPU pool, holds
  only blocks the GPU still has) and 3,792 with 40. Under load (30 ms apart) the tier's hits move the timing and
  the order of admissions, and single requests hit less with a bigger tier (seed 1: 5,632 tokens with 27 blocks,
  5,440 with 30); only the serial replay is kept;
* `offload_prompt_only: false` does not always hit more: its decoded blocks evict prompt blocks a later request
  would hit (seed 0, a 40-block tier: 3,184 hit tokens against 3,792 prompt-only);
* K = 0 drafts is refused, as vLLM refuses it (`tests/test_speculative.py`), so "K = 0 is no speculation" has no
  run; EAGLE at acceptance 0 is not the engine without it in time even at a constant step: its drafter's forward
  is priced on top of the step (0.010532 s against 0.01 s a decode), as vLLM runs the draft model every step, so
  under load the batches part (kept: the schedule of an unloaded engine, above);
* two replica groups in the other order under round robin are the same fleet but for the groups' names
  (`per_replica`): round twelve's names-exchanged relation; on a loaded fleet the extra request at 0 used for
  the shift moves the routers' rotating tie-break, so the 64 s shift is kept for single engines and 1P1D only.
"""

from __future__ import annotations

import json
from itertools import pairwise

import numpy as np
import pytest

import kvsim
from tests.test_metamorphic2 import random_rows, traced, write_trace

TIMES = ["arrival_s", "first_scheduled_s", "first_token_s", "finish_s"]
XPYD = {"replicas": [{"count": 1, "kv_role": "kv_producer"}, {"count": 1, "kv_role": "kv_consumer"}],
        "kv_transfer_config": {"kv_connector": "NixlConnector", "kv_link_bandwidth_bytes_per_s": 2**33,
                               "kv_link_latency_s": 2**-10}}


def documents_rows(seed, gap_ns):
    """40 requests, each one of 8 documents (3 to 24 full blocks of token ids, Zipf-popular) and a suffix of its own
    (1 to 39 tokens), `gap_ns` apart."""
    rng = np.random.default_rng(seed)
    docs = [list(range(10**6 * (d + 1), 10**6 * (d + 1) + 16 * int(rng.integers(3, 25)))) for d in range(8)]
    rows = []
    for i in range(40):
        ids = docs[int(rng.zipf(1.5)) % 8] + list(range(10**8 + i * 1000, 10**8 + i * 1000 + int(rng.integers(1, 40))))
        rows.append({"arrival_time_ns": i * gap_ns, "input_toks": len(ids), "output_toks": int(rng.integers(1, 40)),
                     "input_tok_ids": ids})
    return rows


def tiered(path, num_cpu_blocks, prompt_only=True):
    return kvsim.simulate(traced(path, {"num_gpu_blocks_override": 40, "max_model_len": 600, "kv_offload": {
        "num_cpu_blocks": num_cpu_blocks, "offload_prompt_only": prompt_only}}))


@pytest.mark.parametrize("seed", [0, 1, 4])
def test_a_bigger_cpu_tier_never_lowers_a_serial_replays_hits_request_by_request(tmp_path, seed):
    rows = documents_rows(seed, 2 * 10**9)
    assert max(r["input_toks"] // 16 for r in rows) <= 26  # every tier below holds the largest store batch
    path = write_trace(tmp_path / "docs.jsonl", rows)
    runs = [tiered(path, size) for size in (27, 40, 60, 100)]
    assert runs[0].requests.e2e_s.max() < 2.0  # serial: each request alone
    for smaller, bigger in pairwise(runs):
        assert bigger.summary["kv_offload"]["tiers"]["cpu"]["num_refused_stores"] == 0
        assert (bigger.requests.prefix_hit_tokens >= smaller.requests.prefix_hit_tokens).all()
    assert runs[-1].requests.prefix_hit_tokens.sum() > runs[0].requests.prefix_hit_tokens.sum()  # not vacuous


def test_offload_prompt_only_false_stores_the_replies_full_blocks_too_counted_by_hand(tmp_path):
    rows = documents_rows(0, 2 * 10**9)
    path = write_trace(tmp_path / "docs.jsonl", rows)
    prompt_blocks = {tuple(r["input_tok_ids"][:16 * (k + 1)]) for r in rows for k in range(r["input_toks"] // 16)}
    reply_blocks = sum((r["input_toks"] + r["output_toks"] - 1) // 16 - r["input_toks"] // 16 for r in rows)
    assert len(prompt_blocks) < sum(r["input_toks"] // 16 for r in rows) and reply_blocks > 0  # shared, and replies
    stored = {}
    for prompt_only in (True, False):
        cpu = tiered(path, 400, prompt_only).summary["kv_offload"]["tiers"]["cpu"]
        assert cpu["num_evicted_blocks"] == 0
        stored[prompt_only] = cpu["num_stored_blocks"]
    assert stored == {True: len(prompt_blocks), False: len(prompt_blocks) + reply_blocks}


PRIORITY_ENGINES = {
    "v1": ({}, {}),
    "offload": ({"kv_offload": {"num_cpu_blocks": 300}}, {}),
    "dp2": ({"data_parallel_size": 2}, {}),
    "xpyd": ({}, XPYD),
}
RELABEL = {0: -7, 1: 4, 2: 1000}


def by_priority_split(summary):
    summary = json.loads(json.dumps(summary))
    return summary.pop("by_priority"), summary


@pytest.mark.parametrize("name", PRIORITY_ENGINES)
def test_a_monotone_relabelling_of_trace_priorities_changes_nothing_but_the_labels(tmp_path, name):
    rows = random_rows(np.random.default_rng(3), 60, 4.0)
    classes = np.random.default_rng(9).integers(0, 3, len(rows))
    engine, top = PRIORITY_ENGINES[name]
    runs = []
    for label, mapping in (("plain", {c: c for c in RELABEL}), ("mapped", RELABEL)):
        path = write_trace(tmp_path / f"{label}.jsonl", [
            {"arrival_time_ns": int(a), "input_toks": int(p), "output_toks": int(o), "prio": mapping[int(c)]}
            for (a, p, o), c in zip(rows, classes, strict=True)])
        raw = traced(path, {"num_gpu_blocks_override": 150, "scheduling_policy": "priority", **engine}, **top)
        raw["workload"]["trace"]["priority_column"] = "prio"
        runs.append(kvsim.simulate(raw))
    plain, mapped = runs
    assert plain.requests.num_preemptions.sum() > 0
    assert mapped.requests.priority.tolist() == [RELABEL[c] for c in plain.requests.priority]
    assert mapped.requests.drop(columns="priority").equals(plain.requests.drop(columns="priority"))
    assert mapped.steps.equals(plain.steps)
    (plain_classes, plain_rest), (mapped_classes, mapped_rest) = map(by_priority_split, (plain.summary, mapped.summary))
    assert mapped_rest == plain_rest
    assert mapped_classes == {str(RELABEL[int(k)]): v for k, v in plain_classes.items()}


def test_a_monotone_relabelling_of_generated_classes_changes_nothing_but_the_labels():
    def run(low, high):
        return kvsim.simulate({
            "model": "llama-3.1-8b", "gpu": "h100-80gb", "seed": 2,
            "engine": {"max_model_len": 2048, "num_gpu_blocks_override": 150, "scheduling_policy": "priority"},
            "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 15.0},
                         "prompt_len": {"dist": "lognormal", "mean": 300, "p99": 1500},
                         "output_len": {"dist": "lognormal", "mean": 200, "p99": 800},
                         "priority": {"classes": [{"name": "chat", "priority": low, "weight": 1},
                                                  {"name": "batch", "priority": high, "weight": 2}]}}})

    plain, mapped = run(0, 2), run(-3, 40)
    assert plain.requests.num_preemptions.sum() > 0 and set(plain.requests.priority) == {0, 2}
    assert mapped.requests.priority.tolist() == [{0: -3, 2: 40}[p] for p in plain.requests.priority]
    assert mapped.requests.drop(columns="priority").equals(plain.requests.drop(columns="priority"))
    (plain_classes, plain_rest), (mapped_classes, mapped_rest) = map(by_priority_split, (plain.summary, mapped.summary))
    assert mapped_rest == plain_rest
    assert mapped_classes == {{"0": "-3", "2": "40"}[k]: v for k, v in plain_classes.items()}


UNLOADED_ENGINES = {
    "v1": ({}, {}), "v1-sync": ({"async_scheduling": False}, {}), "v0": ({"scheduler": "v0"}, {}),
    "static": ({"scheduler": "static"}, {}), "offload": ({"kv_offload": {"num_cpu_blocks": 300}}, {}),
    "ngram": ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rates": 0.6}}, {}),
    "eagle": ({"speculative_config": {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rates": 0.6}}, {}),
    "dp2": ({"data_parallel_size": 2}, {}), "dp2-moe": ({"data_parallel_size": 2}, {"model": "qwen3-30b-a3b"}),
    "fleet": ({}, {"replicas": 3, "router": {"policy": "round_robin"}}),
    "xpyd": ({}, {**XPYD, "kv_transfer_config": {"kv_connector": "NixlConnector",
                                                 "kv_link_bandwidth_bytes_per_s": 5e9, "kv_link_latency_s": 0.001}}),
    "hybrid": ({}, {"model": "gpt-oss-20b"}), "slab": ({"allocator": "slab-max"}, {}),
    "radix": ({"prefix_cache": "radix"}, {}),
}


@pytest.mark.parametrize("name", UNLOADED_ENGINES)
def test_an_unloaded_engine_serves_each_request_as_alone_whatever_the_gaps(tmp_path, name):
    rng = np.random.default_rng(4)
    gaps_ns = rng.integers(2 * 10**9, 5 * 10**9, 12)
    gaps_ns[0] = 0
    rows = list(zip(np.cumsum(gaps_ns), rng.integers(1, 1900, 12), rng.integers(1, 120, 12), strict=True))
    engine, top = UNLOADED_ENGINES[name]
    runs = []
    for k in (1, 2, 7):
        raw = traced(write_trace(tmp_path / f"x{k}.jsonl", [(a * k, p, o) for a, p, o in rows]),
                     {"num_gpu_blocks_override": 400, **engine}, **top)
        raw["latency"] = {"model": "roofline"}
        runs.append(kvsim.simulate(raw))
    base = runs[0]
    assert base.requests.e2e_s.max() < 2.0  # each request ends before the next arrives
    counts = [c for c in base.requests.columns if base.requests[c].dtype.kind in "iub"]
    for stretched in runs[1:]:
        for column in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
            np.testing.assert_allclose(stretched.requests[column], base.requests[column], rtol=0, atol=1e-11)
        assert stretched.requests[counts].equals(base.requests[counts])
        np.testing.assert_allclose(np.sort(stretched.steps.duration_s), np.sort(base.steps.duration_s), rtol=0,
                                   atol=1e-11)


SHIFTED_ENGINES = {
    "v1-sync": ({"async_scheduling": False}, {}),
    "static": ({"scheduler": "static"}, {}),
    "priority": ({"scheduling_policy": "priority"}, {}),
    "ngram": ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rates": 0.6}}, {}),
    "xpyd": ({}, XPYD),
    "hybrid": ({"num_gpu_blocks_override": 300}, {"model": "gpt-oss-20b"}),  # 150 hold no 2,048-token request
    "slab": ({"allocator": "slab-pow2"}, {}),
}


@pytest.mark.parametrize("name", SHIFTED_ENGINES)
def test_every_arrival_moved_later_by_a_dyadic_constant_moves_every_instant_exactly(tmp_path, name):
    rng = np.random.default_rng(7)
    arrivals_ns = np.sort(rng.integers(0, 5 * 64, 40)) * 15_625_000  # multiples of 1/64 s
    arrivals_ns[0] = 0
    rows = list(zip(arrivals_ns, rng.integers(1, 1200, 40), rng.integers(1, 300, 40), strict=True))
    engine, top = SHIFTED_ENGINES[name]

    def run(trace_rows, file):
        raw = traced(write_trace(tmp_path / file, trace_rows), {"num_gpu_blocks_override": 150, **engine}, **top)
        raw["latency"] = {"model": "constant", "step_s": 2**-7}
        return kvsim.simulate(raw)

    plain = run(rows, "plain.jsonl")
    later = run([(0, 16, 1)] + [(a + 64 * 10**9, p, o) for a, p, o in rows], "later.jsonl")  # one token at 0
    assert name in ("static", "slab") or plain.requests.num_preemptions.sum() > 0
    moved = later.requests.iloc[1:].reset_index(drop=True)
    assert (moved.request_id - 1).equals(plain.requests.request_id)
    for column in TIMES:
        assert (moved[column] - 64).equals(plain.requests[column]), column
    rest = [c for c in plain.requests.columns if c not in TIMES and c != "request_id"]
    assert moved[rest].equals(plain.requests[rest])
    steps = later.steps[later.steps.time_s >= 64].reset_index(drop=True)
    assert (steps.time_s - 64).equals(plain.steps.time_s)
    assert steps.drop(columns="time_s").equals(plain.steps.drop(columns="time_s"))


@pytest.mark.parametrize(("method", "drafts"), [("eagle", 1), ("eagle", 3), ("eagle3", 2)])
def test_eagle_that_never_accepts_takes_the_plain_engines_steps_with_k_more_tokens_a_decode(tmp_path, method, drafts):
    """Round thirteen's "never accepts" holds n-gram drafts on the synchronous engine at a constant step; EAGLE
    runs asynchronously (vLLM's default) and its drafter's forward is priced on top of each step, so only the
    schedule is the plain engine's: on an unloaded engine, step for step, each decode verifying its K drafts
    beside its token, every request first scheduled at the same instant."""
    rng = np.random.default_rng(4)
    gaps_ns = rng.integers(2 * 10**9, 5 * 10**9, 12)
    gaps_ns[0] = 0
    path = write_trace(tmp_path / "rows.jsonl", list(zip(np.cumsum(gaps_ns), rng.integers(1, 1900, 12),
                                                            rng.integers(1, 120, 12), strict=True)))
    plain = kvsim.simulate(traced(path, {"num_gpu_blocks_override": 400}))
    spec = kvsim.simulate(traced(path, {"num_gpu_blocks_override": 400, "speculative_config": {
        "method": method, "num_speculative_tokens": drafts, "acceptance_rates": 0.0}}))
    assert plain.requests.e2e_s.max() < 2.0
    assert len(spec.steps) == len(plain.steps)
    assert (spec.steps.num_batched_tokens - plain.steps.num_batched_tokens).equals(drafts * plain.steps.num_decode_seqs)
    assert spec.requests.first_scheduled_s.equals(plain.requests.first_scheduled_s)
    assert (spec.steps.duration_s > plain.steps.duration_s).all()  # the drafter's forward, every step
    assert spec.summary["spec_decode"]["num_draft_tokens"] == drafts * int((plain.requests.output_tokens - 1).sum())


RENAMED_ENGINES = {
    "v1": ({}, {}),
    "radix": ({"prefix_cache": "radix"}, {}),
    "offload": ({"kv_offload": {"num_cpu_blocks": 100}}, {}),
    "affinity": ({}, {"replicas": 3, "router": {"policy": "affinity"}}),
    "xpyd": ({}, {**XPYD, "replicas": [{"count": 1, "kv_role": "kv_producer"}, {"count": 2, "kv_role": "kv_consumer"}]}),
    "n2": ({}, {}),
}


@pytest.mark.parametrize("name", RENAMED_ENGINES)
def test_token_ids_renamed_one_to_one_change_nothing(tmp_path, name):
    """A prefix cache, a radix tree, an offload tier and an affinity router ask only whether two blocks' tokens are
    equal (vLLM's hash of the block's ids chains equal prefixes to equal hashes), so renaming every token id by a
    bijection (a permutation of a 32,000-id vocabulary, shifted by 5) gives the same run, byte for byte. Prompts of
    6 shared documents (20 to 399 tokens) and a random tail each, a 200-block pool that preempts."""
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 32_000, int(rng.integers(20, 400))).tolist() for _ in range(6)]
    arrivals_ns = np.cumsum(rng.exponential(0.08, 60) * 1e9).astype(np.int64)
    rows = []
    for arrival_ns in arrivals_ns:
        ids = docs[int(rng.integers(0, 6))] + rng.integers(0, 32_000, int(rng.integers(1, 300))).tolist()
        rows.append({"arrival_time_ns": int(arrival_ns), "input_toks": len(ids), "output_toks": int(rng.integers(1, 200)),
                     "input_tok_ids": ids})
    renamed = rng.permutation(32_000) + 5
    engine, top = RENAMED_ENGINES[name]
    runs = []
    for file, trace_rows in (("plain.jsonl", rows), ("renamed.jsonl", [
            {**row, "input_tok_ids": renamed[row["input_tok_ids"]].tolist()} for row in rows])):
        raw = traced(write_trace(tmp_path / file, trace_rows), {"num_gpu_blocks_override": 200, **engine}, **top)
        if name == "n2":
            raw["workload"]["n"] = 2  # each sample's reply blocks named by its own child id
        runs.append(kvsim.simulate(raw))
    plain, other = runs
    assert plain.summary["num_prefix_cache_hit_tokens"] > 5000
    assert name in ("affinity", "xpyd") or plain.summary["num_preemptions"] > 0
    assert other.requests.equals(plain.requests)
    assert other.steps.equals(plain.steps)
    assert json.dumps(other.summary) == json.dumps(plain.summary)
