"""Per-request trace columns: a priority column beside the class mix, and acceptance lengths for speculative
decoding. Timelines and counts are worked out by hand in each test."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import kvsim
from kvsim.cli import app
from kvsim.model.errors import KvsimError
from kvsim.planning.spec import check_slo_classes, make_plan_spec
from kvsim.validation.compare import PHASE_METRICS, simulated_phase_rates
from kvsim.workload.generate import build_requests
from kvsim.workload.scenario import make_scenario
from kvsim.workload.traces import TraceColumns, read_azure, read_lengths, read_mooncake

COLUMNS = TraceColumns(priority="prio", acceptance="accepted")


def mooncake(path, rows):
    """A Mooncake JSONL: (timestamp ms, input length, output length, extra keys) per row, one hash id each."""
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": m, "hash_ids": [i],
                                        **extra}) + "\n" for i, (t, n, m, extra) in enumerate(rows)))
    return path


def test_jsonl_and_csv_rows_carry_priority_and_acceptance_lengths(tmp_path):
    jsonl = mooncake(tmp_path / "m.jsonl", [(0, 16, 4, {"prio": 2, "accepted": [4, 1]}),
                                             (5, 16, 4, {"prio": "-1", "accepted": []})])
    first, second = read_mooncake(jsonl, COLUMNS)
    assert (first.priority, first.acceptance_lengths) == (2, (4, 1))
    assert (second.priority, second.acceptance_lengths) == (-1, ())
    assert read_mooncake(jsonl)[0].priority == 0 and read_mooncake(jsonl)[0].acceptance_lengths is None
    table = tmp_path / "l.csv"
    table.write_text('num_prefill_tokens,num_decode_tokens,prio,accepted\n10,5,1,"[3, 1;2]"\n12,6, 0 ,4\n')
    assert [(r.priority, r.acceptance_lengths) for r in read_lengths(table, COLUMNS)] == [(1, (3, 1, 2)), (0, (4,))]
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,prio\n2023-11-16 18:15:46.6805900,10,5,3\n")
    assert read_azure(azure, TraceColumns(priority="prio"))[0].priority == 3


@pytest.mark.parametrize(("extra", "needle"), [
    ({"prio": "high", "accepted": [1]}, "m.jsonl:1: priority column prio='high' is not an integer"),
    ({"prio": 1.5, "accepted": [1]}, "priority column prio=1.5 is not an integer"),
    ({"prio": True, "accepted": [1]}, "priority column prio=True is not an integer"),
    # a row without the column: told missing, with the row's keys (it read as a None the file does not hold)
    ({"accepted": [1]}, "m.jsonl:1: no priority column 'prio' (the row has 'timestamp,input_length,output_length,"
                        "hash_ids,accepted')"),
    ({"prio": 0}, "m.jsonl:1: no acceptance column 'accepted' (the row has 'timestamp,input_length,output_length,"
                  "hash_ids,prio')"),
    ({"prio": None, "accepted": [1]}, "priority column prio=None is not an integer"),  # there, and null
    ({"prio": 0, "accepted": [2, 0]}, "acceptance column accepted: 0 is not an acceptance length"),
    ({"prio": 0, "accepted": "two"}, "acceptance column accepted: 'two' is not an acceptance length"),
    ({"prio": 0, "accepted": 3}, "acceptance column accepted=3 is not a list of integers"),
])
def test_a_bad_column_value_names_file_line_column_and_value(tmp_path, extra, needle):
    path = mooncake(tmp_path / "m.jsonl", [(0, 16, 4, extra)])
    with pytest.raises(KvsimError) as info:
        read_mooncake(path, COLUMNS)
    assert needle in str(info.value)


def trace_scenario(path, engine=None, **trace):
    return make_scenario({"name": "cols", "engine": {"max_model_len": 2048, "num_gpu_blocks_override": 200,
                                                     **(engine or {})},
                          "workload": {"num_requests": 10, "arrival": {"process": "trace"},
                                       "trace": {"format": "mooncake", "path": str(path), **trace}},
                          "latency": {"model": "constant", "step_s": 0.01}})


def test_priority_column_orders_the_queue(tmp_path):
    """Three requests at t = 0 with priorities 2, 0, 1 and room for one at a time: served 1, 2, 0."""
    path = mooncake(tmp_path / "m.jsonl", [(0, 16, 2, {"prio": 2}), (0, 16, 2, {"prio": 0}), (0, 16, 2, {"prio": 1})])
    scenario = trace_scenario(path, {"scheduling_policy": "priority", "max_num_seqs": 1}, priority_column="prio")
    assert [r.priority for r in build_requests(scenario, 2048, np.random.default_rng(0))] == [2, 0, 1]
    result = kvsim.simulate(scenario, check=True)
    order = np.argsort(result.requests["first_scheduled_s"].to_numpy(), kind="stable")
    assert list(order) == [1, 2, 0]
    assert set(result.summary["by_priority"]) == {"0", "1", "2"}
    check_slo_classes(scenario, make_plan_spec({"slo": {"ttft_s.p90@7": 1.0}, "gpus": ["h100-80gb"]}))  # any


def test_acceptance_lengths_drive_each_verify_step_then_the_model(tmp_path):
    """K = 3 n-gram drafts, the model accepting none (synthetic length 1), the trace [4, 1, 3] for a reply of
    10 tokens, 10 ms a step: step 1 prefills and samples token 1; verify steps emit 4 (tokens 2-5), 1 (6),
    3 (7-9); the trace is spent, so the model's 1 gives token 10 in step 5: finish at 50 ms (100 ms without
    the trace). Drafts: 3 in each of the 4 verify steps = 12; accepted 3 + 0 + 2 + 0 = 5; mean acceptance
    length 1 + 5 / 4 = 2.25."""
    path = mooncake(tmp_path / "m.jsonl", [(0, 16, 10, {"accepted": [4, 1, 3]})])
    spec = {"method": "ngram", "num_speculative_tokens": 3, "synthetic_acceptance_length": 1}
    with_trace = kvsim.simulate(trace_scenario(path, {"speculative_config": spec}, acceptance_column="accepted"),
                                check=True)
    assert with_trace.requests["finish_s"].iloc[0] == pytest.approx(0.05)
    sd = with_trace.summary["spec_decode"]
    assert (sd["num_drafts"], sd["num_draft_tokens"], sd["num_accepted_tokens"]) == (4, 12, 5)
    assert sd["mean_acceptance_length"] == pytest.approx(2.25)
    model_only = kvsim.simulate(trace_scenario(path, {"speculative_config": spec}), check=True)
    assert model_only.requests["finish_s"].iloc[0] == pytest.approx(0.10)


def test_the_generation_rate_counts_every_token_a_verify_step_emits(tmp_path):
    """The same reply at 0.3 s a step: token 1 at 0.3, verify steps emitting 4, 1, 3 and 1 tokens end at 0.6,
    0.9, 1.2 and 1.5. vLLM's logger counts every sampled token, 10; running is sampled at t = 1 (1) and t = 2
    (0): 10 / 1 generated tokens/s per running request (the step rows' one per verifying sequence gave 5)."""
    path = mooncake(tmp_path / "m.jsonl", [(0, 16, 10, {"accepted": [4, 1, 3]})])
    spec = {"method": "ngram", "num_speculative_tokens": 3, "synthetic_acceptance_length": 1}
    raw = trace_scenario(path, {"speculative_config": spec}, acceptance_column="accepted").model_dump(mode="json")
    raw["latency"] = {"model": "constant", "step_s": 0.3}
    result = kvsim.simulate(make_scenario(raw), check=True)
    assert simulated_phase_rates(result.steps, result.requests)[PHASE_METRICS[1]] == pytest.approx(10.0)


def test_an_acceptance_length_past_the_drafts_is_capped_at_them(tmp_path):
    """K = 3: a trace step of 9 tokens accepts the 3 drafts and the bonus token, 4 tokens, as vLLM can."""
    path = mooncake(tmp_path / "m.jsonl", [(0, 16, 5, {"accepted": [9]})])
    spec = {"method": "ngram", "num_speculative_tokens": 3, "synthetic_acceptance_length": 1}
    result = kvsim.simulate(trace_scenario(path, {"speculative_config": spec}, acceptance_column="accepted"))
    assert result.requests["finish_s"].iloc[0] == pytest.approx(0.02)  # prefill (token 1), one verify (2-5)
    assert result.summary["spec_decode"]["num_accepted_tokens"] == 3


@pytest.mark.parametrize(("raw", "needle"), [
    ({"trace": {"format": "vllm_sharegpt", "path": "x.json", "priority_column": "p"}},
     "priority_column='p': format=vllm_sharegpt has no per-request columns"),
    ({"trace": {"format": "mooncake", "path": "x.jsonl", "priority_column": "p"},
      "priority": {"classes": [{"name": "a", "priority": 0, "weight": 1}]}},
     "give priority (a class mix) or trace.priority_column='p', not both"),
    ({"trace": {"format": "mooncake", "path": "x.jsonl", "acceptance_column": "a"}},
     "acceptance_column='a' needs engine.speculative_config"),
])
def test_column_settings_are_checked(raw, needle):
    with pytest.raises(KvsimError) as info:
        make_scenario({"workload": {"arrival": {"process": "trace"}, **raw}})
    assert needle in str(info.value)


def test_cli_refuses_a_text_priority_in_one_line_and_writes_nothing(tmp_path):
    path = mooncake(tmp_path / "m.jsonl", [(0, 16, 4, {"prio": "urgent"})])
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--set", "workload.arrival={process: trace}",
                                      "--set", f"workload.trace={{format: mooncake, path: {path}, priority_column: prio}}",
                                      "--set", "workload.prompt_len=null", "--set", "workload.output_len=null",
                                      "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert "priority column prio='urgent' is not an integer" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


def test_sampling_with_a_traced_acceptance_column_is_refused_in_one_line(tmp_path):
    """The column gives one reply's verify steps; n = 2 samples two replies, whose drafts are accepted apart."""
    path = mooncake(tmp_path / "m.jsonl", [(0, 16, 10, {"accepted": [4, 1, 3]})])
    spec = {"method": "ngram", "num_speculative_tokens": 3, "synthetic_acceptance_length": 1}
    with pytest.raises(KvsimError, match=r"^workload.n=2 with workload.trace.acceptance_column='accepted': ") as err:
        make_scenario({"engine": {"speculative_config": spec},
                       "workload": {"n": 2, "arrival": {"process": "trace"},
                                    "trace": {"format": "mooncake", "path": path, "acceptance_column": "accepted"}}})
    assert "\n" not in str(err.value)
