#!/usr/bin/env bash
# The one prepared script for a lent GPU machine, run from the repository root with results under $OUT:
#   the sm_90 compile report (registers, spills, async copies), the calibration profile for
#   Llama-3.1-8B (block sizes 16 and 32), the kernel benchmark (decode and prefill against the
#   measured copy bandwidth, bf16 peak and contiguous SDPA) and the kernel tests.
#
#   bash benchmarks/gpu_session.sh            # on the GPU machine (OUT=... for the results)
#   bash benchmarks/gpu_session.sh --dry-run  # on a CPU: count each stage's work, estimate its time
#                                             # on an H200, exit 1 past 8 minutes (kernels_dry_run.py)
#
# The machine has torch, triton, numpy, pandas, typer, rich, pyyaml and pytest but no pydantic or
# simpy, may lack pip, and reaches no index: carry the wheels from benchmarks/device_wheels.sh as
# `wheels/` (carry: ["wheels"]). They install to $DEPS (a temporary folder unless set), never under
# $OUT, with pip when there is one, else unzipped (`python3 -m zipfile -e`: a wheel is a zip of its
# importable files). $OUT holds only results: session.log (every stage's output), stages.txt (each
# stage's exit status and seconds), compile-sm90.txt, h200.csv, kernels.json and kernels.md.
#
# Every stage runs even when an earlier one failed (a failing stage must not cost the measurements;
# the tests run last, so a slow test cannot either); without a CUDA device each measurement fails
# with one line. The script exits 1 when any stage failed. The kernel tests draw random inputs
# from KVSIM_TEST_SEED, drawn here unless set, printed, and recorded in stages.txt: set it to
# replay a run. KVSIM_KERNELS_COMMIT, when set, is the commit the profile records (a copied tree
# has no .git).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--dry-run" ]; then exec python3 benchmarks/kernels_dry_run.py; fi
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
  echo "KVSIM_TEST_SEED=$KVSIM_TEST_SEED KVSIM_KERNELS_COMMIT=${KVSIM_KERNELS_COMMIT:-unset}"
}

dependencies() {  # pydantic and simpy from the carried wheels, unless this Python already has them
  if python3 -c 'import pydantic, simpy' 2>/dev/null; then echo "pydantic and simpy already installed"; return; fi
  [ -d wheels ] || { echo "no wheels/ folder: run benchmarks/device_wheels.sh here and carry wheels"; return 2; }
  if python3 -m pip --version >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-compile --find-links wheels --target "$DEPS" pydantic simpy || return
  else
    echo "no pip: unzipping the wheels into $DEPS"
    for wheel in wheels/*.whl; do python3 -m zipfile -e "$wheel" "$DEPS" || return; done
  fi
  python3 -c 'import kvsim.engine, kvsim.cli; print("kvsim imports")'
}

echo "random inputs: KVSIM_TEST_SEED=$KVSIM_TEST_SEED" >> "$OUT/stages.txt"
stage environment environment
stage dependencies dependencies
stage compile-sm90 env -u TRITON_INTERPRET python3 -m kernels.compile_check
grep -E '^_[a-z_]+_kernel ' "$OUT/session.log" > "$OUT/compile-sm90.txt"
stage calibrate python3 -m kvsim calibrate --gpu h200 --model llama-3.1-8b --block-sizes 16,32 \
  --output "$OUT/h200.csv"
stage bench-kernels python3 benchmarks/bench_kernels.py --output-dir "$OUT"
stage kernel-tests python3 -m pytest -p no:xdist -p no:cacheprovider -o addopts="" -rfEs tests/kernel_tests
exit "$failed"
