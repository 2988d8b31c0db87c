"""Speculative decoding in the v1 scheduler: steps, held slots and capacity worked out by hand."""

import math

import pytest

import kvsim
from kvsim.kv import PagedAllocator
from kvsim.latency.speculative import SpeculativeLatency
from kvsim.latency.step_plan import StepPlan
from kvsim.model.config import load_model
from kvsim.model.drafter import eagle_head
from kvsim.model.errors import KvsimError
from kvsim.model.speculative_config import SpeculativeConfig
from kvsim.sched import SchedulerLimits, make_scheduler
from kvsim.sched.speculative import make_speculation
from tests.conftest import make_request


def world(method, num_blocks, block_size, k=3, length=3.0, max_num_seqs=16, budget=256):
    """K = 3 drafts, vLLM's synthetic sampler with length 3: exactly 2 drafts accepted every step."""
    config = SpeculativeConfig(method=method, num_speculative_tokens=k, synthetic_acceptance_length=length)
    alloc = PagedAllocator(num_blocks, block_size, enable_caching=False)
    return make_scheduler("v1", alloc, SchedulerLimits(max_num_seqs, budget, 512),
                          speculation=make_speculation(config))


def run_steps(sched, now=0.0):
    """Step until idle; returns (tokens scheduled per step, blocks held by sequence 0 after each step)."""
    steps, held = [], []
    while sched.has_work:
        plan = sched.schedule(now)
        steps.append([n for _, n in plan.scheduled])
        now += 1.0
        sched.complete(plan, now)
        sched.alloc.check_invariants()
        seq = sched.alloc.seqs.get(0)
        held.append(None if seq is None else (len(seq.block_table), seq.num_tokens))
    return steps, held


def test_k3_fixed_acceptance_2_finishes_in_ceil_output_over_3_steps_holding_the_slots_worked_out():
    # prompt 5, output 10, blocks of 4 tokens, n-gram (no lookahead). Step 1 prefills 5 tokens and samples
    # token 1. Each later step verifies the last token + 3 drafts (4 tokens), accepts 2, emits 3:
    # outputs 1 -> 4 -> 7 -> 10, so 1 + ceil(9 / 3) = 4 steps = ceil(10 / 3).
    # Slots: step 2 holds past 5 + 4 verified = 9 slots -> 3 blocks, writes 5 + 3 = 8 (slot 8: a rejected draft);
    # step 3 holds 8 + 4 = 12 -> 3 blocks, writes 11; step 4 would hold 15 -> 4 blocks, and finishes.
    sched = world("ngram", num_blocks=11, block_size=4)
    sched.add(make_request(0, 0.0, 5, 10))
    steps, held = run_steps(sched)
    assert steps == [[5], [4], [4], [4]] and len(steps) == math.ceil(10 / 3)
    assert held == [(2, 5), (3, 8), (3, 11), None]
    spec = sched.speculation
    assert (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens) == (3, 9, 6)
    record = sched.records.columns()
    assert record["output_tokens"][0] == 10


def test_eagle_lookahead_holds_k_more_slots():
    # EAGLE reserves num_lookahead_tokens = K = 3 more: step 2 holds 5 + 4 + 3 = 12 -> 3 blocks,
    # step 3 holds 8 + 7 = 15 -> 4 blocks (written 11), step 4 would hold 18 and finishes.
    sched = world("eagle", num_blocks=11, block_size=4)
    sched.add(make_request(0, 0.0, 5, 10))
    _, held = run_steps(sched)
    assert held == [(2, 5), (3, 8), (4, 11), None]


def test_eagle_lookahead_is_held_by_a_running_prefill_chunk_not_by_an_admission():
    # vLLM's scheduler passes num_lookahead_tokens = K = 3 to allocate_slots for every running request, a
    # prefill chunk included, and 0 for a request it admits from the queue (scheduler.py). Prompt 10, blocks
    # of 4, a 4-token budget: step 1 admits a 4-token chunk (4 slots -> 1 block); step 2 computes the next 4
    # and holds 4 + 4 + 3 = 11 slots -> 3 blocks; step 3 the last 2, holding 8 + 2 + 3 = 13 -> 4 blocks, and
    # samples token 1; step 4 verifies it + 3 drafts (holding 10 + 4 + 3 = 17) and emits 3: output 4, done.
    config = SpeculativeConfig(method="eagle", num_speculative_tokens=3, synthetic_acceptance_length=3.0)
    sched = make_scheduler("v1", PagedAllocator(7, 4, enable_caching=False), SchedulerLimits(16, 4, 512),
                           speculation=make_speculation(config))
    sched.add(make_request(0, 0.0, 10, 4))
    steps, held = run_steps(sched)
    assert steps == [[4], [4], [2], [4]]
    assert held == [(1, 4), (3, 8), (4, 10), None]


def test_an_output_not_a_multiple_finishes_one_step_earlier_and_caps_the_last_step():
    # output 9: tokens 1 -> 4 -> 7 -> 9 (the last step emits only the 2 still needed): 1 + ceil(8 / 3) = 4
    sched = world("ngram", num_blocks=11, block_size=4)
    sched.add(make_request(0, 0.0, 5, 9))
    steps, _ = run_steps(sched)
    assert len(steps) == 1 + math.ceil((9 - 1) / 3)
    assert sched.speculation.num_accepted_tokens == 2 + 2 + 2


@pytest.mark.parametrize(("method", "expected"), [(None, 6), ("ngram", 6), ("eagle", 4)])
def test_kv_reserved_for_drafts_cuts_the_sequences_a_pool_fits(method, expected):
    # 12 usable blocks of 16. Six requests of prompt 28, output 3, all admitted (2 blocks each: prompts are
    # admitted without lookahead, as vLLM's scheduler does for a fresh prefill). At the first decode:
    #   no speculation: 29 slots -> 2 blocks each: all 6 keep running;
    #   n-gram K = 3:   28 + 4 verified = 32 slots -> 2 blocks: still 6;
    #   EAGLE K = 3:    28 + 4 + 3 lookahead = 35 slots -> 3 blocks: floor(12 / 3) = 4 run, 2 are preempted.
    if method is None:
        alloc = PagedAllocator(13, 16, enable_caching=False)
        sched = make_scheduler("v1", alloc, SchedulerLimits(16, 256, 512))
    else:
        sched = world(method, num_blocks=13, block_size=16)
    for rid in range(6):
        sched.add(make_request(rid, 0.0, 28, 3))
    plan = sched.schedule(0.0)
    assert len(plan.scheduled) == 6 and sched.alloc.pool.num_free_blocks == 0
    sched.complete(plan, 1.0)
    plan = sched.schedule(1.0)
    assert len(sched.running) == expected == 12 // math.ceil({None: 29, "ngram": 32, "eagle": 35}[method] / 16)
    assert len(plan.preempted) == 6 - expected
    sched.complete(plan, 2.0)
    sched.alloc.check_invariants()


def test_drafter_cost_is_k_passes_of_the_head_or_draft_model_and_nothing_for_ngram():
    class Fixed:
        name = "fixed"
        cudagraph_padding = None

        def step_time(self, plan):
            return 1.0 + plan.num_decode_seqs

    plan = StepPlan()
    plan.add_verify(4, 116, num_seqs=2)  # two sequences verifying 1 + 3 tokens
    assert SpeculativeLatency(Fixed(), None, 3, "ngram").step_time(plan) == 1.0
    # the target's verify chunks and the first pass: no one-token decode; the K − 1 passes: 2 decodes each
    assert SpeculativeLatency(Fixed(), Fixed(), 3, "eagle").step_time(plan) == 1.0 + 1.0 + 2 * (1.0 + 2)
    assert SpeculativeLatency(Fixed(), Fixed(), 3, "draft_model", appends_next_token=True).step_time(plan) == 8.0
    head = eagle_head(load_model("llama-3.1-8b"))
    assert head.num_layers == 1 and head.hidden_size == 4096 and head.vocab_size == 128256


def test_speculation_end_to_end_is_deterministic_and_reports_vllm_spec_metrics():
    config = {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rates": [0.9, 0.8, 0.7]}
    first = kvsim.simulate(None, check=True, workload__num_requests=30, engine__speculative_config=config)
    again = kvsim.simulate(None, workload__num_requests=30, engine__speculative_config=config)
    spec = first.summary["spec_decode"]
    assert spec == again.summary["spec_decode"] and first.summary["tpot_s"] == again.summary["tpot_s"]
    # 1 + 0.9 + 0.9·0.8 + 0.9·0.8·0.7 = 3.124 tokens a step in expectation
    assert spec["mean_acceptance_length"] == pytest.approx(3.124, abs=0.05)
    assert spec["num_accepted_tokens"] <= spec["num_draft_tokens"] <= 3 * spec["num_drafts"]
    assert first.summary["latency_model"] == "roofline+eagle"
    plain = kvsim.simulate(None, workload__num_requests=30).summary
    assert first.summary["tpot_s"]["mean"] < plain["tpot_s"]["mean"]


def test_bad_speculation_setups_are_one_line():
    config = {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rates": 0.5}
    with pytest.raises(KvsimError, match="speculates for single sequences"):
        kvsim.simulate(None, workload__beam_width=2, engine__speculative_config=config)
    with pytest.raises(KvsimError, match="needs the paged allocator"):
        kvsim.simulate(None, engine__allocator="slab-max", engine__speculative_config=config)


def test_cli_takes_vllms_flags_and_refuses_bad_values_in_one_line(tmp_path):
    import json

    from typer.testing import CliRunner

    from kvsim.cli import app

    runner = CliRunner()
    out = tmp_path / "ok"
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 2, "synthetic_acceptance_length": 3})
    result = runner.invoke(app, ["run", "--set", "workload.num_requests=10", "--speculative-config", spec,
                                 "--scheduling-policy", "priority", "-o", str(out), "--format", "json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["spec_decode"]["mean_acceptance_length"] == 3.0
    for bad, needle in [('{"method": "ngram", "num_speculative_tokens": 0, "acceptance_rates": 0.5}',
                         "engine.speculative_config.num_speculative_tokens=0"),
                        ('{"method": "medusa", "num_speculative_tokens": 2, "acceptance_rates": 0.5}',
                         "engine.speculative_config.method='medusa'"),
                        ('{"method": "ngram", "num_speculative_tokens": 2, "acceptance_rates": 1.2}',
                         "acceptance_rates=1.2")]:
        target = tmp_path / "bad"
        result = runner.invoke(app, ["run", "--speculative-config", bad, "-o", str(target)])
        assert result.exit_code == 2 and needle in result.stderr, result.output
        assert len(result.stderr.strip().splitlines()) == 1 and not target.exists()
    result = runner.invoke(app, ["run", "--scheduling-policy", "sjf", "-o", str(tmp_path / "bad2")])
    assert result.exit_code == 2 and "engine.scheduling_policy='sjf'" in result.stderr


def test_spec_and_priority_summary_keys_are_documented():
    from tests.test_summary_keys import documented_names

    mix = {"classes": [{"name": "a", "priority": 0, "weight": 1}, {"name": "b", "priority": 1, "weight": 1}]}
    config = {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rates": 0.5}
    summary = kvsim.simulate(None, workload__num_requests=20, workload__priority=mix,
                             engine__scheduling_policy="priority", engine__speculative_config=config).summary
    assert {"spec_decode", "by_priority"} <= set(summary)
    assert set(summary) - documented_names() == set()


@pytest.mark.parametrize(("method", "hit_tokens"), [("ngram", 12), ("draft_model", 12), ("eagle", 8), ("eagle3", 8)])
def test_eagle_prefix_hit_gives_back_its_last_block(method, hit_tokens):
    # vLLM's FullAttentionManager.find_longest_cache_hit drops the last hit block when use_eagle (EAGLE's
    # drafter needs that block's hidden states again). Blocks of 4, caching on; prompts of 13 tokens, a
    # shared 12-token prefix (3 full blocks). A (output 1) prefills 13 tokens in step 1, its 3 prefix blocks
    # cached, and finishes. B then looks up at most (13 - 1) // 4 = 3 blocks: all 3 hit (12 tokens); with
    # EAGLE the third is given back: 8 hit tokens, and B's first step computes 13 - 8 = 5 tokens, not 1.
    kwargs = {"model": "llama-3.1-8b"} if method == "draft_model" else {}
    config = SpeculativeConfig(method=method, num_speculative_tokens=3, synthetic_acceptance_length=3.0, **kwargs)
    alloc = PagedAllocator(11, 4, enable_caching=True)
    sched = make_scheduler("v1", alloc, SchedulerLimits(16, 256, 512), speculation=make_speculation(config))
    sched.add(make_request(0, 0.0, 13, 1, prefix=12))
    plan = sched.schedule(0.0)
    assert [n for _, n in plan.scheduled] == [13]
    sched.complete(plan, 1.0)
    assert not sched.running
    sched.add(make_request(1, 1.0, 13, 1, prefix=12))
    plan = sched.schedule(1.0)
    assert [n for _, n in plan.scheduled] == [13 - hit_tokens]
    stats = sched.prefix_stats
    assert (stats.num_query_tokens, stats.num_hit_tokens) == (26, hit_tokens)
    alloc.check_invariants()


def test_drafts_stop_one_position_short_of_max_model_len():
    # vLLM's scheduler caps a running request's tokens at max_model_len - 1 - num_computed_tokens (the last
    # input position stays below max_model_len - 1), so a verify step after `past` computed tokens holds at
    # most max_model_len - 2 - past drafts. max_model_len 16; prompt 5 + output 11 = 16; n-gram K = 3, 2 accepted.
    # Step 1 prefills 5 (output 1, past 5); steps 2-4 verify 1 + 3 and emit 3 (outputs 4, 7, 10; past 8, 11, 14);
    # step 5: min(3, 16 - 2 - 14) = 0 drafts: it computes 1 token and emits the 11th. Drafts: 3 steps of 3.
    config = SpeculativeConfig(method="ngram", num_speculative_tokens=3, synthetic_acceptance_length=3.0)
    alloc = PagedAllocator(11, 4, enable_caching=False)
    sched = make_scheduler("v1", alloc, SchedulerLimits(16, 256, 16), speculation=make_speculation(config))
    sched.add(make_request(0, 0.0, 5, 11))
    steps, _ = run_steps(sched)
    assert steps == [[5], [4], [4], [4], [1]]
    spec = sched.speculation
    assert (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens) == (3, 9, 6)


def test_a_prefill_chunk_ending_one_token_short_verifies_no_drafts_and_the_next_step_samples_the_first_token():
    # vLLM drops the drafts proposed after a prefill chunk (scheduler.py, update_draft_token_ids: "Ignore draft
    # tokens for prefill chunks"), so a request has drafts to verify only after a step that sampled. Prompt 9,
    # a 4-token budget, n-gram K = 3 accepting 2: steps 1-2 compute chunks of 4 (past 8, one prompt token left,
    # nothing sampled); step 3 computes that token alone and samples token 1 at t = 3 (the first token); steps
    # 4-6 verify 1 + 3 tokens and emit 3 each: outputs 4, 7, 10. Before, step 3 took the chunk's end for a
    # decode and verified 3 drafts no drafter had proposed: the request finished with no first token (NaN TTFT).
    sched = world("ngram", num_blocks=11, block_size=4, budget=4)
    sched.add(make_request(0, 0.0, 9, 10))
    steps, _ = run_steps(sched)
    assert steps == [[4], [4], [1], [4], [4], [4]]
    record = sched.records.columns()
    assert record["first_token_s"][0] == 3.0 and record["finish_s"][0] == 6.0 and record["output_tokens"][0] == 10
    spec = sched.speculation
    assert (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens) == (3, 9, 6)


def test_eagle_drafts_over_every_scheduled_token_then_k_minus_1_passes_over_every_sequence():
    """vLLM's `EagleProposer.propose` (vllm/v1/spec_decode/eagle.py): a first pass over all the step's tokens
    (`input_ids[:num_scheduled_tokens]`) with a logits row per request, then K − 1 one-token passes over
    every request (`batch_size`), `seq_lens` one longer each pass. One step, K = 3: a prefill chunk of 100
    tokens after 50 cached, and two sequences verifying 1 + 3 tokens after 196 and 296."""
    seen = []

    class Recording:
        name = "recording"
        cudagraph_padding = None

        def step_time(self, plan):
            seen.append((plan.num_tokens, plan.num_seqs, plan.num_decode_seqs, plan.num_logits_rows,
                         plan.sum_context_tokens, plan.attention_work))
            return 1.0

    plan = StepPlan()
    plan.add(100, 50, 1, logits_row=False)
    plan.add_verify(4, 196)
    plan.add_verify(4, 296)
    spec = SpeculativeLatency(Recording(), Recording(), 3, "eagle")
    assert spec.step_time(plan) == 1.0 + 3 * 1.0
    work = 100 * (50 + 101 / 2) + 4 * (196 + 5 / 2) + 4 * (296 + 5 / 2)  # causal pairs: 10,050 + 794 + 1,194
    assert seen[1:] == [(108, 3, 0, 3, 150 + 200 + 300, work),  # contexts 150, 200 and 300 after the step
                        (3, 3, 3, 3, 653, 653.0), (3, 3, 3, 3, 656, 656.0)]
    seen.clear()
    prefill_only = StepPlan()
    prefill_only.add(64, 0, 2, logits_row=True)  # no verifying sequence: the head still writes the chunks' KV
    assert spec.step_time(prefill_only) == 4.0 and seen[1][:4] == (128, 2, 0, 2)
    swap_only = StepPlan(swap_out_bytes=1)
    assert spec.step_time(swap_only) == 1.0  # nothing scheduled: no pass


def test_a_draft_model_appends_each_sequences_next_token_to_its_first_pass_and_eagle_does_not():
    from kvsim.model.config import load_gpu
    from kvsim.model.engine_config import make_engine
    from kvsim.planning.cost import closed_form_output_rate

    for method, appends in (("eagle", False), ("eagle3", False), ("draft_model", True)):
        config = {"method": method, "num_speculative_tokens": 2, "acceptance_rates": [0.5, 0.5]}
        if method == "draft_model":
            config["model"] = "llama-3.1-8b"  # a draft of the target's vocabulary, as vLLM requires
        rate = closed_form_output_rate(load_model("llama-3.1-8b"), load_gpu("h100-80gb"),
                                       make_engine(speculative_config=config))
        assert rate.args[0].appends_next_token is appends


def test_a_draft_model_drafts_over_every_scheduled_token_plus_each_next_token_then_k_minus_1_passes():
    """vLLM's `DraftModelProposer` (vllm/v1/spec_decode/draft_model.py) is a `SpecDecodeBaseProposer` fed as
    EAGLE is (`input_ids[:num_scheduled_tokens]`), whose `set_inputs_first_pass` merges each request's next
    token after its scheduled ones (`num_tokens = target_token_ids.shape[0] + batch_size`) and extends every
    query and `seq_lens` by one (`extend_all_queries_by_1`); the K − 1 passes after it add one to `seq_lens`
    each. Before, kvsim priced K one-token passes over the verifying sequences only: no pass over the prefill
    chunk's tokens (whose KV the draft model writes) and none for a step of prefill chunks alone. The step of
    the EAGLE test above, K = 3: a chunk of 100 after 50 cached, two verifies of 1 + 3 after 196 and 296."""
    seen = []

    class Recording:
        name = "recording"
        cudagraph_padding = None

        def step_time(self, plan):
            seen.append((plan.num_tokens, plan.num_seqs, plan.num_decode_seqs, plan.num_logits_rows,
                         plan.sum_context_tokens, plan.max_context_tokens, plan.attention_work))
            return 1.0

    plan = StepPlan()
    plan.add(100, 50, 1, logits_row=False)
    plan.add_verify(4, 196)
    plan.add_verify(4, 296)
    spec = SpeculativeLatency(Recording(), Recording(), 3, "draft_model", appends_next_token=True)
    assert spec.step_time(plan) == 1.0 + 3 * 1.0
    # causal pairs of 101 tokens after 50, 5 after 196, 5 after 296: n · (past + (n + 1) / 2) each
    work = 101 * (50 + 102 / 2) + 5 * (196 + 6 / 2) + 5 * (296 + 6 / 2)  # 10,201 + 995 + 1,495
    assert work == 12_691
    assert seen[1:] == [(111, 3, 0, 3, 151 + 201 + 301, 301, work),  # 108 + 3 tokens, every sequence a chunk
                        (3, 3, 3, 3, 152 + 202 + 302, 302, 656.0), (3, 3, 3, 3, 659, 303, 659.0)]
    seen.clear()
    prefill_only = StepPlan()
    prefill_only.add(64, 0, 2, logits_row=True)  # no verifying sequence: the draft model still runs
    assert spec.step_time(prefill_only) == 4.0 and seen[1][:4] == (130, 2, 0, 2)


def test_an_ngram_runs_acceptance_describes_every_decode_step_not_vllms_drafting_ones():
    """vLLM's n-gram drafter proposes nothing where the context has no match, and its counters see only the steps
    that drafted. A run (by hand) of one request, 271 output tokens, K = 3: its first token from the prefill, then
    90 decode steps, 60 with a match whose 3 drafts are all accepted (4 tokens each) and 30 without (1 token each):
    240 + 30 = 270 tokens. vLLM reports num_drafts 60, num_draft_tokens 180, accepted 180: an acceptance rate of
    1.0 and a mean acceptance length of 1 + 180 / 60 = 4.0. kvsim drafts K at every decode step, so given 4.0 it
    decodes the 270 tokens in ceil(270 / 4) = 68 steps; given docs/policies.md's (G − R) / (G − R − A) =
    (271 − 1) / (271 − 1 − 180) = 3.0 it takes vLLM's 90 steps and accepts vLLM's 180 drafts."""
    def spec_decode(length):
        return kvsim.simulate({"steps": "none", "engine": {"speculative_config": {
            "method": "ngram", "num_speculative_tokens": 3, "synthetic_acceptance_length": length}},
            "workload": {"num_requests": 1, "prompt_len": {"dist": "fixed", "value": 64},
                         "output_len": {"dist": "fixed", "value": 271}}}).summary["spec_decode"]

    vllm_reported = spec_decode(4)
    assert vllm_reported["num_drafts"] == 68  # verify steps: one per decode step
    every_step = spec_decode((271 - 1) / (271 - 1 - 180))
    assert every_step["num_drafts"] == 90 and every_step["num_accepted_tokens"] == 180
