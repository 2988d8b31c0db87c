"""Bad input found by the bad41 sweep (every command over malformed inputs). Each is refused (the CLI: exit 2, one
line naming the field and the value, nothing written; the Python API: a `KvsimError`).

Found: `workload.trace.rate_scale` beside a rate process (`arrival.process: poisson`, `gamma` or `constant`, which
keep a trace's lengths at their own rate) was dropped without a word: `rate_scale: 1e-300` on a lengths table ran
at the Poisson rate, exit 0. Only `arrival.process: trace` divides the trace's timestamps by it
(`kvsim.workload.generate._arrivals`), as `start_s` is read only by the formats with timestamps (refused elsewhere).
"""

from __future__ import annotations

import pytest

from kvsim.model.errors import KvsimError
from kvsim.workload.scenario import make_scenario
from tests.conftest import one_line_exit_2

LENGTHS = "num_prefill_tokens,num_decode_tokens\n100,10\n200,20\n"


def _scenario(tmp_path, process: str, rate_scale: float) -> dict:
    (tmp_path / "t.csv").write_text(LENGTHS, encoding="utf-8")
    arrival = {"process": "trace"} if process == "trace" else {"process": process, "rate": 4.0}
    trace = {"format": "lengths" if process != "trace" else "mooncake",
             "path": "t.csv" if process != "trace" else "builtin:mooncake_conversation_head", "rate_scale": rate_scale}
    return {"name": "toy", "engine": {"max_model_len": 2048, "num_gpu_blocks_override": 400},
            "workload": {"num_requests": 4, "arrival": arrival, "trace": trace},
            "latency": {"model": "constant", "step_s": 0.02}}


@pytest.mark.parametrize("process", ["poisson", "gamma", "constant"])
def test_rate_scale_beside_a_rate_process_is_refused(tmp_path, process):
    """The message follows the rule for a field its mode does not read (`Settings.refuse_unread`'s words)."""
    raw = _scenario(tmp_path, process, 0.5)
    if process == "gamma":
        raw["workload"]["arrival"]["cv"] = 2.0
    with pytest.raises(KvsimError) as error:
        make_scenario(raw, tmp_path)
    assert str(error.value) == (f"workload: trace.rate_scale=0.5: arrival.process={process} does not read it (only "
                                "trace, which replays the trace's timestamps); scale arrival.rate instead")


def test_rate_scale_where_it_is_read_or_left_at_its_default_passes(tmp_path):
    make_scenario(_scenario(tmp_path, "poisson", 1.0), tmp_path)  # the default, which a written scenario carries
    make_scenario(_scenario(tmp_path, "trace", 0.5), tmp_path)  # a replay divides its timestamps by it


def test_the_cli_refuses_it_and_writes_nothing(tmp_path):
    import yaml

    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(_scenario(tmp_path, "poisson", 1e-300)), encoding="utf-8")
    out = tmp_path / "out"
    assert one_line_exit_2(["run", str(scenario), "-o", str(out)]) == (
        "workload: trace.rate_scale=1e-300: arrival.process=poisson does not read it (only trace, which replays the "
        "trace's timestamps); scale arrival.rate instead")
    assert not out.exists()

