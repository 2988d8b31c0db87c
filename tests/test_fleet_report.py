"""The report's fleet section: the unbounded-cache bound and the affinity verdict, worked by hand."""

import functools

import pandas as pd
import pytest

from kvsim.model.errors import KvsimError
from kvsim.report.fleet_study import unbounded_hit_rate
from kvsim.report.fleet_text import _affinity_verdict, fleet_text
from kvsim.report.fleet_traffic import AZURE_CONV, MOONCAKE
from kvsim.workload.traces import TraceRecord


def test_unbounded_hit_rate_counts_leading_segments_seen_before():
    a, b, c, d = (("m", i) for i in range(4))
    records = [
        TraceRecord(0.0, 612, 1, ((a, 512), (b, 100))),  # nothing seen yet: 0 of 612
        TraceRecord(1.0, 1024, 1, ((a, 512), (c, 512))),  # a seen: 512 of 1024
        TraceRecord(2.0, 1034, 1, ((a, 512), (c, 512), (d, 10))),  # a, c seen: 1024 of 1034
        TraceRecord(3.0, 5000, 1, ((a, 512),) * 10),  # ≥ max_model_len: refused, never looked up
        TraceRecord(4.0, 600, 1, ((d, 512), (a, 88))),  # d (third request) and a both seen: 600 of 600
    ]
    expected = (0 + 512 + 1024 + 600) / (612 + 1024 + 1034 + 600)
    assert unbounded_hit_rate(records, max_model_len=4096) == expected


def test_unbounded_hit_rate_stops_at_the_first_unseen_segment():
    a, b, c = (("m", i) for i in range(3))
    records = [TraceRecord(0.0, 512, 1, ((a, 512),)), TraceRecord(1.0, 1536, 1, ((b, 512), (a, 512), (c, 512)))]
    assert unbounded_hit_rate(records, max_model_len=4096) == 0.0  # a follows an unseen b: no leading run


def _row(hit, p50, p90, queue_p90, computed, busiest):
    return pd.Series({"prefix_cache_hit_rate": hit, "ttft_p50_s": p50, "ttft_p90_s": p90, "queue_p90_s": queue_p90,
                      "prompt_tokens_computed": computed, "requests_per_replica_max": busiest})


FACTS = {"floor_hit_rate": 0.10, "unbounded_hit_rate": 0.12, "pool_tokens": 1_000_000, "mean_prompt_tokens": 12_000}


def test_verdict_says_more_hits_but_no_better_ttft_and_why():
    """The last measured case: 5.7 % → 12.7 % hits, TTFT not better. 1,000,000 → 926,000 computed tokens is
    7.4 % spared; queue p90 0.50 → 0.90 s and 93 vs 85 requests on the busiest replica."""
    lo = _row(0.057, 0.65, 4.05, 0.50, 1_000_000, 85)
    aff = _row(0.127, 0.68, 4.52, 0.90, 926_000, 93)
    text = _affinity_verdict(FACTS, lo, aff)
    assert text.startswith("Affinity raises the hit rate from 5.7% to 12.7% (7.0 points).")
    assert "TTFT p50 is about the same (0.65 → 0.68 s) and its p90 higher (4.05 → 4.52 s)" in text
    assert "affinity's hits spared 7.4% of the prompt tokens computed" in text
    assert "its queue time p90 is 0.90 s against 0.50 s" in text
    assert "its busiest replica got 93 requests against 85" in text
    assert "evicts" not in text  # one replica keeps 10 % of the 12 % bound: eviction is no explanation here


def test_verdict_when_affinity_wins_gives_no_excuses():
    lo = _row(0.05, 1.0, 4.0, 0.5, 1_000_000, 90)
    aff = _row(0.20, 0.8, 3.0, 0.4, 800_000, 80)
    text = _affinity_verdict(FACTS, lo, aff)
    assert text == ("Affinity raises the hit rate from 5.0% to 20.0% (15.0 points). Its TTFT p50 is lower (1.00 → 0.80 s) and "
                    "its p90 lower (4.00 → 3.00 s).")


def test_verdict_blames_eviction_only_when_one_replica_alone_loses_most_hits():
    lo = aff = _row(0.044, 8.0, 70.0, 65.0, 546_627, 9)
    facts = {**FACTS, "floor_hit_rate": 0.05, "unbounded_hit_rate": 0.106, "pool_tokens": 32_240,
             "mean_prompt_tokens": 14_233}
    text = _affinity_verdict(facts, lo, aff)
    assert text.startswith("Affinity does not raise the hit rate (4.4% → 4.4%); the fleet stays far below the "
                           "10.6% an unbounded cache would serve")
    assert "keeps only 5.0%: a pool of 32,240 tokens (2.3 mean prompts)" in text
    # the H200 case: affinity reaches 8.0 % of an 8.1 % bound, so eviction explains nothing there
    near = _affinity_verdict({**facts, "floor_hit_rate": 0.036, "unbounded_hit_rate": 0.081},
                             _row(0.042, 0.36, 1.88, 0.45, 4_090_259, 50), _row(0.080, 0.39, 2.56, 0.66, 3_929_651, 52))
    assert "evicts" not in near and "3.8 points" in near
    assert "affinity computed no fewer prompt tokens" in text


def test_verdict_names_a_small_gain_as_a_gain():
    """4.61 % → 4.93 % (the L4 default report): a third of a point, stated as such, never as 'no gain'."""
    lo = _row(0.0461, 1.69, 6.49, 0.75, 2_415_804, 10)
    aff = _row(0.0493, 2.05, 6.73, 2.78, 2_407_612, 11)
    text = _affinity_verdict(FACTS, lo, aff)
    assert text.startswith("Affinity raises the hit rate from 4.6% to 4.9% (0.3 points)")
    assert "p90 about the same (6.49 → 6.73 s)" in text  # 3.7 % apart: within 5 %
    assert f"spared {1 - 2_407_612 / 2_415_804:.1%} of the prompt tokens" in text and "0.3%" in text


def test_one_replica_fleet_says_there_is_nothing_to_route():
    """A fleet of one (OPT-13B, max_model_len 2,048): the words give it, say "1 replica" and compare no routers."""
    from kvsim.report.section import Section
    from kvsim.workload.scenario import load_scenario

    class St:  # what fleet_text reads of a Study
        base = load_scenario(None, ["model=opt-13b", "engine.max_model_len=2048"])
        model = type("M", (), {"name": "opt-13b"})
        gpu = type("G", (), {"name": "a100-40gb"})

    rows = [{"router": r, "replicas": 1, "prefix_cache_hit_rate": 0.344, "ttft_p50_s": 0.19, "ttft_p90_s": 0.40,
             "queue_p90_s": 0.19, "prompt_tokens_computed": 8797, "requests_per_replica_max": 60,
             "replicas_for_slo": 1, "cost_per_hour_for_slo": None} for r in ("round_robin", "least_outstanding",
                                                                              "affinity")]
    facts = {"num_requests": 60, "span_s": 15.0, "mean_prompt_tokens": 12386.0, "max_model_len": 2048,
             "num_too_long": 50, "floor_ttft_p90_s": 0.18, "floor_queue_p99_s": 0.0,
             "unbounded_hit_rate": 0.344, "ttft_target_s": 2.0, "slo_s": 2.0, "max_replicas": 8,
             "price_source": "none", "trace": MOONCAKE, "passed_over": []}
    text = fleet_text(Section("fleet", "t", {"fleet_routing": pd.DataFrame(rows)}, facts), St)
    assert "max_model_len 2,048; the 50 prompts" in text
    assert "needs 1 replica with round robin; 1 replica with least outstanding; 1 replica with affinity." in text
    assert "at this traffic there is no routing to compare" in text and "Affinity" not in text


def test_a_mostly_unservable_trace_is_said_in_one_line_and_not_sized():
    from kvsim.report.section import Section

    facts = {"unservable": True, "num_requests": 300, "max_model_len": 512,
             "passed_over": [{"name": "Mooncake", "num_too_long": 300}, {"name": "Azure conversation",
                                                                        "num_too_long": 180}]}
    text = fleet_text(Section("fleet", "t", {"fleet_routing": pd.DataFrame()}, facts), None)
    assert text == ("300 of the first 300 Mooncake requests (100%) and 180 of the first 300 Azure conversation "
                    "requests (60%) have prompts of max_model_len (512 tokens) or more: this engine cannot serve "
                    "these traces, so no fleet is sized for them.")


@functools.cache
def _prompts() -> tuple[list[int], list[int]]:
    """The prompt lengths of the shipped Mooncake slice and Azure conversation trace, read with json and csv alone."""
    import csv
    import json
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "kvsim/workload/data"
    lines = (data / "mooncake_conversation_head.jsonl").read_text().splitlines()
    with (data / "azure_conv.csv").open(newline="") as f:
        azure = [int(row["ContextTokens"]) for row in csv.DictReader(f)]
    return [json.loads(line)["input_length"] for line in lines], azure


def _counts(max_model_len: int, num_requests: int) -> tuple[int, int]:
    """Prompts of max_model_len or more among each shipped trace's first `num_requests`."""
    return tuple(sum(p >= max_model_len for p in prompts[:num_requests]) for prompts in _prompts())


@pytest.mark.parametrize(("max_model_len", "num_requests", "expected"), [
    (4096, 300, (210, 1)),  # the report's L4 default: Mooncake passed over (70 %), Azure served (its 4,107 row)
    (16384, 300, (85, None)),  # 28 % of Mooncake refused: served, Azure never read
    (8192, 60, (30, None)),  # exactly half refused (--quick, docs/report.md's third command): served
    (512, 300, (300, 180)),  # neither: nothing sized
])
def test_the_fleet_serves_the_first_shipped_trace_at_most_half_of_which_is_too_long(max_model_len, num_requests,
                                                                                      expected):
    """`choose` on the report's default engine, against counts read from the files by `_prompts` (210 of
    Mooncake's first 300 prompts are 4,096 tokens or more, docs/report.md's figure)."""
    from kvsim.report.fleet_traffic import choose
    from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario

    tried = choose(load_scenario(None, default=REPORT_SCENARIO), num_requests, max_model_len)
    moon, azure = _counts(max_model_len, num_requests)
    read_azure = expected[1] is not None
    assert (moon, azure if read_azure else None) == expected
    assert [(t.trace, t.num_too_long, len(t.records)) for t in tried] == \
        [(MOONCAKE, moon, num_requests)] + ([(AZURE_CONV, azure, num_requests)] if read_azure else [])
    half = num_requests / 2
    assert [t.served for t in tried] == [moon <= half] + ([azure <= half] if read_azure else [])


class _AzureSt:  # what fleet_text reads of a Study: the default report's engine
    model = type("M", (), {"name": "llama-3.1-8b"})
    gpu = type("G", (), {"name": "l4"})

    @functools.cached_property
    def base(self):
        from kvsim.workload.scenario import load_scenario

        return load_scenario(None, ["model=llama-3.1-8b", "gpu=l4"])


def _azure_section(row_extra: dict | None = None, **facts_extra):
    """The default --quick report's fleet section on Azure's first 60 requests (figures as a run gave them): 6
    replicas with either router; `row_extra` is set in both rows, `facts_extra` in the facts."""
    from kvsim.report.section import Section

    rows = [{"router": r, "replicas": 6, "prefix_cache_hit_rate": 0.0, "ttft_p50_s": p50, "ttft_p90_s": p90,
             "queue_p90_s": q, "prompt_tokens_computed": 43328, "requests_per_replica_max": busiest,
             "replicas_for_slo": 6, "cost_per_hour_for_slo": None, **(row_extra or {})}
            for r, p50, p90, q, busiest in (("round_robin", 0.17, 0.52, 0.05, 10),
                                            ("least_outstanding", 0.16, 0.59, 0.04, 12))]
    facts = {"num_requests": 60, "span_s": 30.2, "mean_prompt_tokens": 722.1, "max_model_len": 4096,
             "num_too_long": 0, "floor_ttft_p90_s": 0.47, "floor_queue_p99_s": 0.0, "unbounded_hit_rate": None,
             "ttft_target_s": 2.0, "slo_s": 2.0, "max_replicas": 8, "price_source": "none", "trace": AZURE_CONV,
             "passed_over": [{"name": "Mooncake", "num_too_long": 45}], **facts_extra}
    return Section("fleet", "t", {"fleet_routing": pd.DataFrame(rows)}, facts)


def test_a_floor_above_the_slo_sizes_for_the_floor_plus_the_slo_and_says_so():
    """The target sentence's other branch where counts are judged: a floor whose p90 TTFT is past the 2 s SLO makes
    the target the floor plus the SLO (`fleet_routing`: 0.47 s + 2 s = 2.47 s, as `ttft_target_s` here), and the
    words say the SLO is out of reach before the replicas that target needs (`_target`, sized)."""
    text = fleet_text(_azure_section(ttft_target_s=2.47), _AzureSt())
    assert ("so no fleet goes far below it. That is above the report's 2 s TTFT SLO, so no fleet of this GPU meets "
            "it; sized instead for TTFT p90 ≤ 2.47 s (the floor plus 2 s of waiting), it needs 6 replicas with round "
            "robin; 6 replicas with least outstanding.") in text


def test_a_trace_without_prompt_content_compares_no_hit_rates_and_runs_no_affinity():
    """Azure's rows give lengths alone: the words say why this trace (the passed-over Mooncake count), that
    affinity has nothing to follow, and quote no hit rate or unbounded bound (it has none: no block identity)."""
    St = _AzureSt()
    sec = _azure_section()
    text = fleet_text(sec, St)
    assert text.startswith("The first 60 requests of the Azure LLM inference trace's conversation service (Azure's "
                           "production traffic, 2023: real arrivals over 30 s, prompts of 722 tokens on average, "
                           "lengths alone, no prompt content; CC-BY 4.0")
    assert ("max_model_len 4,096. It is served because this engine refuses most of the trace tried first: 45 of "
            "the first 60 Mooncake requests (75%) have prompts of max_model_len or more") in text
    assert "affinity is not run" in text and "Affinity" not in text and "hit rate" not in text
    assert "so no fleet goes far below it. TTFT p90 ≤ 2 s needs 6 replicas with round robin; 6 replicas with " \
        "least outstanding." in text
    one = fleet_text(_azure_section(num_too_long=1), St)
    assert "max_model_len 4,096; its one prompt of 4,096 tokens or more is refused, as vLLM refuses it. It" in one
    assert text.endswith("At 6 replicas (the fewest least-outstanding routing needs), TTFT p50 / p90: 0.17 / 0.52 s "
                         "with round robin and 0.16 / 0.59 s with least outstanding; queue p90 0.05 s and 0.04 s; "
                         "the busiest replica got 10 and 12 requests.")


def test_the_fleet_section_quotes_the_gap_breakdown_of_the_floor():
    """With a floor and the plan's gap breakdown in the table, the sentence on the floor quotes the parts."""
    from kvsim.report.section import Section
    from kvsim.workload.scenario import load_scenario

    class St:  # what fleet_text reads of a Study
        base = load_scenario(None, ["model=opt-13b", "engine.max_model_len=2048"])
        model = type("M", (), {"name": "opt-13b"})
        gpu = type("G", (), {"name": "a100-40gb"})

    gap = "3 replicas = compute floor 1.26 + batching 1.76 + preemption 0.00 - idle 0.02; KV floor 1.21"
    rows = [{"router": r, "replicas": 3, "prefix_cache_hit_rate": 0.3, "ttft_p50_s": 0.19, "ttft_p90_s": 0.40,
             "queue_p90_s": 0.19, "prompt_tokens_computed": 8797, "requests_per_replica_max": 60,
             "replicas_for_slo": 3, "cost_per_hour_for_slo": None, "floor_replicas": 2, "floor_binds": "compute",
             "replicas_over_floor": 1.5, "gap_breakdown": gap} for r in ("round_robin", "least_outstanding",
                                                                         "affinity")]
    facts = {"num_requests": 60, "span_s": 15.0, "mean_prompt_tokens": 1200.0, "max_model_len": 2048,
             "num_too_long": 0, "floor_ttft_p90_s": 0.18, "floor_queue_p99_s": 0.0,
             "unbounded_hit_rate": 0.3, "ttft_target_s": 2.0, "slo_s": 2.0, "max_replicas": 8,
             "price_source": "none", "trace": MOONCAKE, "passed_over": []}
    text = fleet_text(Section("fleet", "t", {"fleet_routing": pd.DataFrame(rows)}, facts), St)
    assert "least outstanding needs 1.5× that, made of (from that fleet's own run" in text and gap in text


# Gemma 3 27B: 62 layers, every 6th full attention (10 full, 52 with a 1,024-token window). vLLM groups them in 10s
# (the smaller kind's count; 52 >= 1.5 x 10): 6 sliding-window groups and 1 full group, 7 block tables per request
# on one pool. At max_num_batched_tokens 8,192 (v1 on an H100) a request of L > 9,215 tokens holds at most
# cdiv(L, 16) full blocks and, per window group, cdiv(min(1,023 + 8,192, L), 16) + 1 = 577: 3,462 window blocks.
GEMMA = ["model=gemma-3-27b", "engine.num_gpu_blocks_override=5000"]


def test_a_hybrid_pool_s_tokens_are_its_blocks_shared_among_its_groups():
    """vLLM's "GPU KV cache size" (`_report_kv_cache_config`): kv_cache_config.num_blocks // groups x block_size,
    the null block counted (v1's `BlockPool` takes it out of those blocks after the log's sizing). 5,000 // 7 =
    714 blocks, 11,424 tokens (counted as one group's, 5,000 x 16 = 80,000 said the pool held 7 times what it
    holds); at 5,005 blocks 715 under v1 (subtracting the null block gave 5,004 // 7 = 714). Gemma 3 under v0 is an
    engine `kvsim run` refuses (sliding-window groups need v1's hybrid manager): the report refuses it up front."""
    from kvsim.report.fleet_study import pool_tokens
    from kvsim.report.studies import Study, StudyConfig
    from kvsim.workload.scenario import load_scenario

    def tokens(*overrides):  # v0's step budget is max_model_len (no chunked prefill): 2,048 keeps its windows short
        return pool_tokens(Study(load_scenario(None, [*GEMMA, "engine.max_model_len=2048", *overrides]),
                                 StudyConfig.quick()))

    assert tokens() == 714 * 16 == 11_424
    assert tokens("engine.num_gpu_blocks_override=5005") == 715 * 16
    with pytest.raises(KvsimError, match="sliding-window/chunked KV groups need allocator=paged and scheduler=v1"):
        tokens("engine.num_gpu_blocks_override=5005", "engine.scheduler=v0")


def test_the_fleet_traffic_keeps_the_max_model_len_its_pool_holds():
    """The longest max_model_len 5,001 Gemma 3 blocks start with, one of them v1's null block: cdiv(L, 16) + 3,462
    <= 5,000, so L <= 1,538 x 16 = 24,608 (the old clamp, min(max_model_len, blocks x 16) = 80,000, counted the pool
    as one group's). vLLM refuses an engine whose pool cannot hold one such request, so the report's own engine
    already fits and the fleet's traffic keeps its max_model_len."""
    import pytest

    from kvsim.engine.builder import resolve_engine
    from kvsim.model.errors import KvsimError
    from kvsim.report.fleet_study import traffic
    from kvsim.report.studies import Study, StudyConfig
    from kvsim.workload.scenario import load_scenario

    gemma = ["model=gemma-3-27b", "engine.num_gpu_blocks_override=5001"]
    st = Study(load_scenario(None, [*gemma, "engine.max_model_len=24608"]), StudyConfig.quick())
    assert resolve_engine(traffic(st)).max_model_len == 24_608
    with pytest.raises(KvsimError, match="max_model_len=24609: one request needs"):
        Study(load_scenario(None, [*gemma, "engine.max_model_len=24609"]), StudyConfig.quick())


def test_the_offload_section_sizes_tiers_in_the_blocks_a_sequence_can_hold():
    """Llama-3.1-8B's blocks are 16 tokens x 128 KiB = 2 MiB. v1 keeps block 0 back as its null block: 1,999 of
    2,000 usable, 4,192,206,848 B; v0's block manager hands out all 2,000 (4,194,304,000 B), and a v0 engine is
    refused the tier anyway, in the engine's words (kv_offload needs the v1 scheduler)."""
    from kvsim.report.offload_study import gpu_pool_bytes, offload_sizing
    from kvsim.report.studies import Study, StudyConfig
    from kvsim.workload.scenario import load_scenario

    def study(*overrides):
        return Study(load_scenario(None, ["engine.num_gpu_blocks_override=2000", "engine.max_model_len=8192",
                                          *overrides]), StudyConfig.quick())

    assert gpu_pool_bytes(study()) == 1999 * 2 * 2**20 == 4_192_206_848
    v0 = study("engine.scheduler=v0")
    assert gpu_pool_bytes(v0) == 2000 * 2 * 2**20
    assert offload_sizing(v0).skipped == "engine: kv_offload needs scheduler=v1 (got v0)"


def test_an_engine_both_traces_mostly_overflow_sizes_nothing_and_says_so():
    """At max_model_len 512 all 300 of Mooncake's first prompts and 180 of Azure's (60 %: `_counts`) are that long
    or longer: the section runs nothing and names both counts (the figure's words: test_report_render)."""
    from kvsim.report.fleet_study import fleet_routing
    from kvsim.report.studies import Study, StudyConfig
    from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario

    st = Study(load_scenario(None, ["engine.max_model_len=512"], default=REPORT_SCENARIO), StudyConfig(workers=1))
    sec = fleet_routing(st)
    assert st.runs_submitted == 0 and sec.tables["fleet_routing"].empty
    assert sec.facts["passed_over"] == [{"name": "Mooncake", "num_too_long": _counts(512, 300)[0]},
                                        {"name": "Azure conversation", "num_too_long": _counts(512, 300)[1]}]
    assert fleet_text(sec, st).startswith("300 of the first 300 Mooncake requests (100%) and 180 of the first 300 "
                                          "Azure conversation requests (60%) have prompts of max_model_len (512 ")


def test_the_quick_fleet_search_probes_its_60_requests_once_and_re_runs_nothing_the_full_one_verifies_10x():
    """`--quick`'s fleet plan: probes capped at its own 60 requests (no doubling) and no long run (verify factor
    0); the full report's keeps what it ran before these knobs: probes doubled up to 32,000 requests and the
    answer re-run 10 × as long (`PlanSpec`'s defaults, which `fleet_plan_spec` passed on until it named them)."""
    from kvsim.report.fleet_study import fleet_plan_spec
    from kvsim.report.study_config import StudyConfig
    from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario

    base = load_scenario(None, default=REPORT_SCENARIO)
    quick = fleet_plan_spec(StudyConfig.quick(), base, "l4", 2.0, "least_outstanding")
    assert (quick.max_probe_requests, quick.verify_factor) == (60, 0) and StudyConfig.quick().fleet_requests == 60
    full = fleet_plan_spec(StudyConfig(), base, "l4", 2.0, "least_outstanding")
    assert (full.max_probe_requests, full.verify_factor) == (32_000, 10)


def test_an_answer_not_re_run_says_it_rests_on_probes_alone_and_a_verified_one_says_nothing_new():
    """With `fleet_verify_factor` 0 the sized fleet had no long run (`verified_10x` empty): the words say it rests
    on the 1,920-request probes alone and what a full report does; the summary line says "not verified". An answer
    whose 10 × run held reads as before (the full report's words are unchanged)."""
    from kvsim.report.summary import summary_lines

    St = _AzureSt()
    cfg = type("Cfg", (), {"ttft_slo_s": 2.0})
    unverified = _azure_section({"verified_10x": None, "requests_per_probe": 1920, "probes_too_short": False,
                                 "gpus_for_slo": 6}, verify_factor=0)
    text = fleet_text(unverified, St)
    assert ("TTFT p90 ≤ 2 s needs 6 replicas with round robin; 6 replicas with least outstanding. These answers "
            "rest on 1,920-request probes alone, not verified by a longer run (this report's fleet_verify_factor is "
            "0; kvsim report without --quick re-runs each 10× as long).") in text
    assert summary_lines([unverified], St, cfg)[-1] == (
        "**6 GPUs (6 replicas) for the Azure conversation trace's first 60 requests** at TTFT p90 ≤ 2 s "
        "(least-outstanding routing; probes alone, not verified by a longer run).")
    verified = _azure_section({"verified_10x": True, "requests_per_probe": 1920, "probes_too_short": False,
                               "gpus_for_slo": 6}, verify_factor=10)
    assert fleet_text(verified, St) == fleet_text(_azure_section(), St)  # the words without these columns
    assert "verified" not in fleet_text(verified, St)
    assert summary_lines([verified], St, cfg)[-1] == (
        "**6 GPUs (6 replicas) for the Azure conversation trace's first 60 requests** at TTFT p90 ≤ 2 s "
        "(least-outstanding routing).")
    not_made = _azure_section({"verified_10x": None, "requests_per_probe": 1920, "probes_too_short": False,
                               "gpus_for_slo": 6}, verify_factor=10)  # asked for, not run (the memory limit)
    not_made.tables["fleet_routing"].loc[0, "verified_10x"] = True  # round robin's held
    assert ("6 replicas with least outstanding. Not verified by a run 10× as long with least outstanding: that "
            "long run was not made.") in fleet_text(not_made, St)
    assert summary_lines([not_made], St, cfg)[-1].endswith("(least-outstanding routing; probes alone, not verified "
                                                          "by a longer run).")


def test_probes_capped_while_too_short_size_nothing_and_say_so_not_more_than_the_limit():
    """`--quick` on the default report: the 60-request probes, capped at 60, were too short to judge any count up
    to 8 replicas, so the plan answered no count (`replicas_for_slo` empty). That is not "more than 8 replicas
    (the search's limit)", which it read as before: the words and the summary say the probes were too short and
    that the cap stopped them growing. With one router judged, only the other is named."""
    from kvsim.report.summary import summary_lines

    St = _AzureSt()
    cfg = type("Cfg", (), {"ttft_slo_s": 2.0})
    short = {"replicas": 8, "replicas_for_slo": None, "gpus_for_slo": None, "verified_10x": None,
             "requests_per_probe": 60, "probes_too_short": True}
    sec = _azure_section(short, verify_factor=0, max_probe_requests=60)
    text = fleet_text(sec, St)
    assert ("so no fleet goes far below it. No fleet is sized for TTFT p90 ≤ 2 s: with every router the 60-request "
            "probes were too short to judge any fleet of up to 8 replicas (this report caps them at 60 requests, its "
            "fleet_max_probe_requests; kvsim report without --quick doubles them up to 32,000).") in text
    assert "search's limit)" not in text.split("At 8 replicas")[0] and "rest on" not in text
    assert summary_lines([sec], St, cfg)[-1] == (
        "**No fleet sized for the Azure conversation trace's first 60 requests** at TTFT p90 ≤ 2 s: its probes were "
        "too short to judge one (see the fleet section).")
    above = fleet_text(_azure_section(short, verify_factor=0, max_probe_requests=60, ttft_target_s=2.47), St)
    assert ("That is above the report's 2 s TTFT SLO, so no fleet of this GPU meets it; nor is one sized for TTFT p90 "
            "≤ 2.47 s (the floor plus 2 s of waiting): with every router the 60-request probes were too short") in above
    mixed = sec.tables["fleet_routing"].copy()
    mixed.loc[1, ["replicas_for_slo", "probes_too_short", "verified_10x"]] = [6, False, True]
    text = fleet_text(type(sec)("fleet", "t", {"fleet_routing": mixed}, sec.facts), St)
    assert ("TTFT p90 ≤ 2 s needs 6 replicas with least outstanding. With round robin, no count is judged: the "
            "60-request probes were too short to judge any fleet of up to 8 replicas (this report caps them") in text
