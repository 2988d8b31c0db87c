"""benchmarks/bench_scale.py's measured run is the run `kvsim run` makes (the timing itself is a benchmark)."""

import json
import subprocess
import sys
from pathlib import Path

import kvsim

BENCH_SCALE = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_scale.py"


def test_one_point_runs_the_default_scenario_as_kvsim_run_does():
    """The README's (now docs/speed.md's) `python benchmarks/bench_scale.py --sizes ...` died in every child at main 3d4630f:
    `write_run_files` had gained its `final` argument (where the output folder lands) and the bench, which
    replays `simulate(out_dir=...)` step by step to time each part, still called it without. One point, in a
    child process as the bench runs it, must simulate the run `kvsim.simulate` makes of the same scenario."""
    done = subprocess.run([sys.executable, str(BENCH_SCALE), "--child", "default", "60", "all", "csv"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    point = json.loads(done.stdout.strip().splitlines()[-1])
    expected = kvsim.simulate(None, workload__num_requests=60).summary
    assert (point["num_requests"], point["steps_format"]) == (60, "csv")
    assert point["num_steps"] == expected["num_steps"]
