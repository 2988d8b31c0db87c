"""`kvsim validate`: readers of measured runs and vLLM bench JSON, the replay, the error table.

Tiny worlds first: two requests on a constant 10 ms step, where every simulated time is known
by hand (request 0: 16-token prompt at t=0, 5 output tokens; request 1: 32-token prompt at
t=0.015, 3 tokens). Then the validation set (its subset shipped in benchmarks/validation_set): the readers must reproduce LLMServingSim's
own summary.txt (its vLLM column from the raw timestamps, its Sim column from sim.csv).
"""

import json
import math
import re
from datetime import datetime
from pathlib import Path

import pytest
from conftest import VALIDATION_SET
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.model.errors import KvsimError
from kvsim.validation.compare import request_stats, validate, write_validation
from kvsim.validation.measured import load_measured, read_llmservingsim, read_measured_dir, request_frame

STARTED = "2026-01-01T00:00:00Z"
EPOCH = datetime.fromisoformat(STARTED.replace("Z", "+00:00")).timestamp()
CONSTANT = ["latency.model=constant", "latency.step_s=0.01"]
CASES = VALIDATION_SET / "measured" / "RTXPRO6000"


def write_run(root: Path, expert_parallel: bool = False, output_1: int = 3) -> Path:
    """A measured-run folder in the validation layout, its workload two levels up."""
    run = root / "measured" / "GPUX" / "case"
    (run / "vllm").mkdir(parents=True)
    (root / "workloads").mkdir()
    meta = {"model": "meta-llama/Llama-3.1-8B", "dataset_path": "workloads/w.jsonl", "started_at": STARTED,
            "engine_kwargs": {"model": "meta-llama/Llama-3.1-8B", "tensor_parallel_size": 1, "max_num_seqs": 4,
                              "max_num_batched_tokens": 64, "max_model_len": None, "kv_cache_dtype": "auto",
                              "data_parallel_size": 2 if expert_parallel else 1,
                              "enable_expert_parallel": expert_parallel}}
    (run / "vllm" / "meta.json").write_text(json.dumps(meta))
    rows = [  # engine clock starts at 100 s; the wall clock 0.5 s after started_at
        {"request_id": "bench-0", "input_toks": 16, "output_toks": 5, "arrival_time": EPOCH + 0.5,
         "queued_ts": 100.0, "scheduled_ts": 100.0, "first_token_ts": 100.01, "last_token_ts": 100.05},
        {"request_id": "bench-1", "input_toks": 32, "output_toks": output_1, "arrival_time": EPOCH + 0.515,
         "queued_ts": 100.015, "scheduled_ts": 100.02, "first_token_ts": 100.05, "last_token_ts": 100.09},
    ]
    (run / "vllm" / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "vllm" / "timeseries.csv").write_text(
        "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n1.0,48,8,0,0,0.0\n")
    workload = [{"input_toks": 16, "output_toks": 5, "arrival_time_ns": 0, "input_tok_ids": list(range(16)),
                 "output_tok_ids": list(range(100, 105))},
                {"input_toks": 32, "output_toks": 3, "arrival_time_ns": 15_000_000,
                 "input_tok_ids": list(range(16)) + list(range(200, 216)), "output_tok_ids": [1, 2, 3]}]
    (root / "workloads" / "w.jsonl").write_text("".join(json.dumps(w) + "\n" for w in workload))
    return run


def test_measured_folder_gives_vllm_definitions_on_the_engine_clock(tmp_path):
    run = read_measured_dir(write_run(tmp_path))
    df = run.requests
    assert list(df.arrival_s) == pytest.approx([0.0, 0.015])
    assert list(df.ttft_s) == pytest.approx([0.01, 0.035])           # first token − queued
    assert list(df.e2e_s) == pytest.approx([0.05, 0.075])            # last token − queued
    assert list(df.tpot_s) == pytest.approx([0.04 / 4, 0.04 / 2])    # (last − first) / (output − 1)
    assert [r.arrival_s for r in run.records] == pytest.approx([0.0, 0.015])  # queued_ts, not the workload's
    assert run.records[1].token_ids == tuple(range(16)) + tuple(range(200, 216)) + (1, 2, 3)
    assert run.engine == {"tensor_parallel_size": 1, "max_num_seqs": 4, "max_num_batched_tokens": 64,
                          "kv_cache_dtype": "auto", "data_parallel_size": 1, "enable_expert_parallel": False}
    # the series' t counts from started_at; the first request arrived 0.5 s after it
    assert run.timeseries is not None and run.timeseries.t_s.tolist() == pytest.approx([0.5])
    assert math.isnan(run.timeseries.kv_usage[0])
    assert any("not recorded" in n for n in run.notes)
    assert run.hardware == "GPUX" and run.peer is None


def test_a_series_that_cannot_be_aligned_says_so(tmp_path):
    """Without started_at (or the requests' arrival_time) the series cannot be placed on the request clock:
    it is read from the first arrival, and a note says so; with both, no such note."""
    run_dir = write_run(tmp_path)
    assert not any("taken to start at the first arrival" in n for n in read_measured_dir(run_dir).notes)
    meta_path = run_dir / "vllm" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["started_at"]
    meta_path.write_text(json.dumps(meta))
    run = read_measured_dir(run_dir)
    assert run.timeseries is not None and run.timeseries.t_s.tolist() == pytest.approx([1.0])
    assert any("taken to start at the first arrival" in n for n in run.notes)


def test_workload_that_is_not_the_runs_is_refused(tmp_path):
    run_dir = write_run(tmp_path, output_1=4)
    with pytest.raises(KvsimError, match=r"line 2 has 32\+3 tokens .* 32\+4: not this run's workload"):
        read_measured_dir(run_dir)


def test_missing_workload_names_the_flag(tmp_path):
    run_dir = write_run(tmp_path)
    (tmp_path / "workloads" / "w.jsonl").unlink()
    with pytest.raises(KvsimError, match="--workload"):
        read_measured_dir(run_dir)


def test_replay_on_a_constant_step_matches_the_hand_timeline(tmp_path):
    # kvsim, with vLLM 0.19's default async scheduling: request 0 prefills in [0, .01) (first token .01)
    # and decodes to .05; request 1 arrives at .015, but the step at .02 was planned at .01, before it
    # arrived: it joins the step at .03 (first token .04) and its 3 tokens end at .06.
    v = validate(load_measured(write_run(tmp_path)), gpu="h100-80gb", overrides=CONSTANT)
    sim = v.result.requests
    assert list(sim.ttft_s) == pytest.approx([0.01, 0.025])
    assert list(sim.e2e_s) == pytest.approx([0.05, 0.045])
    assert list(sim.tpot_s) == pytest.approx([0.01, 0.01])
    ttft = v.row("TTFT mean (s)")
    assert ttft["measured"] == pytest.approx((0.01 + 0.035) / 2)
    assert ttft["kvsim"] == pytest.approx((0.01 + 0.025) / 2)
    assert ttft["kvsim_error_pct"] == pytest.approx((0.0175 - 0.0225) / 0.0225 * 100)
    assert v.row("makespan (s)")["measured"] == pytest.approx(0.09)
    assert v.row("makespan (s)")["kvsim"] == pytest.approx(0.06)
    # TTFT's parts, vLLM's way: queue = scheduled − queued, prefill = first token − scheduled. Measured:
    # (0, .005) and (.01, .03). kvsim: request 1's step at .03 was planned, and so scheduled, at .02
    assert v.row("queue time mean (s)")["measured"] == pytest.approx(0.005 / 2)
    assert v.row("prefill time mean (s)")["measured"] == pytest.approx((0.01 + 0.03) / 2)
    assert v.row("queue time mean (s)")["kvsim"] == pytest.approx(0.005 / 2)
    assert v.row("prefill time mean (s)")["kvsim"] == pytest.approx((0.01 + 0.02) / 2)
    assert v.row("output tokens/s")["kvsim"] == pytest.approx(8 / 0.06)
    assert v.row("KV usage mean")["measured"] is None and v.row("KV usage mean")["kvsim_error_pct"] is None
    # the second request's prompt starts with the first's 16 tokens: one full block, a real prefix hit
    assert list(sim.prefix_hit_tokens) == [0, 16]
    assert v.scenario.engine.max_num_seqs == 4 and v.scenario.engine.max_num_batched_tokens == 64
    assert v.scenario.engine.resolved_async_scheduling


def test_replay_without_async_scheduling_plans_each_step_when_it_starts(tmp_path):
    # the same run with `async_scheduling: false` in its engine arguments (vLLM before late 2025): request 1
    # arrives at .015, joins the step at .02 (first token .03) and finishes at .05
    run_dir = write_run(tmp_path)
    meta = json.loads((run_dir / "vllm" / "meta.json").read_text())
    meta["engine_kwargs"]["async_scheduling"] = False
    (run_dir / "vllm" / "meta.json").write_text(json.dumps(meta))
    v = validate(load_measured(run_dir), gpu="h100-80gb", overrides=CONSTANT)
    assert list(v.result.requests.ttft_s) == pytest.approx([0.01, 0.015])
    assert list(v.result.requests.e2e_s) == pytest.approx([0.05, 0.035])
    assert list(v.result.requests.queue_s) == pytest.approx([0.0, 0.005])  # scheduled when its step starts
    assert v.row("makespan (s)")["kvsim"] == pytest.approx(0.05)


def test_replay_reads_enforce_eager_from_the_engine_arguments(tmp_path):
    # vLLM's default (absent: false) runs CUDA graphs, whose padding the replay prices; `true` turns them off
    run_dir = write_run(tmp_path)
    assert not validate(load_measured(run_dir), gpu="h100-80gb", overrides=CONSTANT).scenario.engine.enforce_eager
    meta = json.loads((run_dir / "vllm" / "meta.json").read_text())
    meta["engine_kwargs"]["enforce_eager"] = True
    (run_dir / "vllm" / "meta.json").write_text(json.dumps(meta))
    assert validate(load_measured(run_dir), gpu="h100-80gb", overrides=CONSTANT).scenario.engine.enforce_eager


def test_the_shared_moe_case_replays_within_the_targets():
    """Qwen3-30B-A3B, DP 2 with expert parallelism on two RTX PRO 6000s, with the imported profile
    (its moe.csv): TTFT, TPOT and E2E means within 10 % of the measured run, TPOT within 5 %."""
    profile = VALIDATION_SET / "profiles" / "RTXPRO6000" / "Qwen" / "Qwen3-30B-A3B-Instruct-2507" / "bf16"
    v = validate(load_measured(CASES / "Qwen3-30B-A3B-Instruct-2507"), latency="calibrated", profile=profile)
    assert v.scenario.engine.data_parallel_size == 2 and v.scenario.engine.enable_expert_parallel
    assert set(v.result.requests["dp_rank"]) == {0, 1}
    errors = {r["metric"]: r["kvsim_error_pct"] for r in v.rows}
    for metric in ("TTFT mean (s)", "TPOT mean (s)", "E2E mean (s)"):
        assert abs(errors[metric]) < 10, (metric, errors[metric])
    assert abs(errors["TPOT mean (s)"]) < 5


def run_dir_of(root: Path) -> Path:
    return root / "measured" / "GPUX" / "case"


def test_cli_writes_tables_figures_and_a_rerunnable_scenario(tmp_path):
    write_run(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["validate", str(run_dir_of(tmp_path)), "--gpu", "h100-80gb", "-o", str(out),
                                      "--format", "json", *sum((["--set", s] for s in CONSTANT), [])])
    assert result.exit_code == 0, result.output
    for name in ("validation.md", "validation.json", "errors.csv", "fig_timeseries.png", "fig_latency_cdf.png",
                 "sim/scenario.yaml", "sim/workload.jsonl", "sim/requests.csv"):
        assert (out / name).is_file(), name
    saved = json.loads((out / "validation.json").read_text())
    assert saved["case"] == "case" and saved["rows"][0]["metric"] == "TTFT mean (s)"
    rerun = CliRunner().invoke(app, ["run", str(out / "sim" / "scenario.yaml"), "-o", str(tmp_path / "rerun"),
                                     "--format", "json"])
    assert rerun.exit_code == 0, rerun.output
    assert json.loads(rerun.output)["ttft_s"]["mean"] == pytest.approx(0.0175)  # the hand timeline's

    # --no-figures (in the same test: the figures run above is its reference) leaves out the PNGs, their links
    # and their names in the output's list, and changes no other byte
    bare = tmp_path / "bare"
    result = CliRunner().invoke(app, ["validate", str(run_dir_of(tmp_path)), "--gpu", "h100-80gb", "-o", str(bare),
                                      "--no-figures", *sum((["--set", s] for s in CONSTANT), [])])
    assert result.exit_code == 0, result.output
    outs = {"--figures": out, "--no-figures": bare}
    files = {flag: {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
             for flag, out in outs.items()}
    pngs = {"fig_timeseries.png", "fig_latency_cdf.png"}
    assert pngs <= files["--figures"].keys() and not pngs & files["--no-figures"].keys()
    links = b"\n![running, waiting, KV usage](fig_timeseries.png)\n\n![latency CDFs](fig_latency_cdf.png)\n"
    with_figures = files["--figures"].pop("validation.md")
    assert with_figures.count(links) == 1
    assert files["--no-figures"].pop("validation.md") == with_figures.replace(links, b"")
    listed = {flag: json.loads(f.pop(".kvsim-output"))["files"] for flag, f in files.items()}  # kvsim's own files
    assert listed["--no-figures"] == [name for name in listed["--figures"] if name not in pngs]
    assert {k: v for k, v in files["--figures"].items() if k not in pngs} == files["--no-figures"]


def test_cli_bad_path_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "nope")])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "no such file" in result.output
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "vllm/meta.json" in result.output


# -- vllm bench serve --save-result --save-detailed -------------------------------------------

def bench_json(path: Path, **changes) -> Path:
    """The fields vLLM's vllm/benchmarks/serve.py writes; the third request failed."""
    raw = {"model_id": "meta-llama/Llama-3.1-8B", "request_rate": 10.0, "burstiness": 1.0,
           "input_lens": [16, 32, 8], "output_lens": [5, 3, 0], "ttfts": [0.01, 0.02, 0.0],
           "itls": [[0.01] * 4, [0.02, 0.02], []], "latencies": [0.05, 0.06, 0.0],
           "start_times": [1000.0, 1000.015, 1000.02], "errors": ["", "", "timeout"], **changes}
    path.write_text(json.dumps(raw))
    return path


def test_bench_json_reader(tmp_path):
    run = load_measured(bench_json(tmp_path / "bench.json"))
    assert run.source == "vllm-bench" and len(run.requests) == 2
    assert list(run.requests.ttft_s) == pytest.approx([0.01, 0.02])
    assert list(run.requests.e2e_s) == pytest.approx([0.05, 0.06])
    assert list(run.requests.tpot_s) == pytest.approx([(0.05 - 0.01) / 4, (0.06 - 0.02) / 2])
    assert [r.arrival_s for r in run.records] == pytest.approx([0.0, 0.015])
    assert any("1 failed" in n for n in run.notes)
    # without latencies, E2E is TTFT plus the inter-token gaps
    run = load_measured(bench_json(tmp_path / "b2.json", latencies=None))
    assert list(run.requests.e2e_s) == pytest.approx([0.05, 0.06])


def test_bench_json_without_start_times_resamples_at_the_rate(tmp_path):
    run = load_measured(bench_json(tmp_path / "b.json", start_times=None, request_rate="inf"))
    assert [r.arrival_s for r in run.records] == [0.0, 0.0]
    assert any("no start_times" in n for n in run.notes)


def test_bench_json_without_detail_is_refused(tmp_path):
    with pytest.raises(KvsimError, match="ttfts is missing: save the result with --save-detailed"):
        load_measured(bench_json(tmp_path / "b.json", ttfts=None))


def test_bench_json_validates_end_to_end(tmp_path):
    v = validate(load_measured(bench_json(tmp_path / "bench.json")), model="llama-3.1-8b", gpu="h100-80gb",
                 overrides=CONSTANT)
    assert list(v.result.requests.ttft_s) == pytest.approx([0.01, 0.025])  # as the folder's hand timeline
    assert v.row("TTFT mean (s)")["measured"] == pytest.approx(0.015)
    assert "llmservingsim" not in v.rows[0]
    write_validation(v, tmp_path / "out", figures=False)  # the Markdown is what this test reads
    markdown = (tmp_path / "out" / "validation.md").read_text()
    assert "| running mean | not recorded |" in markdown  # a bench file has no time series
    assert "client-side timings" in markdown


# -- the validation set ------------------------------------------------------------------

def summary_txt(case: str) -> dict[str, tuple[float, float]]:
    """LLMServingSim's table: 'TTFT Mean  7097.2  6815.7  -4.0%' → {'TTFT Mean': (7097.2, 6815.7)} (ms)."""
    rows = {}
    for line in (CASES / case / "validation" / "summary.txt").read_text().splitlines():
        m = re.match(r"^(\w+ \w+)\s+([\d.]+)\s+([\d.]+)\s+[-+][\d.]+%$", line)
        if m:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return rows


@pytest.mark.parametrize("case", ["Llama-3.1-8B", "Qwen3-32B", "Qwen3-30B-A3B-Instruct-2507"])
def test_readers_reproduce_llmservingsims_own_summary(case):
    table = summary_txt(case)
    assert len(table) == 15
    run = read_measured_dir(CASES / case)
    peer = read_llmservingsim(CASES / case / "outputs" / "sim.csv")
    assert len(run.requests) == 300 and peer is not None and len(peer) == 300
    measured, predicted = request_stats(run.requests), request_stats(peer)
    for label, ours in (("TTFT", "TTFT"), ("TPOT", "TPOT"), ("Latency", "E2E")):
        for which, key in (("Mean", "mean"), ("Median", "p50"), ("P90", "p90"), ("P99", "p99")):
            vllm_ms, sim_ms = table[f"{label} {which}"]
            assert measured[f"{ours} {key} (s)"] * 1e3 == pytest.approx(vllm_ms, abs=0.051), (label, which)
            assert predicted[f"{ours} {key} (s)"] * 1e3 == pytest.approx(sim_ms, abs=0.051), (label, which)


def test_request_frame_rebases_on_the_first_arrival():
    import numpy as np

    df = request_frame(np.array([5.0, 3.0]), np.array([6.0, 4.0]), np.array([9.0, 5.0]), np.array([1, 1]),
                       np.array([4, 1]))
    assert list(df.arrival_s) == [0.0, 2.0]      # sorted by arrival
    assert list(df.tpot_s[:1].isna()) == [True]  # one output token: no TPOT
    assert df.tpot_s[1] == pytest.approx(1.0)


def test_qwen3_32b_preset_matches_the_published_config():
    # huggingface.co/Qwen/Qwen3-32B config.json: 64 layers, 64 heads, 8 KV heads, explicit head_dim 128
    # (q_proj is 5120 -> 64*128 = 8192, wider than hidden), 32.8B parameters per the model card.
    from kvsim.model.capacity import kv_bytes_per_token
    from kvsim.model.config import load_model
    from kvsim.model.engine_config import make_engine

    model = load_model("qwen3-32b")
    assert (model.num_layers, model.num_attention_heads, model.num_kv_heads, model.head_dim) == (64, 64, 8, 128)
    assert kv_bytes_per_token(model, make_engine()) == 2 * 64 * 8 * 128 * 2                    # 256 KiB
    assert kv_bytes_per_token(model, make_engine(tensor_parallel_size=2)) == 2 * 64 * 4 * 128 * 2
    assert model.num_params == pytest.approx(32.8e9, rel=0.01)


def test_request_gauges_by_hand():
    import numpy as np
    import pandas as pd

    from kvsim.validation.compare import request_gauges

    # request a: arrives 0, scheduled 1, done 3; request b: arrives 0.5, scheduled 2.5, done 4
    df = pd.DataFrame({"arrival_s": [0.0, 0.5], "first_scheduled_s": [1.0, 2.5], "finish_s": [3.0, 4.0]})
    g = request_gauges(df, np.array([0.0, 1.0, 2.0, 2.5, 3.0, 4.0]))
    assert g["running"].tolist() == [0, 1, 1, 2, 1, 0]
    assert g["waiting"].tolist() == [1, 1, 1, 0, 0, 0]


def test_measured_series_share_the_request_clock():
    # vLLM's once-a-second gauges, rebuilt from the per-request timestamps, agree when the series is
    # shifted by (first arrival_time − started_at), and agree worse half a second either way.
    import numpy as np

    from kvsim.validation.compare import request_gauges

    run = read_measured_dir(CASES / "Llama-3.1-8B")
    ts = run.timeseries

    def mismatch(shift_s):
        g = request_gauges(run.requests, ts.t_s.to_numpy() + shift_s)
        return float(np.abs(g["running"] - ts.running).mean())

    assert mismatch(0.0) < 0.5
    assert mismatch(0.0) < mismatch(0.5) and mismatch(0.0) < mismatch(-0.5)


def test_peer_gauges_fill_the_llmservingsim_column():
    v_rows = {r["metric"]: r for r in validate(read_measured_dir(CASES / "Llama-3.1-8B"), overrides=CONSTANT).rows}
    assert v_rows["running max"]["llmservingsim"] == 128  # max_num_seqs caps the peer too
    assert v_rows["waiting max"]["llmservingsim"] > 0
    assert v_rows["KV usage mean"]["llmservingsim"] is None


@pytest.mark.parametrize(("changes", "message"), [
    ({"ttfts": [0.01, "soon", 0.0]}, r"ttfts\[1\]='soon' is not a number"),
    ({"input_lens": [16, 0, 8]}, r"input_lens\[1\]=0 is not a whole number of tokens >= 1"),
    ({"start_times": [1000.0, None, 1000.02]}, r"start_times\[1\]=None is not a number"),
    ({"latencies": None, "itls": [[0.01] * 4, "x", []]}, "itls must hold one list"),
    ({"output_lens": [5, 3]}, "output_lens has 2 entries, input_lens has 3"),
])
def test_bench_json_bad_fields_are_named(tmp_path, changes, message):
    with pytest.raises(KvsimError, match=message):
        load_measured(bench_json(tmp_path / "b.json", **changes))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda run: _patch_json(run / "vllm" / "meta.json", started_at="yesterday"), "started_at='yesterday'"),
    (lambda run: _patch_json(run / "vllm" / "meta.json", engine_kwargs=[]), "expected an object with engine_kwargs"),
    (lambda run: (run / "vllm" / "requests.jsonl").write_text('{"queued_ts": "x"}\n'), r"queued_ts='x' is not a number"),
    (lambda run: (run / "vllm" / "timeseries.csv").write_text("t,running\n1,2\n"), "expected columns t, running"),
])
def test_measured_folder_bad_fields_are_named(tmp_path, edit, message):
    run_dir = write_run(tmp_path)
    edit(run_dir)
    result = CliRunner().invoke(app, ["validate", str(run_dir), "--gpu", "h100-80gb", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert re.search(message, result.output), result.output
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_engine_arguments_are_checked_by_name(tmp_path):
    run_dir = write_run(tmp_path)
    meta = json.loads((run_dir / "vllm" / "meta.json").read_text())
    meta["engine_kwargs"]["max_num_seqs"] = -1
    (run_dir / "vllm" / "meta.json").write_text(json.dumps(meta))
    result = CliRunner().invoke(app, ["validate", str(run_dir), "--gpu", "h100-80gb", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "max_num_seqs" in result.output


def _patch_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_bench_json_counts_failures_and_empty_replies_apart(tmp_path):
    """vLLM's client (vllm/benchmarks/lib/endpoint_request_func.py) sets a TTFT at the first streamed chunk with a
    token and one gap a chunk after it; `calculate_metrics` saves 0 output tokens for a failure, and for a success
    without usage the tokenizer's count of its text (0 for an empty one), while its means count that success.
    Request 1 succeeded with 0 tokens counted but streamed 1 + 2 chunks: 3 tokens, measured and replayed. Request
    2 failed before any token (TTFT 0): neither. Request 3's stream broke after 1 + 1 chunks: it was in the engine,
    so it is replayed with its 8-token prompt and 2 tokens, and measured on neither side. Request 4, a success
    with no chunk (a 200 with no data), has no first token: left out of both sides."""
    run = load_measured(bench_json(
        tmp_path / "bench.json", input_lens=[16, 32, 8, 8, 8], output_lens=[5, 0, 0, 0, 0],
        ttfts=[0.01, 0.02, 0.0, 0.03, 0.0], itls=[[0.01] * 4, [0.02, 0.02], [], [0.01], []],
        latencies=[0.05, 0.06, 0.0, 0.04, 0.0], start_times=[1000.0, 1000.015, 1000.02, 1000.025, 1000.03],
        errors=["", "", "timeout", "broken stream", ""]))
    assert list(run.requests.request_index) == [0, 1] and list(run.requests.output_tokens) == [5, 3]
    assert run.record_index == (0, 1, 3)
    assert [(r.prompt_len, r.output_len) for r in run.records] == [(16, 5), (32, 3), (8, 2)]
    assert [r.arrival_s for r in run.records] == pytest.approx([0.0, 0.015, 0.025])
    for start in ("1 failed requests (errors) that had streamed tokens are replayed",
                  "1 failed requests (errors) with no token received left out",
                  "1 successful requests counted as 0 output tokens streamed some",
                  "1 successful requests with no token received left out"):
        assert sum(n.startswith(start) for n in run.notes) == 1, start


def test_measured_statistics_leave_out_the_requests_kvsim_rejected(tmp_path):
    """Three successes; the third's 3,000-token prompt exceeds the replay's max_model_len of 1,024, so kvsim
    rejects it. Its measured TTFT (0.5 s) was in the measured mean, (0.01 + 0.02 + 0.5) / 3 = 0.1767 s, against
    kvsim's mean over the other two: the measured mean is now theirs, (0.01 + 0.02) / 2 = 0.015 s."""
    path = bench_json(tmp_path / "bench.json", input_lens=[16, 32, 3000], output_lens=[5, 3, 4],
                      ttfts=[0.01, 0.02, 0.5], itls=[[0.01] * 4, [0.02, 0.02], [0.01] * 3],
                      latencies=[0.05, 0.06, 0.53], errors=["", "", ""])
    v = validate(load_measured(path), model="llama-3.1-8b", gpu="h100-80gb",
                 overrides=[*CONSTANT, "engine.max_model_len=1024"])
    assert v.result.summary["num_rejected"] == 1
    assert v.row("TTFT mean (s)")["measured"] == pytest.approx(0.015)
    assert v.row("E2E mean (s)")["measured"] == pytest.approx(0.055)
    assert any("the measured statistics leave the same requests out" in n for n in v.notes)


def test_kvsims_column_leaves_out_the_requests_it_rejected(tmp_path):
    """max_model_len=24 rejects request 1 (a 32-token prompt). kvsim's TTFT parts are request 0's alone, as the
    measured ones are: scheduled on arrival at 0 and first token at 0.01 (one constant 0.01 s step), so queue
    0 and prefill 0.01 on both sides. The rejected row, never scheduled, emptied kvsim's parts (None)."""
    v = validate(load_measured(write_run(tmp_path)), gpu="h100-80gb", overrides=[*CONSTANT, "engine.max_model_len=24"])
    assert v.result.summary["num_rejected"] == 1
    assert v.row("queue time mean (s)")["kvsim"] == pytest.approx(0.0)
    assert v.row("prefill time mean (s)")["kvsim"] == pytest.approx(0.01)


def test_kvsims_makespan_starts_at_its_first_served_arrival(tmp_path):
    """The first request's 3,000-token prompt exceeds max_model_len=1,024: both makespans start at the second
    request's send, 0.015 s after the first's (the measured one ends with the third at 1000.02 + 0.06 = 1000.08 s,
    after the second's 1000.015 + 0.06)."""
    path = bench_json(tmp_path / "bench.json", input_lens=[3000, 16, 32], output_lens=[4, 5, 3],
                      ttfts=[0.5, 0.01, 0.02], itls=[[0.01] * 3, [0.01] * 4, [0.02, 0.02]],
                      latencies=[0.53, 0.06, 0.06], errors=["", "", ""])
    v = validate(load_measured(path), model="llama-3.1-8b", gpu="h100-80gb",
                 overrides=[*CONSTANT, "engine.max_model_len=1024"])
    sim = v.result.requests
    assert list(sim.status) == ["rejected", "finished", "finished"]
    assert v.row("makespan (s)")["measured"] == pytest.approx(0.08 - 0.015)
    assert v.row("makespan (s)")["kvsim"] == pytest.approx(sim.finish_s.max() - 0.015)
