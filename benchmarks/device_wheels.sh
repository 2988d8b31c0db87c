#!/usr/bin/env bash
# Download the wheels kvsim needs that the GPU machine's image lacks (it has torch, triton,
# numpy, pandas, typer, rich, pyyaml, but no pydantic or simpy, and reaches no index).
# Run here; the folder travels with `carry: ["wheels"]` and gpu_session.sh installs from it.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf wheels && mkdir -p wheels
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  --implementation cp -d wheels "pydantic>=2.6" "simpy>=4.1"
ls wheels
