"""kvsim run's fixed cost: start-up (interpreter, imports, CLI, scenario) and writing its outputs.

    python benchmarks/bench_startup.py [--repeats 9]

A one-request run (`kvsim run --set workload.num_requests=1 -o DIR`, the built-in default scenario,
the summary table printed, steps as Parquet when pyarrow is installed) is almost nothing but this
fixed cost, which every `kvsim run` pays on top of its simulation (bench_vidur.py's 10k-request
run included). Fresh processes, alternating with the interpreter alone (`python -c pass`, the
baseline measured in the same run, so the ratio compares across machines); medians of wall and CPU
seconds. One more run under `python -X importtime` gives the import time by package (its modules' own times) and
the optional heavy libraries that got imported (none should: pandas, matplotlib, torch, triton).
Writes benchmarks/results/startup.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from result_file import check_result_file, write_result_file

RESULTS = Path(__file__).resolve().parent / "results" / "startup.json"
KVSIM_RUN = ["-m", "kvsim", "run", "--set", "workload.num_requests=1", "-o"]
HEAVY = ("pandas", "matplotlib", "torch", "triton")


def timed(args: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh `python ARGS` process."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    assert proc.stderr is not None
    stderr = proc.stderr.read().decode(errors="replace")
    if status != 0:
        raise SystemExit(f"{' '.join(args)} failed: {stderr[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def import_times(out: Path) -> tuple[dict[str, float], list[str]]:
    """Milliseconds of a one-request run's imports by top-level package (the sum of its modules' own
    times, so nothing is counted twice), largest first, and the heavy libraries it imported."""
    result = subprocess.run([sys.executable, "-X", "importtime", *KVSIM_RUN, str(out)], capture_output=True,
                            text=True, check=True)
    by_package: dict[str, float] = {}
    for line in result.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
        if match:
            package = match[2].split(".")[0]
            by_package[package] = by_package.get(package, 0.0) + int(match[1]) / 1000
    ranked = dict(sorted(((k, round(v, 1)) for k, v in by_package.items()), key=lambda kv: -kv[1]))
    return ranked, sorted(set(by_package) & set(HEAVY))


# the result's keys: --output replaces only such a JSON object (result_file.py)
RESULT_KEYS = frozenset({"cpus", "heavy_libraries_imported", "import_ms_by_package", "import_ms_total",
                          "interpreter_cpu_s", "interpreter_s", "kvsim_run_cpu_s", "kvsim_run_over_interpreter",
                          "kvsim_run_s", "machine", "python", "repeats", "runs", "what", "when"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    check_result_file("bench_startup.py", args.output, RESULT_KEYS)  # before it runs, not after
    runs: dict[str, dict[str, list[float]]] = {"interpreter": {"wall": [], "cpu": []},
                                               "kvsim_run": {"wall": [], "cpu": []}}
    with tempfile.TemporaryDirectory() as tmp:
        timed([*KVSIM_RUN, f"{tmp}/warm"])  # bytecode compiled and caches warm, untimed
        for i in range(args.repeats):
            for name, command in (("interpreter", ["-c", "pass"]), ("kvsim_run", [*KVSIM_RUN, f"{tmp}/run{i}"])):
                wall, cpu = timed(command)
                runs[name]["wall"].append(wall)
                runs[name]["cpu"].append(cpu)
        imports_ms, heavy = import_times(Path(tmp) / "imports")
    median = {name: {k: statistics.median(v) for k, v in r.items()} for name, r in runs.items()}
    result = {
        "what": "kvsim run of one request (default scenario, table output): start-up + writing outputs",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "repeats": args.repeats,
        "kvsim_run_s": median["kvsim_run"]["wall"], "kvsim_run_cpu_s": median["kvsim_run"]["cpu"],
        "interpreter_s": median["interpreter"]["wall"], "interpreter_cpu_s": median["interpreter"]["cpu"],
        "kvsim_run_over_interpreter": median["kvsim_run"]["wall"] / median["interpreter"]["wall"],
        "runs": runs,
        "import_ms_by_package": imports_ms,
        "import_ms_total": round(sum(imports_ms.values()), 1),
        "heavy_libraries_imported": heavy,
    }
    write_result_file("bench_startup.py", args.output, RESULT_KEYS, result)
    print(f"kvsim run (1 request): {result['kvsim_run_s']:.3f} s wall, {result['kvsim_run_cpu_s']:.3f} s CPU; "
          f"interpreter {result['interpreter_s']:.3f} s; ratio {result['kvsim_run_over_interpreter']:.1f}; "
          f"heavy imports: {heavy or 'none'}")
    print("imports (ms):", ", ".join(f"{k} {v}" for k, v in list(imports_ms.items())[:10]))


if __name__ == "__main__":
    main()
