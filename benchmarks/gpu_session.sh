#!/usr/bin/env bash
# The one prepared script for a lent GPU machine (run from the repository root, results under $OUT):
#   calibration profile for Llama-3.1-8B (block size 16) + the decode kernel benchmark.
# Needs the wheels from benchmarks/device_wheels.sh carried as `wheels/`.
set -euo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.csv" || true
python3 -m pip install -q --no-index --find-links wheels --target "$OUT/.deps" pydantic simpy
export PYTHONPATH="$PWD:$OUT/.deps${PYTHONPATH:+:$PYTHONPATH}"
python3 -m pytest -q -p no:xdist -o addopts="" tests/kernels 2>&1 | tail -3 | tee "$OUT/kernel-tests.txt"
python3 -m kernels.compile_check > "$OUT/compile-sm90.txt"
time python3 -m kvsim calibrate --gpu h200 --model llama-3.1-8b --output "$OUT/h200.csv"
python3 benchmarks/bench_kernels.py --output-dir "$OUT"
rm -rf "$OUT/.deps"
