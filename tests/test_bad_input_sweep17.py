"""Bad input found by the seventeenth sweep, on the Python API and the data files. Each is a `KvsimError` naming
the field and the value (the CLI: exit 2, one line, nothing written).

Found: a profile CSV's `calls` cell that is not a number stopped the run with a bare ValueError, one below 1
(a negative count of an op's runs) was read as a negative time, and one written as `2.0` passed the checks and
then stopped the run with a ValueError."""

import pytest
from test_profiles import LLAMA, RTX, TP1, calibrated, write_bundle  # tests/ is on sys.path

from kvsim.latency.profiles.loader import load_profile
from kvsim.latency.profiles.native import write_native
from kvsim.latency.step_plan import StepPlan
from kvsim.model.errors import KvsimError


def _native_with_calls(tmp_path, calls):
    """The bundle of `write_bundle` as a kvsim CSV whose first token op's `calls` cell reads `calls`."""
    profile = load_profile(write_bundle(tmp_path / "bf16"), LLAMA, RTX, TP1)
    row = next(r for r in profile.rows if r["kind"] == "token_op")
    row["calls"] = calls
    return write_native(profile, tmp_path / "native.csv"), row["op"]


@pytest.mark.parametrize("calls", ["abc", "-2", "0", "1.5", "nan"])
def test_a_profile_calls_cell_that_is_not_a_count_of_runs_is_named(tmp_path, calls):
    path, op = _native_with_calls(tmp_path, calls)
    with pytest.raises(KvsimError, match=rf"token_op {op}\): calls='{calls}' is not a (whole |finite )?number"):
        load_profile(path, LLAMA, RTX, TP1)


def test_a_profile_calls_cell_written_as_a_float_counts_as_the_whole_number(tmp_path):
    plan = StepPlan()
    plan.add(1, 1023, 16, samples=True)
    times = []
    for calls in ("2", "2.0"):
        path, _ = _native_with_calls(tmp_path / calls, calls)
        times.append(calibrated(load_profile(path, LLAMA, RTX, TP1)).step_time(plan))
    assert times[0] == times[1]
