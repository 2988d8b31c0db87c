"""The capacity report: every file there, images resolvable, numbers equal to capacity and run."""

import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.engine.simulate import simulate
from kvsim.model.capacity_plan import plan_capacity
from kvsim.model.config import load_gpu, load_model
from kvsim.report.studies import StudyConfig, saturated
from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario

TABLES = ("context_concurrency", "kv_quantization", "prefix_sharing", "capacity_formula", "waste_breakdown",
          "sustained_rate", "load_curves", "time_series", "alert_firings", "capacity", "fleet_routing",
          "offload_points", "offload_pays", "offload_hurts", "speculation", "speculation_speedup")
FIGURES = ("fig_context", "fig_fp8", "fig_prefix", "fig_formula", "fig_paging", "fig_load", "fig_time_series",
           "fig_alerts", "fig_fleet", "fig_offload", "fig_speculation")


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("r") / "report"
    result = CliRunner().invoke(app, ["report", "--quick", "-o", str(out), "--workers", "1"])
    assert result.exit_code == 0, result.output
    return out


def test_every_file_is_written(report_dir):
    names = {p.name for p in report_dir.iterdir()}
    assert {"report.md", "report.html", "alerts.yaml"} <= names
    assert {f"{t}.csv" for t in TABLES} <= names
    assert {f"{f}.png" for f in FIGURES} <= names
    for png in report_dir.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_html_and_markdown_reference_only_existing_files(report_dir):
    html = (report_dir / "report.html").read_text()
    images = re.findall(r"<img alt='[^']*' src='([^']+)'>", html)
    assert len(images) == len(FIGURES)
    links = re.findall(r"href='([^']+)'", html)
    for ref in images + links:
        assert (report_dir / ref).is_file(), ref
    assert "http" not in "".join(images)  # opens offline
    md = (report_dir / "report.md").read_text()
    assert md.count("_Latency model: roofline._") == 10  # one per section
    assert "groups:" in (report_dir / "alerts.yaml").read_text()


def test_report_numbers_agree_with_capacity_and_run(report_dir):
    base = load_scenario(None, default=REPORT_SCENARIO)
    model, gpu = load_model(base.model), load_gpu(base.gpu)
    capacity = pd.read_csv(report_dir / "capacity.csv").iloc[0]
    plan = plan_capacity(model, gpu, base.engine, [base.engine.max_model_len])
    for key in ("bytes_per_token", "bytes_per_block", "num_gpu_blocks", "kv_pool_bytes", "num_gpu_blocks_fp8"):
        assert capacity[key] == getattr(plan, key), key
    quant = pd.read_csv(report_dir / "kv_quantization.csv").set_index("kv_cache_dtype")
    n = StudyConfig.quick().num_requests
    run = simulate(saturated(base, n)).summary
    assert quant.loc["auto", "simulated_sustained_running"] == round(run["saturated"]["mean_running"], 2)
    assert quant.loc["auto", "peak_running_transient"] == run["max_running"]
    assert quant.loc["auto", "num_gpu_blocks"] == plan.num_gpu_blocks == run["num_gpu_blocks"]


def test_paging_section_matches_the_paper(report_dir):
    """Shares of the whole pool while saturated: v1 admits only whole prompts, so paged leaves a few % free."""
    waste = pd.read_csv(report_dir / "waste_breakdown.csv").set_index("allocator")
    assert waste.loc["paged", "token_state"] >= 0.85
    assert waste.loc["slab-max", "token_state"] < 0.5
    assert waste.loc["paged", "sustained_running"] > 2 * waste.loc["slab-max", "sustained_running"]


def test_report_bad_input_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["report", "--gpu", "tpu", "-o", str(tmp_path / "r")])
    assert result.exit_code == 2 and "tpu" in result.stderr and not (tmp_path / "r").exists()


def test_report_words_follow_the_data(report_dir):
    """Sentences quote the runs: the configuration, the limit that capped them, the bisected rate and the cost."""
    md = (report_dir / "report.md").read_text()
    capacity = pd.read_csv(report_dir / "capacity.csv").iloc[0]
    assert f"llama-3.1-8b on one l4, {capacity['num_gpu_blocks']:,} KV blocks" in md
    limits = set(pd.read_csv(report_dir / "context_concurrency.csv").paged_limited_by)
    if limits == {"kv"}:
        assert "every run was capped by KV memory (paged)" in md
    rates = pd.read_csv(report_dir / "sustained_rate.csv").set_index("allocator")
    assert f"is {rates.loc['paged', 'max_rate_meeting_slo']:g} req/s with paging" in md
    assert f"an offered {rates.loc['paged', 'offered_rate_in_window']:.4g} req/s" in md  # not only the asked rate
    assert f"${rates.loc['paged', 'usd_per_concurrent_user_hour']:.4f} per concurrent user-hour" in md
    assert "as of 2026-03-10" in md


def test_the_headline_rate_held_in_a_ten_times_longer_run(report_dir):
    """The sustainable rate the report prints is one whose long run (10x the converged probe length, at most
    --quick's 1,600 requests) held: verified, and the sentence says so with that run's length."""
    rates = pd.read_csv(report_dir / "sustained_rate.csv").set_index("allocator")
    paged = rates.loc["paged"]
    quick = StudyConfig.quick()
    assert bool(paged.verified) and paged.num_long_runs >= 1
    assert paged.verify_num_requests == min(10 * paged.requests_per_probe, quick.rate_max_verify_requests)
    if paged.max_rate_meeting_slo > paged.search_rate:  # the search's rate held long: long runs went higher
        assert paged.num_long_runs > 1
    if paged.num_long_runs > 1:  # a long run failed: the printed rate is within one 3 % step of it
        assert paged.first_failing_rate * 0.97 <= paged.max_rate_meeting_slo + 1e-4
    md = (report_dir / "report.md").read_text()
    assert f"then held in one run {int(paged.verify_num_requests):,} requests long" in md


def test_fleet_section_counts_the_trace_and_quotes_its_table(report_dir):
    """The refused prompts are counted from the shipped files here (max_model_len: the report scenario's 4,096,
    which its pool holds, or the engine would not start): 45 of the first 60 Mooncake prompts are that long or
    longer, more than half, so the section passes it over and sizes the Azure conversation trace's first 60, none
    of which is (the longest is 4,085); it was "nothing sized". The hit rates and TTFTs in the words are the
    table's; Azure's rows carry no prompt content, so affinity is not run. --quick's probes stay at 60 requests
    (`StudyConfig.quick`), too short to judge, and nothing is re-run: the section and summary say no fleet is
    sized because of that."""
    import csv
    import json

    max_model_len, num_requests = 4096, StudyConfig.quick().fleet_requests
    data = Path(__file__).resolve().parents[1] / "kvsim/workload/data"
    mooncake = [json.loads(line) for line in (data / "mooncake_conversation_head.jsonl").read_text().splitlines()]
    moon_too_long = sum(r["input_length"] >= max_model_len for r in mooncake[:num_requests])
    with (data / "azure_conv.csv").open(newline="") as f:
        azure = [int(row["ContextTokens"]) for row in csv.DictReader(f)][:num_requests]
    azure_too_long = sum(p >= max_model_len for p in azure)
    assert (moon_too_long, azure_too_long) == (45, 0)
    md = (report_dir / "report.md").read_text()
    assert "## How many GPUs for this traffic (Azure conversation trace, routing)" in md
    assert (f"{moon_too_long} of the first {num_requests} Mooncake requests ({moon_too_long / num_requests:.0%}) "
            "have prompts of max_model_len or more") in md
    assert f"prompts of {sum(azure) / num_requests:,.0f} tokens on average" in md
    assert f"with prefix caching, max_model_len {max_model_len:,}." in md  # none refused
    fleet = pd.read_csv(report_dir / "fleet_routing.csv").set_index("router")
    assert list(fleet.index) == ["round_robin", "least_outstanding"]
    assert (fleet.num_rejected == azure_too_long).all() and (fleet.prefix_cache_hit_rate == 0).all()
    # --quick probes its 60 requests only (no doubling, no long run): too short to judge a fleet, so none is sized
    # and the words say so, never "more than 8 replicas" (a full report doubles them to 1,920 and sizes 6)
    assert fleet.replicas_for_slo.isna().all() and fleet.verified_10x.isna().all()
    assert fleet.probes_too_short.all() and (fleet.requests_per_probe == num_requests).all()
    assert (f"No fleet is sized for TTFT p90 ≤ 2 s: with every router the {num_requests}-request probes were too "
            f"short to judge any fleet of up to 8 replicas (this report caps them at {num_requests} requests") in md
    rr, lo = fleet.loc["round_robin"], fleet.loc["least_outstanding"]
    assert (f"{rr.ttft_p50_s:.2f} / {rr.ttft_p90_s:.2f} s with round robin and {lo.ttft_p50_s:.2f} / "
            f"{lo.ttft_p90_s:.2f} s with least outstanding") in md
    assert (f"**No fleet sized for the Azure conversation trace's first {num_requests} requests** at TTFT p90 ≤ 2 s: "
            "its probes were too short to judge one") in md  # the summary


def test_a_run_that_never_saturates_has_no_sustained_figure_not_zero():
    """Six requests at once on an H200 all run at once: nothing queues, so there is no steady state to
    average; the table keeps the gap (NaN), the words say "not saturated", the Markdown shows "–"."""
    from kvsim.report import capacity_study, studies
    from kvsim.report.build import _rounded
    from kvsim.report.text import fp8_text

    base = load_scenario(None, default=REPORT_SCENARIO, overrides=["gpu=h200"])
    st = studies.Study(base, StudyConfig(num_requests=2, workers=1, saturate_max_requests=6))  # no re-run
    sec = capacity_study.kv_quantization(st)
    table = sec.tables["kv_quantization"]
    assert table.simulated_sustained_running.isna().all()
    assert (table.peak_running_transient == 6).all()
    assert "(not saturated → not saturated)" in fp8_text(sec)
    assert _rounded(table)[0]["simulated_sustained_running"] == "–"


@pytest.mark.parametrize(("scheduler", "null_blocks"), [("v1", 1), ("v0", 0)])
def test_the_report_counts_a_null_block_only_where_the_engine_keeps_one(scheduler, null_blocks):
    """vLLM v1's paged pool keeps block 0 back; vLLM v0's block manager hands out every block. The capacity
    sections' closed forms (usable blocks ÷ blocks per sequence) and the introduction follow the engine."""
    from kvsim.report import studies
    from kvsim.report.text import introduction

    base = load_scenario(None, default=REPORT_SCENARIO, overrides=[f"engine.scheduler={scheduler}"])
    st = studies.Study(base, StudyConfig(num_requests=2, workers=1))
    assert st.paged_null_blocks == null_blocks
    assert ("null block" in introduction(st)) is bool(null_blocks)
