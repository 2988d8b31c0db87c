"""benchmarks/study_distserve.py writes where `--output` says, as the other benchmarks do, not over the tracked
benchmarks/results/distserve.json (the goodput searches themselves are a benchmark: stubbed here)."""

import json
import sys

from conftest import benchmark_script  # tests/ is on sys.path


def test_output_names_the_file_and_the_tracked_result_is_left_alone(tmp_path, monkeypatch):
    study = benchmark_script("study_distserve")
    tracked = study.RESULTS.read_bytes()
    # goodput per setup, req/s: colocated 2, v0 1.5, prefill only 6, decode only 10, 2P1D fleet 9
    rates = {"colocated": 2.0, "colocated-v0": 1.5, "prefill-only": 6.0, "decode-only": 10.0, "disagg": 9.0}
    monkeypatch.setattr(study, "goodput", lambda requests, setup, high: rates[setup])
    out = tmp_path / "deep" / "distserve.json"
    monkeypatch.setattr(sys, "argv", ["study_distserve.py", "--requests", "10", "--output", str(out)])
    study.main()
    rows = json.loads(out.read_text())["kvsim"]
    # ideal 2P1D: min(2 x 6, 10) = 10 req/s over 3 GPUs; measured 9 / 3 = 3 per GPU, 1.5x the colocated 2
    assert rows["ideal_2p1d_total"] == 10.0 and rows["disagg_2p1d_per_gpu"] == 3.0 and rows["ratio_per_gpu"] == 1.5
    assert study.RESULTS.read_bytes() == tracked
