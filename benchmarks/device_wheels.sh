#!/usr/bin/env bash
# Download the wheels kvsim needs that the GPU machine's image lacks (it has torch, triton,
# numpy, pandas, typer, rich, pyyaml, but no pydantic or simpy, and reaches no index).
# Run here; the folder travels with `carry: ["wheels"]` and gpu_session.sh installs from it (with
# pip, or by unzipping every wheel into one folder where there is no pip). pydantic_core is the
# one compiled wheel: it comes for CPython 3.10-3.13, whose extension modules carry their ABI in
# their file names and so sit side by side; the session's `python3 --version` says which loads.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf wheels && mkdir -p wheels
for version in 3.10 3.11 3.12 3.13; do
  python3 -m pip download -q --only-binary=:all: --python-version "$version" --platform manylinux2014_x86_64 \
    --implementation cp -d wheels "pydantic>=2.6" "simpy>=4.1"
done
ls wheels
