#!/usr/bin/env bash
# The one prepared script for a lent GPU machine, run from the repository root with results under $OUT:
#   the kernel tests, the sm_90 compile report (registers, spills), the calibration profile for
#   Llama-3.1-8B (block size 16) and the decode kernel benchmark.
#
# The machine has torch, triton, numpy, pandas, typer, rich, pyyaml and pytest but no pydantic or
# simpy, and reaches no index: carry the wheels from benchmarks/device_wheels.sh as `wheels/`
# (carry: ["wheels"]). They install to $DEPS (a temporary folder unless set), never under $OUT,
# which holds only results: session.log (every stage's output), stages.txt (each stage's exit
# status and seconds), compile-sm90.txt, h200.csv, kernels.json and kernels.md.
#
# Every stage runs even when an earlier one failed (a failing test must not cost the measurements);
# without a CUDA device each measurement fails with one line. The script exits 1 when any stage
# failed. The kernel tests draw random inputs from KVSIM_TEST_SEED, drawn here
# unless set, printed, and recorded in stages.txt: set it to replay a run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
if [ -z "${DEPS:-}" ]; then DEPS=$(mktemp -d) && trap 'rm -rf "$DEPS"' EXIT; fi
export KVSIM_TEST_SEED=${KVSIM_TEST_SEED:-$(python3 -c 'import secrets; print(secrets.randbelow(2**31))')}
export PYTHONPATH="$PWD:$DEPS${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
: > "$OUT/stages.txt"
failed=0

stage() {  # stage NAME COMMAND...: run it, output to the console and session.log, status to stages.txt
  local name=$1 start=$SECONDS rc
  shift
  echo "== $name: $*" | tee -a "$OUT/session.log"
  "$@" 2>&1 | tee -a "$OUT/session.log"
  rc=${PIPESTATUS[0]}
  echo "$name rc=$rc $((SECONDS - start))s" | tee -a "$OUT/stages.txt"
  [ "$rc" -eq 0 ] || failed=1
  return "$rc"
}

environment() {
  python3 --version
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || echo "nvidia-smi: not available"
  echo "KVSIM_TEST_SEED=$KVSIM_TEST_SEED"
}

dependencies() {  # pydantic and simpy from the carried wheels, unless this Python already has them
  if python3 -c 'import pydantic, simpy' 2>/dev/null; then echo "pydantic and simpy already installed"; return; fi
  [ -d wheels ] || { echo "no wheels/ folder: run benchmarks/device_wheels.sh here and carry wheels"; return 2; }
  python3 -m pip install -q --no-index --no-compile --find-links wheels --target "$DEPS" pydantic simpy &&
    python3 -c 'import kvsim.engine, kvsim.cli; print("kvsim imports")'
}

echo "random inputs: KVSIM_TEST_SEED=$KVSIM_TEST_SEED" >> "$OUT/stages.txt"
stage environment environment
stage dependencies dependencies
stage kernel-tests python3 -m pytest -p no:xdist -p no:cacheprovider -o addopts="" -rfEs tests/kernel_tests
stage compile-sm90 env -u TRITON_INTERPRET python3 -m kernels.compile_check
grep -E '^_[a-z_]+_kernel ' "$OUT/session.log" > "$OUT/compile-sm90.txt"
stage calibrate python3 -m kvsim calibrate --gpu h200 --model llama-3.1-8b --output "$OUT/h200.csv"
stage bench-kernels python3 benchmarks/bench_kernels.py --output-dir "$OUT"
exit "$failed"
