"""The report's figures, summary box and HTML, drawn from small hand-made tables (no simulation):
real axis values, SLO lines, English legends, a one-panel figure over the whole canvas, tables that
fit the page, and a summary that quotes the tables and drops a line whose figure is missing."""

from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from kvsim.report.build import STYLE, _markdown_to_html
from kvsim.report.figures import fig_context, fig_fleet, fig_load, save_figure
from kvsim.report.fleet_traffic import AZURE_CONV, MOONCAKE
from kvsim.report.section import Section
from kvsim.report.studies import StudyConfig
from kvsim.report.summary import summary_lines, summary_markdown

CFG = StudyConfig(ttft_slo_s=2.0)


def context_section() -> Section:
    lens = [1024, 2048, 4096]
    return Section("context", "Context", {"context_concurrency": pd.DataFrame({
        "max_model_len": lens, "closed_form_paged_at_mean_len": [63, 63, 63],
        "simulated_paged_sustained": [72.9, 72.9, 72.9], "closed_form_slab_max": [31, 15, 7],
        "simulated_slab_sustained": [31.0, 15.0, 7.0],  # equal to the closed form: both must stay visible
        "vllm_max_concurrency": [31.5, 15.75, 7.88]})})


def test_a_one_panel_figure_uses_the_whole_canvas_and_coinciding_lines_stay_visible(tmp_path):
    drawn = {}

    def draw(axes):
        fig_context(context_section(), CFG, axes)
        drawn["ax"] = axes[0]

    save_figure(draw, tmp_path / "f.png", "Context")
    ax = drawn["ax"]
    assert ax.get_position().width > 0.5  # half the canvas before (the empty right panel's slot kept)
    lines = {line.get_label(): line for line in ax.get_lines()}
    closed, simulated = lines["slab max, closed form (pool ÷ max_model_len)"], lines["slab max, simulated (sustained)"]
    assert np.array_equal(closed.get_ydata(), simulated.get_ydata())
    assert closed.get_markersize() > simulated.get_markersize() and closed.get_markerfacecolor() == "none"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1,024", "2,048", "4,096"]


def test_fleet_figure_names_each_trace_refused_and_draws_no_hit_rate_without_prompt_content():
    """Nothing sized: both traces' counts in words. Sized on Azure (lengths alone): no hit-rate bars (every one
    would be 0 with no reuse to find), the words say why; the TTFT bars are the two load routers'."""
    fig, axes = plt.subplots(1, 2)
    facts = {"unservable": True, "num_requests": 300, "max_model_len": 512,
             "passed_over": [{"name": "Mooncake", "num_too_long": 300}, {"name": "Azure conversation",
                                                                        "num_too_long": 180}]}
    fig_fleet(Section("fleet", "Fleet", {"fleet_routing": pd.DataFrame()}, facts), CFG, axes)
    assert axes[0].texts[0].get_text() == ("300 of 300 Mooncake, 180 of 300 Azure conversation prompts of "
                                           "max_model_len (512 tokens) or more:\nnot servable, no fleet sized")
    plt.close(fig)
    fig, axes = plt.subplots(1, 2)
    df = pd.DataFrame({"router": ["round_robin", "least_outstanding"], "replicas": [6, 6],
                       "prefix_cache_hit_rate": [0.0, 0.0], "ttft_p50_s": [0.17, 0.16], "ttft_p90_s": [0.52, 0.59]})
    fig_fleet(Section("fleet", "Fleet", {"fleet_routing": df}, {"trace": AZURE_CONV, "ttft_target_s": 2.0}), CFG,
              axes)
    assert not axes[0].patches and axes[0].texts[0].get_text().startswith("Azure conversation trace: lengths, no "
                                                                          "prompt content")
    assert [t.get_text() for t in axes[1].get_xticklabels()] == ["round robin", "least outstanding"]
    assert [bar.get_height() for bar in axes[1].patches] == [0.17, 0.16, 0.52, 0.59]
    plt.close(fig)


def test_load_figure_has_real_rates_and_the_slo_line():
    df = pd.DataFrame({"rate": [0.25, 1.0, 4.0], **{f"{m}_{p}_s": [0.1, 0.5, 9.0] for m in ("ttft", "tpot")
                                                     for p in ("p50", "p90", "p99")}})
    fig, axes = plt.subplots(1, 2)
    fig_load(Section("load", "Load", {"load_curves": df}), CFG, axes)
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["0.25", "1", "4"]
    slo = [line for line in axes[0].get_lines() if line.get_label().startswith("SLO")]
    assert len(slo) == 1 and list(slo[0].get_ydata()) == [2.0, 2.0]
    assert slo[0].get_label() == "SLO: TTFT p90 ≤ 2 s"
    for ax in axes:  # legends speak English: no table column names
        assert not {t.get_text() for t in ax.get_legend().get_texts()} & set(df.columns)
    plt.close(fig)


def study(dtype="auto", tp=1):
    engine = SimpleNamespace(kv_cache_dtype=dtype, tensor_parallel_size=tp)
    return SimpleNamespace(base=SimpleNamespace(engine=engine), gpu=SimpleNamespace(name="h100-80gb"),
                           mean_kv_len=1500.4, max_model_len=8192)


def sections(gpus_for_slo=6.0, failing=4.9):
    quant = pd.DataFrame({"kv_cache_dtype": ["auto", "fp8"], "simulated_sustained_running": [72.94, 109.76]})
    rates = pd.DataFrame({"allocator": ["slab-max", "paged"], "max_rate_meeting_slo": [0.44, 4.7568],
                          "first_failing_rate": [0.46, failing]})
    fleet = pd.DataFrame({"router": ["round_robin", "least_outstanding"], "replicas_for_slo": [4.0, 3.0],
                          "gpus_for_slo": [8.0, gpus_for_slo], "cost_per_hour_for_slo": [9.0, 7.5]})
    return [Section("fp8", "", {"kv_quantization": quant}), Section("paging", "", {"sustained_rate": rates}),
            Section("fleet", "", {"fleet_routing": fleet}, {"ttft_target_s": 2.0, "num_requests": 300, "trace": MOONCAKE,
                                                            "max_replicas": 64})]


def test_summary_quotes_the_tables():
    assert summary_lines(sections(), study(tp=2), CFG) == [
        "**73 users fit on one replica (2× h100-80gb, tensor parallel)** at a time (sustained concurrency while "
        "saturated, 1,500 tokens per sequence on average, max_model_len 8,192); 110 with fp8 KV.",
        "**One replica (2× h100-80gb, tensor parallel) serves 4.76 requests/s** of this scenario's traffic with "
        "TTFT p90 ≤ 2 s (Poisson arrivals asked at that rate; 4.9 requests/s misses it).",
        "**6 GPUs (3 replicas) for the Mooncake trace's first 300 requests** at TTFT p90 ≤ 2 s "
        "(least-outstanding routing, $7.50 per hour)."]


def test_summary_says_what_it_does_not_know():
    lines = summary_lines(sections(gpus_for_slo=float("nan"), failing=float("nan")), study(), CFG)
    assert "serves at least 4.76 requests/s" in lines[1]
    assert lines[2].startswith("**More than 64 replicas for the Mooncake trace's first 300 requests**")
    renamed = sections()
    renamed[0].tables["kv_quantization"] = renamed[0].tables["kv_quantization"].rename(
        columns={"simulated_sustained_running": "sustained_running"})
    assert len(summary_lines(renamed, study(), CFG)) == 2  # a renamed column drops its line, never fails
    assert summary_markdown([], study(), CFG) == []


def test_html_has_the_summary_box_and_tables_that_fit():
    md = ["# Report", "", *summary_markdown(sections(), study(), CFG),
          "| closed_form_paged_at_mean_len | limited_by |", "|---|---|", "| 63 | kv |", ""]
    body = _markdown_to_html(md)
    assert body.count("<div class='summary'>") == 1 and body.count("<li><b>") == 3
    assert "<th>closed_<wbr>form_<wbr>paged_<wbr>at_<wbr>mean_<wbr>len</th>" in body
    assert "overflow-x:auto" not in STYLE.split("pre{")[0] and "display:block" not in STYLE


@pytest.mark.parametrize("column", ["simulated_paged_sustained", "vllm_max_concurrency"])
def test_a_missing_column_leaves_its_line_out(column):
    sec = context_section()
    sec.tables["context_concurrency"] = sec.tables["context_concurrency"].drop(columns=[column])
    fig, axes = plt.subplots(1, 2)
    fig_context(sec, CFG, axes)
    assert len(axes[0].get_lines()) == 4
    plt.close(fig)


def _rendered(renderable, width):
    from rich.console import Console

    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_terminal_tables_never_break_a_header_or_value_mid_word():
    """kvsim plan's ten columns at 80 columns: rich folded `lower_bound_replicas` into `lower_` / `bound_` /
    `replic` / `as`. Too wide a table becomes one field/value table per row; a wide terminal keeps the table."""
    from kvsim.results.render import rows_to_rich

    row = {"rank": 1, "candidate": "h100-80gb tp1", "replicas": 12, "lower_bound_replicas": 6, "num_gpus": 12,
           "cost_per_hour": 9.36, "headroom": 0.07, "verified": True, "limiting_factor": "kv_cache_usage_perc",
           "price_source": "list on-demand price as of 2026-03-10"}
    narrow = _rendered(rows_to_rich([row, {**row, "rank": 2}], title="kvsim plan", width=80), 80)
    words = {w for key, value in row.items() for w in (key, *str(value).split())}
    found = set(narrow.replace("│", " ").split())
    assert {"lower_bound_replicas", "limiting_factor", "kv_cache_usage_perc", "h100-80gb", "2026-03-10"} <= found
    assert words - {"1", "True", "9.36", "0.07", "12", "6"} <= found  # every header and word whole
    assert "(2 of 2)" in narrow and max(len(line) for line in narrow.splitlines()) <= 80
    wide = _rendered(rows_to_rich([row], title="kvsim plan", width=250), 250)
    assert "(1 of 1)" not in wide and "lower_bound_replicas" in wide


def _fleet_summary(num_replicas: int) -> dict:
    """A fleet summary of `num_replicas` H100 replicas; replica i has i + 1 requests and TTFT p90 (i + 1) ms."""
    rows = [{"replica": i, "gpu": "h100-80gb", "num_requests": i + 1, "mean_running": 2.0, "kv_cache_usage_mean": 0.25,
             "num_preemptions": 0, "prefix_cache_hit_rate": 0.5, "ttft_p90_s": (i + 1) / 1000, "tpot_p90_s": 0.006,
             "e2e_p90_s": 2.5} for i in range(num_replicas)]
    return {"num_replicas": num_replicas, "num_gpus": num_replicas, "router": "least_kv", "num_finished": 10,
            "num_requests": 10, "duration_s": 60.0, "ttft_s": {"p90": 0.02}, "tpot_s": {"p90": 0.006},
            "prefix_cache_hit_rate": 0.5, "per_replica": rows}


def test_a_small_fleet_prints_every_replica_whole_at_80_columns():
    from kvsim.results.render import fleet_table

    text = _rendered(fleet_table(_fleet_summary(4)), 80)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert "on h100-80gb" in text and "4 ms" in text and "25.0%" in text and "2.5 s" in text


def test_a_large_fleet_prints_its_spread_across_replicas():
    from kvsim.results.render import fleet_table

    text = _rendered(fleet_table(_fleet_summary(16)), 80)
    lines = {line.split()[0]: line.split() for line in text.splitlines() if line.split()[:1] in (["min"], ["p50"],
                                                                                              ["max"])}
    # requests 1..16: min 1, median 8.5, max 16; TTFT p90 1..16 ms likewise
    assert lines["min"][1] == "1" and lines["p50"][1] == "8.5" and lines["max"][1] == "16"
    assert "1 ms" in " ".join(lines["min"]) and "8.5 ms" in " ".join(lines["p50"])
    assert "16 ms" in " ".join(lines["max"])
    assert "…" not in text and "replicas.csv" in text and len(text.splitlines()) < 16


def test_an_autoscaled_fleet_says_what_was_billed_beside_the_replicas_it_ever_used():
    """16 slots ever ready but 3.57 GPU-hours billed over an hour (3.67 GPUs on average): the title's 16 GPUs is
    not the bill, so the caption gives the billed figures, under the spread and under the rows alike."""
    from kvsim.results.render import fleet_table

    for size in (4, 16):
        summary = {**_fleet_summary(size), "autoscaling": {"gpu_hours": 3.574, "mean_gpus": 3.669}}
        text = " ".join(_rendered(fleet_table(summary), 80).split())
        assert "billed 3.57 GPU-hours, 3.67 GPUs on average" in text
    assert "billed" not in _rendered(fleet_table(_fleet_summary(16)), 80)


def _fp8_section(blocks_auto, blocks_fp8, limited_by):
    rows = [{"kv_cache_dtype": d, "bytes_per_block": per_block, "num_gpu_blocks": blocks,
             "closed_form_paged_at_mean_len": blocks / 10, "simulated_sustained_running": running,
             "tpot_mean_s_at_base_rate": None, "limited_by": limited_by}
            for d, per_block, blocks, running in (("auto", 2 * 2**20, blocks_auto, 40.0),
                                                  ("fp8", 2**20, blocks_fp8, 40.0))]
    return Section("fp8", "t", {"kv_quantization": pd.DataFrame(rows)})


def test_fp8_with_a_fixed_block_count_says_the_pool_keeps_its_blocks():
    """engine.num_gpu_blocks_override fixes the count: fp8 halves the bytes per block (2 MiB -> 1 MiB) and the
    pool keeps 6,000 blocks. The words said "6,000 blocks instead of 6,000", and that the saturated runs, capped
    by max_num_seqs, understated what fp8 buys, which at as many blocks is nothing."""
    from kvsim.report.text import fp8_text

    text = fp8_text(_fp8_section(6000, 6000, "max_num_seqs"))
    assert text.startswith("fp8 KV stores 2.0× fewer bytes per block, but the pool has 6,000 blocks either way (a "
                           "fixed block count, `engine.num_gpu_blocks_override`: fp8 leaves memory unused rather "
                           "than adding blocks), and sustained concurrency changes by 1.00× (40 → 40)")
    assert "instead of" not in text and "understates" not in text
    sized = fp8_text(_fp8_section(6000, 12000, "max_num_seqs"))  # sized from memory: twice the blocks
    assert sized.startswith("fp8 KV stores 2.0× fewer bytes per block: 12,000 blocks instead of 6,000, and")
    assert "understates what fp8 buys a KV-bound engine (the closed form: 2.00× the sequences)" in sized
