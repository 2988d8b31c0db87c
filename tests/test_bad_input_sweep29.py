"""Bad input found by the twenty-ninth sweep (the commands' options at their edges, `--set` on every section, settings
valid alone that conflict, the Python API, whether a result says it is whole). Each is refused (the CLI: exit 2, one
line naming the field and the value, nothing written; the Python API: a `KvsimError`), or said as it is.

Found: a v0 request that fits the KV pool but not beside v0's free-block watermark (vLLM v0's `can_allocate`:
AllocStatus.NEVER) was rejected as "needs more KV slots than the pool's N", a request needing N or fewer. A chat
client that waits for each reply (`multi_turn.timing: after_reply`) drops a conversation whose turn was rejected, as
vLLM's multi-turn benchmark client does: its later turns were never sent, and the summary ("2 finished, 2 rejected
of 4") read as a whole run of the 4 of 8 requests asked, without a word. `kvsim plan --slo ttft_s.p90=1e400` (and
`--gpu-hourly-cost GPU=1e400`) was refused as `plan.slo.ttft_s.p90=inf`, a value never written. A size with a bare
lowercase letter (`--kv-cache-memory-bytes 12g`) was read as 12 GiB, where vLLM's `human_readable_int` reads it as
12·10**9 B (lowercase decimal, uppercase binary): a KV pool 7 % larger than the same flag gives vLLM. The fleet
APIs' `simulate_autoscaled` given no Scenario, or one without an autoscaler, stopped with an AttributeError or an
AssertionError (its siblings `simulate_fleet` and `simulate_disagg` name them), and all three ran every invariant
check for `check="no"` (truthy text), which `kvsim.simulate` refuses; a `progress` that is no function of three
arguments (`progress=5`) stopped them at the first report with a TypeError traceback. `kvsim report --set
workload.num_requests=N` reached no run without a word: every study runs request counts of its own.
"""

from __future__ import annotations

import logging
import re

import pytest

import kvsim
from kvsim.model.errors import KvsimError
from tests.conftest import one_line_exit_2

TINY_V0 = {"engine": {"scheduler": "v0", "max_model_len": 8192, "num_gpu_blocks_override": 600, "watermark": 0.9},
           "latency": {"model": "constant"}, "steps": "none",
           "workload": {"num_requests": 2, "prompt_len": {"dist": "fixed", "value": 2000},
                        "output_len": {"dist": "fixed", "value": 10}}}


def test_a_v0_request_that_fits_the_pool_but_not_beside_the_watermark_names_the_watermark():
    """600 blocks of 16 tokens: 9,600 slots (v0 has no null block). The watermark keeps int(0.9 · 600) = 540 blocks,
    8,640 slots, free; a 2,000-token prompt holds cdiv(2,000, 16) = 125 blocks, 2,000 slots: it fits the 9,600 but
    not the 960 beside the watermark, so vLLM v0 never admits it (9,600 − 2,000 < 8,640)."""
    summary = kvsim.simulate(TINY_V0).summary
    assert summary["reject_reasons"] == {"needs more KV slots than the pool's 9600 less the watermark's 8640": 2}


def test_a_v0_request_is_refused_for_its_prompt_alone():
    """Two samples of a 4,800-token prompt each answering 3,000 tokens would hold 300 + 2 · 188 = 676 blocks, more
    than the 600 of the pool, but vLLM v0 cannot know the output: `can_allocate` counts the prompt's 300 blocks
    (one sequence: samples fork after the prefill), which fit the pool, not beside the watermark's 540."""
    summary = kvsim.simulate(TINY_V0, workload__n=2, workload__prompt_len={"dist": "fixed", "value": 4800},
                             workload__output_len={"dist": "fixed", "value": 3000}).summary
    assert summary["reject_reasons"] == {"needs more KV slots than the pool's 9600 less the watermark's 8640": 2}


CHATS = {"engine": {"max_model_len": 300}, "latency": {"model": "constant"}, "steps": "none",
         "workload": {"num_requests": 8, "multi_turn": {"turns": 4, "think_time_s": 1.0, "timing": "after_reply"},
                      "prompt_len": {"dist": "fixed", "value": 200}, "output_len": {"dist": "fixed", "value": 100}}}
UNSENT = ("workload.multi_turn.timing=after_reply: 4 of 8 turns were never sent (a rejected turn ends its "
          "conversation, as vLLM's multi-turn benchmark client drops it); the run has the 4 sent")


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("kvsim")]


def test_turns_a_rejected_turn_left_unsent_are_said_in_one_warning(caplog):
    """Two conversations of four turns (8 requests). Turn 1: 200 + 100 = 300 tokens, max_model_len itself: served.
    Turn 2's prompt is the conversation so far, 300 + 200 = 500 >= 300: rejected, so turns 3 and 4 of each
    conversation are never sent: 4 of 8 unsent, the run (2 finished, 2 rejected) has the 4 sent."""
    with caplog.at_level(logging.WARNING, logger="kvsim"):
        summary = kvsim.simulate(CHATS).summary
    assert (summary["num_requests"], summary["num_finished"], summary["num_rejected"]) == (4, 2, 2)
    assert _warnings(caplog) == [UNSENT]


def test_a_fleet_of_chats_says_it_too_and_a_whole_run_says_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="kvsim"):
        kvsim.simulate(CHATS, replicas=2, router={"policy": "least_kv"})
        assert _warnings(caplog) == [UNSENT]
        caplog.clear()
        # max_model_len 1,024: turns 1-3 end at 300, 600 and 900 tokens; turn 4's prompt, 900 + 200 = 1,100, is
        # rejected, but no turn follows it: all 8 sent, nothing to say
        summary = kvsim.simulate(CHATS, engine__max_model_len=1024).summary
        assert (summary["num_requests"], summary["num_rejected"]) == (8, 2) and not _warnings(caplog)


def test_the_cli_prints_the_line_beside_the_summary(tmp_path):
    """`kvsim run` prints the library's warnings as `kvsim: warning: ...` lines on stderr (exit 0)."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    result = CliRunner().invoke(app, ["run", "--set", "engine.max_model_len=300", "--set", "latency.model=constant",
                                      "--set", "steps=none", "--set", "workload.num_requests=8", "--set",
                                      "workload.multi_turn={turns: 4, think_time_s: 1, timing: after_reply}", "--set",
                                      "workload.prompt_len={dist: fixed, value: 200}", "--set",
                                      "workload.output_len={dist: fixed, value: 100}", "-o", str(tmp_path / "out")],
                                prog_name="kvsim")
    assert result.exit_code == 0 and f"kvsim: warning: {UNSENT}" in result.stderr


@pytest.mark.parametrize(("slo", "cost", "expected"), [
    ("1e400", "2", "--slo ttft_s.p90='1e400': expected seconds, a finite number"),
    ("nan", "2", "--slo ttft_s.p90='nan': expected seconds, a finite number"),
    ("2", "1e400", "--gpu-hourly-cost h100-80gb='1e400': expected a price per hour, a finite number"),
    ("2", "-Infinity", "--gpu-hourly-cost h100-80gb='-Infinity': expected a price per hour, a finite number"),
])
def test_a_plan_number_past_a_float_is_named_as_written(slo, cost, expected, tmp_path):
    """float('1e400') is inf: the line names the text the user gave, not `inf`, and the flag, not the spec field."""
    out = tmp_path / "out"
    assert one_line_exit_2(["plan", "--gpu", "h100-80gb", "--slo", f"ttft_s.p90={slo}", "--gpu-hourly-cost",
                            f"h100-80gb={cost}", "-o", str(out)]) == expected and not out.exists()


@pytest.mark.parametrize(("text", "expected"), [
    ("12g", 12 * 10**9), ("12G", 12 * 2**30), ("1k", 10**3), ("1K", 2**10), ("2m", 2 * 10**6), ("2M", 2 * 2**20),
    ("1t", 10**12), ("1T", 2**40), ("2.5g", 25 * 10**8),  # vLLM: `25.6k` -> 25,600
    ("12gb", 12 * 10**9), ("12gib", 12 * 2**30), ("12 GiB", 12 * 2**30),  # units of more letters: any case
])
def test_a_bare_size_letter_is_read_by_its_case_as_vllm_reads_it(text, expected):
    """vllm/engine/arg_utils.py `human_readable_int` (the type of --kv-cache-memory-bytes): decimal multipliers
    k, m, g, t = 10**3 ... 10**12, binary K, M, G, T = 2**10 ... 2**40; its docstring: '1k' -> 1,000, '1K' -> 1,024."""
    from kvsim.model.engine_config import make_engine

    assert make_engine(kv_cache_memory_bytes=text).kv_cache_memory_bytes == expected


def test_capacity_of_12g_is_the_pool_of_12_gigabytes():
    """Llama-3.1-8B: 2 · 32 layers · 8 KV heads · 128 · 2 B = 131,072 B a token, 2,097,152 B a 16-token block;
    12·10**9 B hold floor(5,722.05) = 5,722 blocks (12 GiB would hold 6,144)."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    result = CliRunner().invoke(app, ["capacity", "--kv-cache-memory-bytes", "12g", "--max-model-len", "8192",
                                      "--context-lengths", "8192"], prog_name="kvsim")
    assert result.exit_code == 0 and "= 5,722 blocks" in result.stdout


SMALL = {"workload": {"num_requests": 2, "prompt_len": {"dist": "fixed", "value": 16},
                      "output_len": {"dist": "fixed", "value": 2}}, "latency": {"model": "constant"}, "steps": "none"}


@pytest.mark.parametrize(("scenario", "said"), [
    (None, "scenario=None: expected a Scenario"),
    ({"replicas": 2}, "scenario={'replicas': 2}: expected a Scenario"),
    (SMALL, "autoscaler: not set, so no autoscaled fleet; use kvsim.simulate, which runs any scenario"),
])
def test_simulate_autoscaled_names_a_scenario_it_cannot_run(scenario, said):
    from kvsim.fleet.autoscaled import simulate_autoscaled
    from kvsim.workload.scenario import make_scenario

    with pytest.raises(KvsimError, match="^" + re.escape(said)):
        simulate_autoscaled(make_scenario(scenario) if scenario is SMALL else scenario)


@pytest.mark.parametrize("api", ["fleet", "disagg", "autoscaled"])
def test_the_fleet_apis_take_check_as_true_or_false_only(api):
    from kvsim.fleet.autoscaled import simulate_autoscaled
    from kvsim.fleet.disagg import simulate_disagg
    from kvsim.fleet.driver import simulate_fleet
    from kvsim.workload.scenario import make_scenario

    fleets = {"fleet": (simulate_fleet, {"replicas": 2, "router": {"policy": "least_kv"}}),
              "disagg": (simulate_disagg, {"kv_transfer_config": {"kv_connector": "NixlConnector"},
                                           "replicas": [{"kv_role": "kv_producer"}, {"kv_role": "kv_consumer"}]}),
              "autoscaled": (simulate_autoscaled, {"replicas": 1, "router": {"policy": "least_kv"}, "autoscaler": {
                  "metric": "num_requests_waiting", "target": 2, "min_replicas": 1, "max_replicas": 2}})}
    simulate, fields = fleets[api]
    with pytest.raises(KvsimError, match=r"^check='no': expected True or False$"):
        simulate(make_scenario({**SMALL, **fields}), check="no")


@pytest.mark.parametrize("progress", [5, "x", lambda done: None])
def test_the_fleet_apis_refuse_a_progress_that_is_no_function_of_three_arguments(progress):
    from kvsim.fleet.driver import simulate_fleet
    from kvsim.workload.scenario import make_scenario

    with pytest.raises(KvsimError, match=r"^progress=.*: expected a function \(simulated_s, done, total\) or None$"):
        simulate_fleet(make_scenario({**SMALL, "replicas": 2, "router": {"policy": "least_kv"}}), progress=progress)


@pytest.mark.parametrize(("argv", "count"), [
    (["--set", "workload.num_requests=1000"], 200),
    (["--quick", "--set", "workload={num_requests: 5, prompt_len: {dist: fixed, value: 64}, output_len: "
      "{dist: fixed, value: 8}}"], 60),
])
def test_report_refuses_a_request_count_it_would_replace(argv, count, tmp_path):
    """`Study` makes its base with `workload.num_requests=cfg.num_requests` (200, --quick 60) and every other study
    sets its own count (rate searches, fleet, offload): a count given with --set is never read."""
    out = tmp_path / "out"
    line = one_line_exit_2(["report", *argv, "-o", str(out)])
    assert line.endswith(f": kvsim report runs each study with request counts of its own ({count} a run at each "
                         "load here, longer for its rate searches), so it would reach no run; drop it")
    assert line.startswith("--set 'workload") and not out.exists()
