"""Bad input found by the thirtieth sweep (`kvsim plan` spec files). Each is refused (the CLI:
exit 2, one line naming the field and the value, nothing written; the Python API: a `KvsimError`).

Found: `probe_requests` in a replica search's spec was dropped without a word (the README: "a replica search's
probes start at the scenario's `workload.num_requests`, a rate search's at `probe_requests`"), where `capacity_headroom`
and `rel_tol` were refused. Two values of an engine knob that the engine reads as one
(`max_num_seqs: [4, '4']`) passed `PlanSpec`'s "given twice" check (4 != '4') and made two candidates of one
engine, searched twice and ranked beside each other.
"""

from __future__ import annotations

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
