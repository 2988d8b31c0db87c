"""The least prompt and output a traffic can have at any run length (`kvsim.workload.least_lengths`), which the
plan's latency floor (`kvsim.planning.slo_floor`) rests on: each expectation by hand from the workload's
definition (what each distribution can draw, the output cap prompt + output ≤ max_model_len, a conversation's
first turn behind its system prompt), never from drawn requests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvsim.fleet.run import simulate_scenario
from kvsim.planning.slo_floor import slo_floor, unreachable_slos
from kvsim.workload.generate import build_requests
from kvsim.workload.least_lengths import LeastLengths, least_lengths
from kvsim.workload.scenario import load_scenario, make_scenario

FIXED = {"dist": "fixed", "value": 100}
OUT = {"dist": "uniform", "low": 50, "high": 60}


def lengths_scenario(prompt: dict, output: dict, **workload) -> dict:
    return {"name": "least", "latency": {"model": "constant", "step_s": 0.01},
            "workload": {"num_requests": 5, "arrival": {"process": "poisson", "rate": 1.0}, "prompt_len": prompt,
                         "output_len": output, **workload}}


@pytest.mark.parametrize(("prompt", "output", "workload", "max_model_len", "least"), [
    # fixed: its value; 1000 + 500 > 1200, so every reply is cut to 1200 - 1000 = 200
    ({"dist": "fixed", "value": 300}, {"dist": "fixed", "value": 9}, {}, 1024, (300, 9)),
    ({"dist": "fixed", "value": 1000}, {"dist": "fixed", "value": 500}, {}, 1200, (1000, 200)),
    # uniform: its low; a 900-token prompt leaves 124 > 50, a 1023-token one (of 100 … 2000) leaves 1
    ({"dist": "uniform", "low": 100, "high": 900}, OUT, {}, 1024, (100, 50)),
    ({"dist": "uniform", "low": 100, "high": 2000}, OUT, {}, 1024, (100, 1)),
    # a 200-token system prompt in front of half: 100 without it; 823 behind it is 1023, leaving 1
    ({"dist": "uniform", "low": 100, "high": 900}, OUT, {"shared_prefix": {"tokens": 200, "fraction": 0.5}}, 1024,
     (100, 1)),
    # in front of all: 300 the least; 700 + 200 = 900 the longest, leaving 124 of 150 … 160
    ({"dist": "uniform", "low": 100, "high": 700}, {"dist": "uniform", "low": 150, "high": 160},
     {"shared_prefix": {"tokens": 200, "fraction": 1.0}}, 1024, (300, 124)),
    # in front of none: 900 the longest, leaving 124
    ({"dist": "uniform", "low": 100, "high": 900}, OUT, {"shared_prefix": {"tokens": 200, "fraction": 0.0}}, 1024,
     (100, 50)),
    # lognormal: every length from 1 is drawn with a positive probability, whatever the mean
    ({"dist": "lognormal", "mean": 1024, "p99": 6000}, {"dist": "lognormal", "mean": 256, "p99": 1024}, {}, 8192,
     (1, 1)),
    # three turns of 100 + 50: turn 2's prompt is 100 + 50 + 100 + 50 + 100 = 400 (20 left of 420), turn 0's 100
    (FIXED, {"dist": "fixed", "value": 50}, {"num_requests": 6, "multi_turn": {"turns": 3}}, 4096, (100, 50)),
    (FIXED, {"dist": "fixed", "value": 50}, {"num_requests": 6, "multi_turn": {"turns": 3}}, 420, (100, 20)),
    # under 201, turn 1 (100 + 50 + 100; a prompt and a reply token in front of its own at least, 201) is rejected
    (FIXED, {"dist": "fixed", "value": 50}, {"num_requests": 6, "multi_turn": {"turns": 3}}, 201, (100, 50)),
], ids=["fixed", "fixed-capped", "uniform", "uniform-capped", "prefix-half", "prefix-all", "prefix-none",
        "lognormal", "turns", "turns-capped", "turns-rejected"])
def test_each_distribution_kinds_least_lengths(prompt, output, workload, max_model_len, least):
    scenario = make_scenario(lengths_scenario(prompt, output, **workload))
    assert least_lengths(scenario, max_model_len) == LeastLengths(*least)


@pytest.mark.parametrize(("max_model_len", "least"), [(4096, (7, 9)), (505, (7, 5)), (400, (7, 9)), (7, None)])
def test_an_empirical_tables_columns_give_its_least_lengths(tmp_path, max_model_len, least):
    """Prompts {7, 30, 500}, outputs {9, 12, 40}, resampled apart: 7 and 9 the least; under max_model_len 505 a
    500-token prompt leaves 5, under 400 the longest servable is 30 (370 left, no cut); at 7 none is servable."""
    table = tmp_path / "t.csv"
    table.write_text("num_prefill_tokens,num_decode_tokens\n30,12\n500,9\n7,40\n")
    scenario = make_scenario(lengths_scenario({"dist": "empirical", "table": str(table), "column": "prompt"},
                                              {"dist": "empirical", "table": str(table), "column": "output"}))
    assert least_lengths(scenario, max_model_len) == (LeastLengths(*least) if least else None)


def test_no_servable_request_proves_no_floor():
    scenario = make_scenario(lengths_scenario({"dist": "fixed", "value": 2000}, OUT))
    assert least_lengths(scenario, 1024) is None


def test_the_default_traffic_floor_is_one_step_as_a_long_run_can_draw_one_token():
    """The default scenario's lognormal outputs: its first 1,000 draws' least is 21 tokens, yet any longer run
    can draw 1 (a verification run of 10,000 or more came to 1 over 320,000): the E2E floor is one step."""
    scenario = load_scenario(None)
    assert scenario.workload.output_len is not None and scenario.workload.output_len.dist == "lognormal"
    floor = slo_floor(scenario)
    assert floor is not None and floor.e2e_s == floor.step_s


def sharegpt_rows(rows: list[tuple[float, int, int]]) -> str:
    return "".join(json.dumps({"arrival_time_ns": int(t * 1e9), "input_toks": p, "output_toks": o}) + "\n"
                   for t, p, o in rows)


def trace_scenario(path, num_requests: int, start_s: float = 0.0) -> dict:
    return {"name": "tr", "latency": {"model": "constant", "step_s": 0.01}, "engine": {"max_model_len": 1024},
            "workload": {"num_requests": num_requests, "arrival": {"process": "trace"},
                         "trace": {"format": "sharegpt_tokens", "path": str(path), "start_s": start_s}}}


def test_a_traces_later_rows_bound_the_floor_and_a_long_run_meets_what_the_first_rows_refused(tmp_path):
    """4 rows of 64-token replies, then 40 of 2, one a second. The base traffic (4 requests) has no reply under 64
    tokens, and the floor was taken over it: 64 steps of 10 ms, so `plan` called e2e_s.p50 <= 0.1 s unreachable by
    any fleet. A run of all 44 (as a plan's longer probes take them) meets it: 40 of its 44 requests are alone on
    one replica and end in 2 steps. The least reply any run can take is 2 tokens: the floor is 2 steps."""
    path = tmp_path / "t.jsonl"
    path.write_text(sharegpt_rows([(i, 16, 64) for i in range(4)] + [(4 + i, 16, 2) for i in range(40)]))
    base = make_scenario(trace_scenario(path, 4))
    assert min(r.output_len for r in build_requests(base, 1024, np.random.default_rng(0))) == 64  # the old floor's
    slo = {"e2e_s.p50": 0.1}
    long_run = simulate_scenario(make_scenario(trace_scenario(path, 44))).requests
    assert np.median(np.asarray(long_run["e2e_s"], float)) <= slo["e2e_s.p50"]
    floor = slo_floor(base)
    assert floor is not None and floor.e2e_s == pytest.approx(2 * 0.01)
    assert unreachable_slos(floor, slo) == {}


def test_a_traces_rows_before_start_s_are_no_runs(tmp_path):
    """A 1-token reply at 0 s, then 5-token ones from 1 s: from start_s 0.5 no run takes the first row."""
    path = tmp_path / "t.jsonl"
    path.write_text(sharegpt_rows([(0.0, 3, 1)] + [(1.0 + i, 16, 5) for i in range(3)]))
    assert least_lengths(make_scenario(trace_scenario(path, 1, start_s=0.5)), 1024) == LeastLengths(16, 5)
    assert least_lengths(make_scenario(trace_scenario(path, 1)), 1024) == LeastLengths(3, 1)


def test_a_trace_rows_reply_is_cut_to_fit_and_a_prompt_of_max_model_len_is_no_servable_request(tmp_path):
    """Under max_model_len 1024: 1000 + 100 tokens is cut to 24 of reply; a 1024-token prompt is rejected (its one
    token of reply would not fit), so its reply counts for nothing."""
    path = tmp_path / "t.jsonl"
    path.write_text(sharegpt_rows([(0.0, 1000, 100), (1.0, 16, 50), (2.0, 1024, 1)]))
    assert least_lengths(make_scenario(trace_scenario(path, 1)), 1024) == LeastLengths(16, 24)


def test_a_conversations_first_turns_of_a_trace_give_its_least_prompt(tmp_path):
    """Two-turn conversations over rows in order: rows 0 and 2 are first turns (prompts 40, 30), rows 1 and 3 follow
    with their conversation's history in front, so row 1's 8 tokens are never a prompt alone: the least is 30.
    A later turn's prompt is at most 40 + 50 (longest prompt, reply) + 40: 130, leaving 1024 - 130 > 3."""
    path = tmp_path / "t.jsonl"
    path.write_text(sharegpt_rows([(0.0, 40, 3), (1.0, 8, 3), (2.0, 30, 50), (3.0, 9, 4)]))
    raw = trace_scenario(path, 4)
    raw["workload"]["multi_turn"] = {"turns": 2}
    assert least_lengths(make_scenario(raw), 1024) == LeastLengths(30, 3)
