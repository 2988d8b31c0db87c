"""Fidelity targets on the two dense measured runs (issue 11), so a change that degrades them fails CI.

With the imported measured profile: TTFT, TPOT and E2E means within 5 % of the measurement,
and TPOT and E2E no worse than the peer LLMServingSim's error on the same run. With the
roofline alone: all three within 15 %. Full 300-request replays; deterministic (seeded, no
wall-clock). Targets not yet reached are listed in `NOT_YET_MET` with the current numbers:
they are strict xfails, so reaching one fails the suite until it moves into the asserted set.
"""

import gzip
import json
from functools import cache
from pathlib import Path

import pytest
from conftest import VALIDATION_SET

from kvsim.validation.compare import Validation, validate
from kvsim.validation.measured import load_measured
from kvsim.validation.replay import default_profile

CASES = VALIDATION_SET / "measured" / "RTXPRO6000"  # shipped in the repository
DENSE = ("Llama-3.1-8B", "Qwen3-32B")
MEANS = ("TTFT mean (s)", "TPOT mean (s)", "E2E mean (s)")
TOLERANCE_PCT = {"calibrated": 5.0, "roofline": 15.0}
pytestmark = pytest.mark.skipif(not CASES.is_dir(), reason=f"needs the measured runs in {CASES}")

# (case, latency, metric or "peer <metric>") -> why it is not met yet (current error)
_ASYNC = ("with vLLM 0.19's default async scheduling (each step planned while the previous one runs, so the CPU "
          "overhead hides behind the GPU's step: kvsim.sched.async_steps), which the peer does not model")
NOT_YET_MET: dict[tuple[str, str, str], str] = {
    ("Qwen3-32B", "calibrated", "peer TPOT mean (s)"): "+1.07 % against the peer's +0.8 %, " + _ASYNC,
    ("Qwen3-32B", "calibrated", "peer E2E mean (s)"): "+1.10 % against the peer's +1.0 %, " + _ASYNC,
}


@cache
def _replay(case: str, latency: str) -> Validation:
    run = load_measured(CASES / case)
    return validate(run, latency=latency, profile=default_profile(CASES / case, run), measured_path=CASES / case)


@pytest.fixture(scope="module")
def replay():
    """`_replay`: each (case, latency) replayed once (0.4 to 2 CPU s each, 5.8 s in all). Module-scoped, so that one
    xdist worker runs this module's tests (tests/conftest.py) and the other does not replay the same runs again."""
    return _replay


def _params(checks: list[str], latencies: tuple[str, ...]) -> list:
    params = []
    for case in DENSE:
        for latency in latencies:
            for check in checks:
                reason = NOT_YET_MET.get((case, latency, check))
                marks = [pytest.mark.xfail(reason=f"target not met yet: {reason}", strict=True)] if reason else []
                params.append(pytest.param(case, latency, check, marks=marks, id=f"{case}-{latency}-{check}"))
    return params


@pytest.mark.parametrize(("case", "latency", "metric"), _params(list(MEANS), ("roofline", "calibrated")))
def test_mean_latency_within_tolerance(case, latency, metric, replay):
    row = replay(case, latency).row(metric)
    assert abs(row["kvsim_error_pct"]) <= TOLERANCE_PCT[latency], row


@pytest.mark.parametrize(("case", "latency", "check"), _params([f"peer {m}" for m in MEANS[1:]], ("calibrated",)))
def test_calibrated_no_worse_than_llmservingsim(case, latency, check, replay):
    row = replay(case, latency).row(check.removeprefix("peer "))
    assert abs(row["kvsim_error_pct"]) <= abs(row["llmservingsim_error_pct"]), row


# Issue 21's targets: roofline within 5 %, calibrated within 2 % on the dense cases; MoE roofline within 15 %.
TARGET_PCT = {"roofline": 5.0, "calibrated": 2.0}
MOE = "Qwen3-30B-A3B-Instruct-2507"
MOE_ROOFLINE_PCT = 15.0
TARGET_NOT_MET: dict[tuple[str, str, str], str] = {
    ("Llama-3.1-8B", "calibrated", "TTFT mean (s)"): (
        "-2.7 %: -193 ms a request, -185 ms of it queue time (queue -2.6 %), -9 ms prefill (prefill time -7.1 %); "
        "both start in the first 10 s, at light load, where the steps that prefill run longer than the profile's "
        "kernels add up to: a request prefilled alone beside at most 100 decodes takes a median 4.4 ms (8 %) longer "
        "from scheduled to first token than kvsim's steps (41 requests), beside more than 100 0.1 ms (101); single "
        "decode steps read between the run's records average 2.6 % longer (11 steps at 3-107 running), and the run's "
        "first step 68 ms (request 0); Qwen3-32B shows the same (its 11 requests that do not queue: prefill -27 %, "
        "the 289 that do: +0.1 %). Every op the profile measured is priced at the step's token count (linear and "
        "token ops at the CUDA-graph size, the attention grid at the chunk, its cached tokens, the decodes and their "
        "context, LM head and sampler at every scheduled request's row, a partial chunk's too, as vLLM v1 computes "
        "them: 0.7 ms on the one step here that samples nothing), and the excess does not depend on the step in "
        "flight (first 10 s: a median 6.5 ms after a step outside CUDA graphs, 38 requests; 4.4 ms after one inside, "
        "73): it is in the measured engine, not in any kernel the eager one-layer profile timed, and per-request "
        "timestamps cannot say what it is (compiled kernels, launch and input preparation outside CUDA graphs, "
        "clocks). So kvsim's ramp-up runs about 1 s ahead (requests finishing before 25 s finish 0.65-1.04 s early), "
        "the requests queued behind max_num_seqs are admitted that much sooner (first scheduled at 15-25 s: queue -14 "
        "% and -7 %), and at 25-30 s, where vLLM admitted in bursts after clustered finishes (20 of 45 requests "
        "scheduled with another, their prompts sharing a step's token budget: 209 ms to first token against 132 ms "
        "alone), kvsim's earlier finishes came singly (13 of 45): -1.72 s of the -2.63 s prefill-time shortfall "
        "summed over the requests, the first 10 s -0.96 s (these per-request figures were read before kvsim priced "
        "the partial chunk's logits row, which moved the mean TTFT by +6 ms and the summed shortfall to -2.60 s)"),
}


def _target_params() -> list:
    params = []
    for case in DENSE:
        for latency in TARGET_PCT:
            for metric in MEANS:
                reason = TARGET_NOT_MET.get((case, latency, metric))
                marks = [pytest.mark.xfail(reason=f"target not met yet: {reason}", strict=True)] if reason else []
                params.append(pytest.param(case, latency, metric, marks=marks, id=f"{case}-{latency}-{metric}"))
    return params


@pytest.mark.parametrize(("case", "latency", "metric"), _target_params())
def test_dense_cases_meet_the_fidelity_targets(case, latency, metric, replay):
    row = replay(case, latency).row(metric)
    assert abs(row["kvsim_error_pct"]) <= TARGET_PCT[latency], row


@pytest.mark.parametrize("latency", ["roofline", "calibrated"])
@pytest.mark.parametrize("case", [*DENSE, MOE])
def test_prefill_time_within_10_percent(case, latency, replay):
    """TTFT's prefill part (first scheduled → first token, vLLM's `request_prefill_time_seconds`): what
    async scheduling puts in it (the step planned ahead) and the prefill steps' prices, apart from the
    queueing that dominates these runs' TTFT. The measured mean is recomputed here from the raw records."""
    with gzip.open(CASES / case / "vllm" / "requests.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    measured = sum(r["first_token_ts"] - r["scheduled_ts"] for r in rows) / len(rows)
    row = replay(case, latency).row("prefill time mean (s)")
    assert row["measured"] == pytest.approx(measured)
    assert abs(row["kvsim_error_pct"]) <= 10.0, row


@pytest.mark.parametrize("metric", MEANS)
def test_moe_roofline_within_15_percent(metric, replay):
    """The MoE case with the roofline alone (no moe.csv): expert GEMMs priced per tokens-per-expert regime
    at the fused-MoE kernel's fitted speed."""
    row = replay(MOE, "roofline").row(metric)
    assert abs(row["kvsim_error_pct"]) <= MOE_ROOFLINE_PCT, row


def test_replay_is_deterministic(replay):
    again = validate(load_measured(CASES / "Llama-3.1-8B"), latency="roofline", measured_path=CASES / "Llama-3.1-8B")
    assert again.rows == replay("Llama-3.1-8B", "roofline").rows


def test_published_table_is_current(replay):
    """docs/accuracy.md's table and benchmarks/results/accuracy.json are what `python benchmarks/accuracy.py`
    gives today: the JSON's kvsim means equal these replays, and the page shows the JSON."""
    import json

    from conftest import benchmark_script

    repo = Path(__file__).resolve().parents[1]
    script = benchmark_script("accuracy")
    entries = json.loads((repo / "benchmarks" / "results" / "accuracy.json").read_text())["cases"]
    by_case = {e["case"]: e for e in entries}
    for case in DENSE:
        for latency in ("roofline", "calibrated"):
            published = by_case[case]["predictions"][f"kvsim_{latency}"]
            for metric in MEANS:
                assert published[metric] == pytest.approx(replay(case, latency).row(metric)["kvsim"], rel=1e-9)
    page = (repo / "docs" / "accuracy.md").read_text(encoding="utf-8")
    assert f"{script.START}\n{script.markdown_table(entries)}{script.END}" in page


def test_the_flag_that_skips_the_page_is_named_for_it():
    """`--no-docs` writes only the JSON: the tables and figures it skips are docs/accuracy.md's. It was `--no-readme`
    from when they were in README.md; that name is refused now (argparse's exit 2), not kept beside it."""
    from conftest import benchmark_script

    script = benchmark_script("accuracy")
    assert script.arguments(["--no-docs"]).no_docs is True
    assert script.arguments([]).no_docs is False
    with pytest.raises(SystemExit) as refused:
        script.arguments(["--no-readme"])
    assert refused.value.code == 2
    assert "[--no-docs]" in script.__doc__
