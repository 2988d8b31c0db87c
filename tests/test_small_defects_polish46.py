"""Small user-facing defects (polish46): a display helper and a config shortcut that raised Python's TypeError, a
JSONL trace's missing priority column read as a value, and a progress total that counted requests a short trace
does not hold. Each expectation follows from the rule, not from the code's output."""

import json

import numpy as np
import pytest

from kvsim.model.errors import KvsimError
from kvsim.model.units import counted
from kvsim.report.study_config import StudyConfig


@pytest.mark.parametrize(("args", "message"), [
    ((2, None), "noun=None: expected text"),
    ((None, "replica"), "count=None: expected an integer of at least 0"),  # said 'None replicas'
    ((2.5, "replica"), "count=2.5: expected an integer of at least 0"),
    ((True, "replica"), "count=True: expected an integer of at least 0"),
    ((-1, "replica"), "count=-1: expected an integer of at least 0"),
    ((2, "mouse", 3), "plural=3: expected text or None"),
])
def test_counted_refuses_a_bad_argument_in_one_line_naming_it(args, message):
    with pytest.raises(KvsimError) as caught:
        counted(*args)
    assert str(caught.value) == message


def test_counted_still_counts_plain_and_numpy_integers():
    assert (counted(1, "replica"), counted(0, "replica"), counted(np.int64(3), "GPU"), counted(2, "mouse", "mice")) \
        == ("1 replica", "0 replicas", "3 GPUs", "2 mice")


def test_quick_takes_knobs_over_its_own_and_refuses_an_unknown_one_as_the_constructor_does():
    assert StudyConfig.quick(workers=2) == StudyConfig.quick().model_copy(update={"workers": 2})
    assert StudyConfig.quick(workers=2).num_requests == 60  # the smoke run's own knobs stay
    with pytest.raises(KvsimError, match=r"^x: unknown key$"):  # was TypeError: unexpected keyword argument 'x'
        StudyConfig.quick(x=1)
    with pytest.raises(KvsimError, match=r"^num_requests=0: "):
        StudyConfig.quick(num_requests=0)


def mooncake_trace(path, num_rows: int) -> None:
    """`num_rows` Mooncake rows, 100 ms apart, of one 512-token block each."""
    rows = [{"timestamp": 100 * i, "input_length": 512, "output_length": 8, "hash_ids": [i]} for i in range(num_rows)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def trace_scenario(path, *more: str):
    """Llama-3.1-8B on an H200 replaying the trace at `path`, `num_requests` 10."""
    from kvsim.workload.scenario import load_scenario

    return load_scenario(None, ["model=llama-3.1-8b", "gpu=h200",
                                f"workload={{num_requests: 10, arrival: {{process: trace}}, "
                                f"trace: {{format: mooncake, path: '{path}'}}}}", *more])


def test_a_jsonl_row_without_the_priority_column_is_told_missing_with_the_file(tmp_path):
    import kvsim

    trace = tmp_path / "t.jsonl"
    mooncake_trace(trace, 3)
    scenario = trace_scenario(trace, "workload.trace.priority_column=nope", "engine.scheduling_policy=priority")
    with pytest.raises(KvsimError) as caught:  # was "priority column nope=None is not an integer"
        kvsim.simulate(scenario)
    assert str(caught.value) == f"{trace}:1: no priority column 'nope' (the row has " \
                                "'timestamp,input_length,output_length,hash_ids')"


@pytest.mark.parametrize("replicas", [None, 2])
def test_progress_counts_the_requests_a_short_trace_holds_not_num_requests(tmp_path, replicas):
    """3 rows, `num_requests` 10: the run sends 3, so every report's total is 3 and the last says 3/3 (it said
    10/10: seven requests done that never existed), on one engine and on a fleet alike."""
    import kvsim

    trace = tmp_path / "t.jsonl"
    mooncake_trace(trace, 3)
    calls = []
    more = [] if replicas is None else [f"replicas={replicas}"]
    kvsim.simulate(trace_scenario(trace, *more), progress=lambda sim_s, done, total: calls.append((done, total)))
    assert calls and {total for _, total in calls} == {3} and calls[-1] == (3, 3)


def azure_trace(path, num_rows: int) -> None:
    """`num_rows` Azure rows 100 ms apart (10 req/s): (num_rows - 1) / ((num_rows - 1) · 0.1 s) offered."""
    rows = "".join(f"2023-11-16 18:17:{i // 10:02d}.{i % 10}00,256,64\n" for i in range(num_rows))
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)


def test_plan_names_the_rate_it_sized_for_and_where_it_comes_from(tmp_path):
    """A Poisson scenario's rate is the one asked; a trace's is its run's arrivals, (n - 1) / span: 20 rows 0.1 s
    apart are 19 / 1.9 s = 10 req/s, and rate_scale 2 halves the span to 0.95 s, 20 req/s."""
    from kvsim.planning.plan_rate import sized_traffic
    from kvsim.workload.scenario import load_scenario, make_scenario

    assert sized_traffic(load_scenario(None, ["workload.arrival.rate=14"])) == \
        "14 req/s, Poisson arrivals at workload.arrival.rate"
    azure_trace(tmp_path / "t.csv", 20)
    raw = {"name": "t", "workload": {"num_requests": 20, "arrival": {"process": "trace"},
                                     "trace": {"format": "azure", "path": "t.csv"}}}
    assert sized_traffic(make_scenario(raw, tmp_path)) == "10 req/s, the arrivals of t.csv: its first 20 requests over 1.9 s"
    raw["workload"]["trace"]["rate_scale"] = 2
    assert sized_traffic(make_scenario(raw, tmp_path)) == \
        "20 req/s, the arrivals of t.csv: its first 20 requests over 0.95 s, times workload.trace.rate_scale=2"


def test_the_chosen_line_prints_prices_as_the_table_does():
    """One precision: the table's cells, 4 significant digits (47.686 is 47.69 there; the line said $47.686)."""
    from kvsim.cli.plan_command import chosen_text

    row = {"feasible": True, "candidate": "h100-80gb tp1", "replicas": 3, "topology": "colocated", "num_gpus": 3,
           "cost_per_hour": 143.058, "usd_per_million_output_tokens": 47.686}
    assert chosen_text([row]) == ("chosen: h100-80gb tp1 x3 (colocated): 3 GPUs, $143.1/hour, $47.69 per million "
                                  "output tokens")
