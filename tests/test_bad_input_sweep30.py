"""Bad input found by the thirtieth sweep (`kvsim plan` spec files, `kvsim report`'s price). Each is refused (the CLI:
exit 2, one line naming the field and the value, nothing written; the Python API: a `KvsimError`).

Found: `probe_requests` in a replica search's spec was dropped without a word (docs/fleets-and-plan.md: "a replica search's
probes start at the scenario's `workload.num_requests`, a rate search's at `probe_requests`"), where `capacity_headroom`
and `rel_tol` were refused. Two values of an engine knob that the engine reads as one
(`max_num_seqs: [4, '4']`) passed `PlanSpec`'s "given twice" check (4 != '4') and made two candidates of one
engine, searched twice and ranked beside each other. A `gpu_hourly_cost` whose fleet cost overflows a float
(`1e308` × 3 GPUs) was ranked as inf and stopped `kvsim plan` with an OverflowError traceback printing the answer,
after the whole search and with the plan folder written; `kvsim report --gpu-hourly-cost` passes its price to the
fleet section's plan, so it is checked before any run. `kvsim validate` of a run whose replayed settings reject
every request it served (meta.json's `max_model_len` below its prompts) left them out of both sides and printed a
table of "not recorded" statistics, exit 0. `StudyConfig` (the report's knobs) took a grid value twice
(`load_fractions=(0.5, 0.25, 0.5)`) and ran it twice. A resumed plan's points.jsonl line whose `format` was
no integer was said to be "of point format -1, written by another kvsim".
"""

from __future__ import annotations

import json
import sys

import pytest

from kvsim.model.errors import KvsimError
from kvsim.planning.spec import make_plan_spec
from tests.conftest import one_line_exit_2

SLO = {"ttft_s.p90": 2.0}
TOY = """\
name: toy
engine: {max_model_len: 2048, num_gpu_blocks_override: 400, max_num_seqs: 8}
workload:
  num_requests: 40
  arrival: {process: poisson, rate: 14.0}
  prompt_len: {dist: fixed, value: 256}
  output_len: {dist: fixed, value: 64}
latency: {model: constant, step_s: 0.02}
"""


def test_probe_requests_in_a_replica_search_is_refused_as_unread():
    with pytest.raises(KvsimError) as error:
        make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "probe_requests": 100})
    assert str(error.value) == "plan: probe_requests=100: search=replicas does not read it (only search=rate)"
    make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "probe_requests": 100, "search": "rate"})  # read there
    make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "probe_requests": 2000})  # the default passes


@pytest.mark.parametrize(("knob", "values", "expected"), [
    ("max_num_seqs", "[4, '4']", "plan.engine: max_num_seqs='4' is given twice (as max_num_seqs=4, the same engine)"),
    ("max_num_batched_tokens", "[2048, 4096, '2048']",
     "plan.engine: max_num_batched_tokens='2048' is given twice (as max_num_batched_tokens=2048, the same engine)")])
def test_engine_knob_values_the_engine_reads_as_one_are_refused(tmp_path, knob, values, expected):
    """YAML's `'4'` is text, which the engine's integer field reads as 4: one engine, so one candidate."""
    (tmp_path / "toy.yaml").write_text(TOY, encoding="utf-8")
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"slo: {{ttft_s.p90: 2}}\ngpus: [h100-80gb]\nengine: {{{knob}: {values}}}\n", encoding="utf-8")
    out = tmp_path / "plan"
    assert one_line_exit_2(["plan", str(tmp_path / "toy.yaml"), "--workers", "1", "--spec", str(spec),
                            "-o", str(out)]) == expected
    assert not out.exists()


def test_a_price_whose_largest_fleet_overflows_a_float_is_refused():
    """The largest float is 1.7976931348623157e308; a plan's largest fleet is max_replicas × its largest TP GPUs.
    64 × 1 GPUs: 2.8e306 × 64 = 1.792e308 is a float, 2.9e306 × 64 = 1.856e308 is not. With TP 2 and 4 replicas
    (8 GPUs), 1e308 × 8 is not either, where 1e308 × 1 GPU is."""
    assert sys.float_info.max < 2.9e306 * 64 and sys.float_info.max > 2.8e306 * 64  # the bounds stated above
    make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "gpu_hourly_cost": {"h100-80gb": 2.8e306}})
    with pytest.raises(KvsimError) as error:
        make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "gpu_hourly_cost": {"h100-80gb": 2.9e306}})
    assert str(error.value) == ("plan: gpu_hourly_cost: h100-80gb=2.9e+306: its largest fleet (64 GPUs: "
                                "max_replicas=64 of TP 1) would cost more per hour than a float holds")
    make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 1, "gpu_hourly_cost": {"h100-80gb": 1e308}})
    with pytest.raises(KvsimError, match=r"h100-80gb=1e\+308: its largest fleet \(8 GPUs: max_replicas=4 of TP 2\)"):
        make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 4, "tensor_parallel_sizes": [1, 2],
                        "gpu_hourly_cost": {"h100-80gb": 1e308}})


def test_kvsim_plan_refuses_an_overflowing_price_before_its_folder(tmp_path):
    """It searched every point, then stopped with an OverflowError traceback printing the $inf answer."""
    (tmp_path / "toy.yaml").write_text(TOY, encoding="utf-8")
    out = tmp_path / "plan"
    line = one_line_exit_2(["plan", str(tmp_path / "toy.yaml"), "--workers", "1", "--slo", "ttft_s.p90=2",
                            "--gpu", "h100-80gb", "--max-replicas", "4", "--gpu-hourly-cost", "h100-80gb=1e308",
                            "-o", str(out)])
    assert line == ("plan: gpu_hourly_cost: h100-80gb=1e+308: its largest fleet (4 GPUs: max_replicas=4 of TP 1) "
                    "would cost more per hour than a float holds")
    assert not out.exists()


def test_kvsim_report_refuses_a_price_its_fleet_plan_refuses_before_any_run(tmp_path):
    """`--quick`'s fleet section plans up to 8 replicas of the report scenario's GPU (an L4, TP 1): 1e308 × 8 is past
    a float; the line names the flag the user gave, then the plan's reason."""
    out = tmp_path / "report"
    line = one_line_exit_2(["report", "--quick", "--workers", "1", "--gpu-hourly-cost", "1e308", "-o", str(out)])
    assert line == ("--gpu-hourly-cost=1e+308: the fleet section's plan refuses it (plan: gpu_hourly_cost: "
                    "l4=1e+308: its largest fleet (8 GPUs: max_replicas=8 of TP 1) would cost more per hour than a "
                    "float holds)")
    assert not out.exists()


def test_validate_refuses_a_run_whose_every_request_its_settings_reject(tmp_path):
    """meta.json's max_model_len=8 under the run's 16- and 32-token prompts: vLLM refuses a prompt longer than
    max_model_len, so both are rejected in the replay, and the comparison left them out on both sides: a table of
    "not recorded" for a run that recorded every request, exit 0."""
    from test_validate import write_run  # tests/ is on sys.path

    run_dir = write_run(tmp_path)
    meta_path = run_dir / "vllm" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["engine_kwargs"]["max_model_len"] = 8
    meta_path.write_text(json.dumps(meta))
    out = tmp_path / "o"
    line = one_line_exit_2(["validate", str(run_dir), "--gpu", "h100-80gb", "-o", str(out)])
    assert line.startswith("measured run case: kvsim rejects all 2 of its requests (prompt_len >= max_model_len 8: 2)")
    assert not out.exists()


@pytest.mark.parametrize(("fields", "line"), [
    ({"load_fractions": (0.5, 0.25, 0.5)}, "load_fractions=(0.5, 0.25, 0.5): 0.5 is given twice"),
    ({"shared_prefix_counts": (4, 4)}, "shared_prefix_counts=(4, 4): 4 is given twice"),
    ({"offload_loads": (1.0, 1)}, "offload_loads=(1.0, 1): 1.0 is given twice"),  # 1 is the load 1.0
    ({"speculation_batch_sizes": (1, 16, 1)}, "speculation_batch_sizes=(1, 16, 1): 1 is given twice")])
def test_a_study_grid_value_given_twice_is_refused(fields, line):
    """Each grid's value is one run (a load, a sharing count, a batch-size limit): twice, it ran twice and its
    table and figure showed the point beside itself, as `PlanSpec` refuses a candidate given twice."""
    from kvsim.report.study_config import StudyConfig

    with pytest.raises(KvsimError) as refused:
        StudyConfig(**fields)
    assert str(refused.value) == line
    with pytest.raises(KvsimError) as copied:  # a changed copy is checked as a new one
        StudyConfig.quick().model_copy(update=fields)
    assert str(copied.value) == line


def test_a_point_whose_format_is_no_integer_is_damaged_not_of_format_minus_one(tmp_path):
    """points.jsonl's `format` is the integer kvsim writes beside each point; a text `"4"` or `true` was read as
    format -1 and said as "8 points of point format -1, written by another kvsim", a value no file held and a
    kvsim that never was. Such a line is no kvsim's: damaged, named by line, field and value (as JSON writes it)."""
    from kvsim.planning.search import PointStore

    path = tmp_path / "points.jsonl"
    lines = [{"hash": "a", "name": "x", "format": "4", "metrics": {"evidence": {}}},
             {"hash": "b", "name": "y", "format": True, "metrics": {"evidence": {}}},
             {"hash": "c", "name": "z", "format": 99, "metrics": {"evidence": {}}}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    store = PointStore(path, required=("evidence",), point_format=4)
    assert not store.points and store.damaged == {
        "a": (1, 'format="4" is not a point format (an integer)'),
        "b": (2, "format=true is not a point format (an integer)")}
    assert store.stale == {"c": 99}  # a later kvsim's integer format stays stale
    assert store.damaged_text() == (f"{path}: line 1: format=\"4\" is not a point format (an integer): not a point "
                                    "kvsim wrote (and 1 more damaged point); will be simulated again, not reused")


@pytest.mark.parametrize(("scheduler", "gpus", "knob", "values", "refused"), [
    # vLLM v0's max_num_seqs is 256 on every GPU (vllm/engine/arg_utils.py, `_set_default_args_v0`)
    ("v0", ["l4"], "max_num_seqs", [None, 256], True),
    ("v0", ["h100-80gb", "l4"], "max_num_seqs", [256, None], True),
    ("v0", ["l4"], "max_num_seqs", [None, 128], False),
    # v1's (`EngineArgs.get_batch_defaults`, vllm serve): 1024 sequences and 8192 tokens on a GPU of at least 70 GiB
    # not named A100 (the H100's 80 GB), 256 and 2048 on the others (the L4's 24 GB)
    ("v1", ["h100-80gb"], "max_num_seqs", [None, 1024], True),
    ("v1", ["l4"], "max_num_batched_tokens", [2048, None], True),
    ("v1", ["h100-80gb", "l4"], "max_num_seqs", [None, 1024], False),  # 256 on the L4: two engines there
    ("v1", ["h100-80gb", "l4"], "max_num_batched_tokens", [None, 8192], False),
    # llama-3.1-8b's config.json: max_position_embeddings 131072
    ("v1", ["h100-80gb"], "max_model_len", [None, 131072], True),
    ("v1", ["h100-80gb"], "max_model_len", [None, 65536], False)])
def test_knob_values_one_engine_once_its_defaults_are_filled_are_refused(scheduler, gpus, knob, values, refused):
    """`max_num_seqs: [null, 256]` on v0 ran one engine as two candidates (their evidence lines alike, twice the
    points): refused where the two are one engine on every GPU of the plan, kept where a GPU tells them apart."""
    from kvsim.planning.plan_checks import check_knob_repeats
    from kvsim.workload.scenario import make_scenario

    base = make_scenario({"name": "toy", "engine": {"scheduler": scheduler, "num_gpu_blocks_override": 400},
                          "workload": {"num_requests": 40, "arrival": {"process": "poisson", "rate": 14.0},
                                       "prompt_len": {"dist": "fixed", "value": 256},
                                       "output_len": {"dist": "fixed", "value": 64}}})
    spec = make_plan_spec({"slo": SLO, "gpus": gpus, "engine": {knob: values}})
    if not refused:
        check_knob_repeats(base, spec)
        return
    with pytest.raises(KvsimError) as error:
        check_knob_repeats(base, spec)
    assert str(error.value) == (f"plan.engine: {knob}={values[1]!r} is given twice (as {knob}={values[0]!r}, the "
                                "same engine once its defaults are filled)")
