"""Bad input found by the bad42 sweep (the Python API the shipped notebooks and docs name, then scenario files, over
malformed arguments: wrong types, out-of-range and non-finite numbers, contradicting values). Each is refused before any
work with one `KvsimError` line naming the argument or field and its value; each test says what it was before.
"""

from __future__ import annotations

import math

import pytest

from kvsim.model.errors import KvsimError


def _refused(call, *named: str) -> str:
    """The one-line `KvsimError` `call()` raises, checked to name each of `named` (the argument and its value)."""
    with pytest.raises(KvsimError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message
    for text in named:
        assert text in message, (text, message)
    return message


@pytest.mark.parametrize(("slo", "named"), [({"ttft_s.p90": -1}, "ttft_s.p90=-1"), ({"ttft_s.p90": math.nan}, "=nan"),
                                            ({"ttft_s.p91": 1.0}, "'ttft_s.p91'"), ({"ttft_s.p90@x": 1.0}, "'x'")])
def test_a_bad_slo_is_kvsims_error(slo, named):
    """The rule asks for kvsim's error type from the API (a bare ValueError is not one; `KvsimError` still is a
    ValueError, so a pydantic validator that calls `check_slo` words it as before)."""
    from kvsim.planning.slo import probe_passes

    _refused(lambda: probe_passes({"verdict": "stable"}, slo), named)


@pytest.mark.parametrize("evidence", [{"verdict": "stable"}, {"verdict": "stable", "ttft_s": None},
                                      {"verdict": "stable", "ttft_s": {"p90": "fast"}}])
def test_evidence_without_the_slos_figure_is_refused_naming_the_slo(evidence):
    """A dict with a verdict but not window_evidence's figures was a KeyError, TypeError or ValueError in the SLO
    reader: it is refused naming the SLO it has no number for."""
    from kvsim.planning.slo import probe_passes

    _refused(lambda: probe_passes(evidence, {"ttft_s.p90": 1.0}), "evidence: no number for ttft_s.p90")


def _search(**given):
    from kvsim.planning.steady_state import search_rates

    def make(item, rate, num_requests):
        raise AssertionError("a probe was made before the arguments were checked")

    arguments = {"make": make, "num_items": 1, "slo": {}, "run": lambda scenarios: []}
    arguments.update(given)
    return lambda: search_rates(**arguments)


@pytest.mark.parametrize(("given", "named"), [
    ({"verify_factor": -1}, "verify_factor=-1"), ({"num_items": 1.5}, "num_items=1.5"),
    ({"num_items": -1}, "num_items=-1"), ({"num_requests": 0}, "num_requests=0"), ({"max_requests": "64"}, "'64'"),
    ({"max_verify_requests": True}, "max_verify_requests=True"), ({"start_rate": 0}, "start_rate=0"),
    ({"start_rate": math.inf}, "start_rate=inf"), ({"slo": {"ttft_s.p90": 0}}, "ttft_s.p90=0"),
    ({"make": None}, "make=None"), ({"run": 5}, "run=5"), ({"make": lambda: None}, "make=")])
def test_search_rates_checks_its_arguments_before_any_probe(given, named):
    """`verify_factor=-1` was refused only after a whole search, as a long run's negative `workload.num_requests`; a bad
    SLO limit after a round of probes; `num_items=1.5` and `make=None` were TypeErrors. `make` here fails the test if
    any probe is made."""
    _refused(_search(**given), named)


def test_search_rates_of_no_items_is_no_search():
    assert _search(num_items=0)() == []


@pytest.mark.parametrize("returned", [[], None, [{}, {}]])
def test_search_rates_refuses_a_run_that_returns_another_count(returned):
    """A notebook's `run` returning no list, or one of another length than the scenarios it was given, stopped in
    `zip(strict=True)` with a ValueError or a TypeError (or, unchecked, would pair probes with others' evidence)."""
    _refused(_search(make=lambda item, rate, num_requests: item, run=lambda scenarios: returned),
             f"run returned {returned!r}: expected a list of 1 window evidences")


@pytest.mark.parametrize("limit", ["8GiB", math.nan, -1, 0, 2.5, True])
def test_a_memory_limit_that_is_no_count_of_bytes_is_refused_naming_it(tmp_path, limit):
    """`memory_limit_bytes="8GiB"` was a TypeError, NaN ran with no limit and -1 was refused as the run being too
    large for it (naming `num_gpu_blocks`); nothing is written."""
    import kvsim
    from kvsim.fleet.run import simulate_scenario

    scenario = kvsim.load_scenario(None, ["workload.num_requests=2", "steps=none"])
    _refused(lambda: simulate_scenario(scenario, memory_limit_bytes=limit, out_dir=tmp_path / "run"),
             f"memory_limit_bytes={limit!r}")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", [None, 5, [], b"llama-3.1-8b"])
def test_a_model_or_gpu_that_is_no_name_is_refused_naming_it(value):
    """`load_model(None)` was an AttributeError in `blank_name`, `load_gpu([])` a TypeError (unhashable)."""
    from kvsim.model.config import load_gpu, load_model

    _refused(lambda: load_model(value), f"model={value!r}")
    _refused(lambda: load_gpu(value), f"gpu={value!r}")


def test_a_model_or_gpu_given_as_a_path_object_reads_as_its_text():
    from kvsim.model.config import PRESETS_DIR, load_model

    preset = PRESETS_DIR / "models" / "llama-3.1-8b.json"
    assert load_model(preset) == load_model(str(preset))


@pytest.mark.parametrize("reader", ["read_azure", "read_mooncake", "read_sharegpt_tokens", "read_lengths",
                                    "read_vllm_sharegpt"])
def test_a_trace_reader_refuses_a_path_it_cannot_read_naming_it(tmp_path, reader):
    """`read_mooncake(None)` (the colocated_disagg_offload notebook's reader) was a TypeError, a missing file a
    FileNotFoundError and a folder an IsADirectoryError traceback; every format's reader alike."""
    import kvsim.workload.traces as traces

    read = getattr(traces, reader)
    _refused(lambda: read(None), "path=None")
    _refused(lambda: read(7), "path=7")
    _refused(lambda: read(str(tmp_path / "missing.jsonl")), f"path='{tmp_path / 'missing.jsonl'}'", "file not found")
    _refused(lambda: read(tmp_path), f"path='{tmp_path}'", "is a directory")
    _refused(lambda: read(""), "path=''", "is empty")


@pytest.mark.parametrize(("records", "max_model_len", "named"), [
    (None, 8192, "records=None"), ("trace.jsonl", 8192, "records='trace.jsonl'"), ([1], 8192, "records[0]=1"),
    ([], -1, "max_model_len=-1"), ([], "8192", "max_model_len='8192'"), ([], 0, "max_model_len=0")])
def test_unbounded_hit_rate_refuses_what_is_no_trace_or_length(records, max_model_len, named):
    """A list of anything but trace records was an AttributeError; `max_model_len` -1 left every prompt out (0.0) and
    '8192' failed mid-loop with a TypeError."""
    from kvsim.report.fleet_study import unbounded_hit_rate

    _refused(lambda: unbounded_hit_rate(records, max_model_len), named)


def test_unbounded_hit_rate_of_two_requests_sharing_a_block():
    """By hand: the second prompt's first 512-token block is the first's, so 512 of 512 + 700 prompt tokens hit."""
    from kvsim.report.fleet_study import unbounded_hit_rate
    from kvsim.workload.traces import TraceRecord

    first = TraceRecord(0.0, 512, 1, ((("m", 1), 512),))
    second = TraceRecord(1.0, 700, 1, ((("m", 1), 512), (("m", 2), 188)))
    assert unbounded_hit_rate([first, second], 8192) == 512 / 1212


@pytest.mark.parametrize("study", [None, 5, "scenario.yaml"])
def test_speculation_refuses_what_is_no_study(study):
    """`speculation(scenario)` (the speculative_crossover notebook's study) was an AttributeError."""
    from kvsim.report.speculation_study import speculation

    _refused(lambda: speculation(study), f"st={study!r}")


def test_replica_groups_past_the_most_engines_are_refused_as_a_count_is():
    """`replicas: 4097` is refused (1..4096, `MAX_ENGINES`); groups of 4096 + 1 ran all 4,097 engines (over a
    minute for 5 requests). The sum is held to the same bound; a fleet at the bound is still a valid scenario."""
    from kvsim.workload.scenario import make_scenario

    def raw(*counts: int) -> dict:
        return {"name": "toy", "workload": {"num_requests": 2, "arrival": {"process": "poisson", "rate": 1.0},
                                            "prompt_len": {"dist": "fixed", "value": 8},
                                            "output_len": {"dist": "fixed", "value": 2}},
                "replicas": [{"count": count} for count in counts], "router": {"policy": "least_outstanding"}}

    message = _refused(lambda: make_scenario(raw(4096, 1)), "replicas", "4096 + 1", "4,097", "1..4096")
    assert message == "replicas: groups of 4096 + 1 = 4,097 replicas, more than kvsim builds (1..4096)"
    assert make_scenario(raw(4095, 1)).replicas[0].count == 4095


def test_a_pool_left_empty_by_the_token_budget_names_the_token_budget():
    """`max_num_batched_tokens: 2000000` left no KV pool and the error blamed `model=llama-3.1-8b`. The part that
    overflows is named with its field. By hand (`activation_peak_bytes`' formula, Llama-3.1-8B's config: I = 14,336,
    H = 4,096, bf16, vocab 128,256; max_num_seqs 1,024 on an H100 as an API server): 2,000,000 · (3 · 14,336 +
    4 · 4,096) · 2 B + 1,024 · 128,256 · 4 B = 237,568,000,000 + 525,336,576 = 238,093,336,576 B; the weights,
    8,030,261,248 parameters in bf16, 16,060,522,496 B."""
    from kvsim.model.capacity import kv_pool_bytes
    from kvsim.model.config import load_gpu, load_model
    from kvsim.model.engine_config import EngineConfig

    model, gpu = load_model("llama-3.1-8b"), load_gpu("h100-80gb")
    tokens = EngineConfig(max_model_len=8192, max_num_batched_tokens=2_000_000)
    _refused(lambda: kv_pool_bytes(model, gpu, tokens), "engine.max_num_batched_tokens=2000000:",
             "activations of a 2,000,000-token forward 238,093,336,576 B", "weights 16,060,522,496 B")
    non_torch = EngineConfig(max_model_len=8192, non_torch_memory_bytes=70 * 2**30)
    _refused(lambda: kv_pool_bytes(model, gpu, non_torch), f"engine.non_torch_memory_bytes={70 * 2**30}:")


@pytest.mark.parametrize(("fields", "named"), [
    ({"knobs": 5}, "knobs=5"), ({"knobs": (("max_num_seqs",),)}, "knobs=(('max_num_seqs',),)"),
    ({"split": (1,)}, "split=(1,)"), ({"split": (0, 1)}, "split=(0, 1)"),
    ({"split": (1, 1), "kv_transfer_config": "{bad"}, "kv_transfer_config='{bad'"),
    ({"split": (1, 1), "kv_transfer_config": "[]"}, "kv_transfer_config='[]'")])
def test_a_plan_candidate_checks_the_fields_no_scenario_checks(fields, named):
    """`Candidate(..., knobs=5)` was a TypeError, `split=(1,)` an IndexError and a `kv_transfer_config` that is no
    JSON object a JSONDecodeError, each at the candidate's first `scenario`."""
    from kvsim.planning.plan import Candidate

    _refused(lambda: Candidate("h100-80gb", 1, **fields), named)


def test_a_plan_candidates_scenario_refuses_what_is_no_base_or_no_split_count():
    """The fleet_sizing notebook's `Candidate(gpu, 1).scenario(probe, n, router)` with a path for `probe` was an
    AttributeError; a split's count of replicas other than its x + y an AssertionError."""
    import kvsim
    from kvsim.planning.plan import Candidate

    _refused(lambda: Candidate("h100-80gb", 1).scenario("azure-conv-replay.yaml", 2, "round_robin"),
             "base='azure-conv-replay.yaml'")
    base = kvsim.load_scenario(None, ["workload.num_requests=2"])
    message = _refused(lambda: Candidate("h100-80gb", 1, split=(2, 1)).scenario(base, 4, "least_outstanding"),
                       "replicas=4")
    assert message == "replicas=4: the split 2P1D runs its 2 + 1 = 3 instances"
    assert Candidate("h100-80gb", 1, split=(2, 1)).scenario(base, 3, "least_outstanding").replicas[0].count == 2


@pytest.mark.parametrize("replicas", [None, 2])
def test_a_steps_format_that_is_none_is_refused_with_no_steps_kept_too(tmp_path, replicas):
    """`simulate_scenario(s, out_dir=d, steps_format="xml")` of a scenario keeping no steps (`steps: none`) wrote the
    run, exit 0 as it were: only a step writer read the format. `RunResult.write` refuses it steps kept or not; the
    streaming paths (one engine, a fleet) now do too, before any folder is made."""
    import kvsim
    from kvsim.fleet.run import simulate_scenario

    fleet = [] if replicas is None else [f"replicas={replicas}", "router.policy=least_outstanding"]
    scenario = kvsim.load_scenario(None, ["workload.num_requests=2", "steps=none", *fleet])
    _refused(lambda: simulate_scenario(scenario, out_dir=tmp_path / "run", steps_format="xml"), "steps_format='xml'")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("given", "named"), [({"on_point": 5}, "on_point=5"), ({"on_point": lambda: None}, "on_point="),
                                              ({"on_note": 5}, "on_note=5"), ({"client": "tcp://x"}, "client='tcp://x'")])
def test_plan_checks_its_callbacks_and_client_before_any_point(tmp_path, given, named):
    """`plan(..., on_point=5)` (the fleet_sizing notebook's call, with a progress callback) was a TypeError once the
    first point had run and been stored in points.jsonl, `client="tcp://x"` an AttributeError after the plan's
    folder was made, and `on_note=5` was taken (called only when stored points are stale). Nothing is written now."""
    import yaml

    from kvsim.planning.plan import make_plan_spec, plan
    from kvsim.workload.scenario import make_scenario
    from tests.test_bad_input_sweep30 import TOY

    base = make_scenario(yaml.safe_load(TOY))
    spec = make_plan_spec({"slo": {"ttft_s.p90": 2.0}, "gpus": ["h100-80gb"], "max_replicas": 2, "verify_factor": 0})
    _refused(lambda: plan(base, spec, tmp_path / "plan", **given), named)
    assert not (tmp_path / "plan").exists()


def test_window_evidence_refuses_columns_of_other_lengths():
    """`window_evidence` takes a run's requests table or its columns (a dict): columns of two lengths stopped in
    NumPy (a ValueError from broadcasting, or an IndexError), a text arrival_s in float() (a ValueError) and a
    status given as one value was judged as one request ("no servable requests"). By the rule each names the
    column; a table of equal columns is judged as before."""
    from kvsim.planning.window import window_evidence

    rows = 40
    columns = {"arrival_s": [0.1 * i for i in range(rows)], "finish_s": [0.1 * i + 0.05 for i in range(rows)],
               "status": ["finished"] * rows}
    _refused(lambda: window_evidence({**columns, "finish_s": columns["finish_s"][:10]}),
             "column 'finish_s' holds 10 values, not one per row of the table's 40")
    _refused(lambda: window_evidence({**columns, "status": "finished"}), "column 'status' holds no column of values")
    _refused(lambda: window_evidence({**columns, "arrival_s": ["x"] * rows}), "column 'arrival_s' holds ['x', ")
    _refused(lambda: window_evidence(columns), "no column 'first_scheduled_s'")  # the next check, reached
