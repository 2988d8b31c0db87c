#!/usr/bin/env bash
# Set up Vidur (https://github.com/microsoft/vidur, MIT) beside kvsim for benchmarks/bench_vidur.py.
#
#   bash benchmarks/setup_vidur.sh            # venv in $VIDUR_VENV, default /work/vidur-venv
#
# Vidur is never a kvsim dependency: it lives in its own virtual environment outside the
# repository. The PyPI wheel (vidur 0.0.26) declares streamlit, kaleido, seaborn, paretoset,
# randomname, ninja and matplotlib, which only its config optimiser, profilers and plots use;
# it is installed with --no-deps plus what `python -m vidur.main` imports on its simulation path
# (numpy, pandas, scikit-learn, fasteners, huggingface_hub, ddsketch, plotly_express and wandb,
# the last two imported at module level by vidur/metrics even with plots and wandb off).
#
# Profiling data: vidur 0.0.26 loads its per-operator profiles from Hugging Face datasets
# (snapshot_download), which this machine cannot reach, and microsoft/vidur's repository keeps
# its measured attention.csv in Git LFS. benchmarks/vidur_profile.py writes the tables Vidur reads
# (mlp.csv, attention.csv) from kvsim's roofline of Llama-2-7B on an A100-80GB and lays them out
# as an offline Hugging Face cache in $VIDUR_VENV/vidur-cache, where HF_HUB_OFFLINE=1 makes
# snapshot_download find them. This script does it once with kvsim's interpreter ($KVSIM_PYTHON,
# default .venv/bin/python: run ./dev first); bench_vidur.py does it again on every run.
# Vidur's simulation (scheduler, block accounting, events, metrics) is its own; only the numbers
# it predicts step times from are kvsim's.
set -euo pipefail

VENV="$(realpath -m "${VIDUR_VENV:-/work/vidur-venv}")"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VIDUR_VERSION=0.0.26

case "$VENV/" in
  "$(cd "$HERE/.." && pwd)/"*) echo "setup_vidur.sh: VIDUR_VENV=$VENV is inside the repository; choose a path outside it" >&2; exit 2 ;;
esac

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet --no-deps "vidur==$VIDUR_VERSION"
# the versions this benchmark was run with (their dependencies resolve freely)
"$VENV/bin/python" -m pip install --quiet numpy==2.4.6 pandas==3.1.1 scikit-learn==1.9.1 fasteners==0.20 \
  huggingface_hub==2.4.0 ddsketch==3.0.1 plotly-express==0.4.1 plotly==7.1.0 wandb==0.31.0

WANDB_MODE=disabled HF_HUB_OFFLINE=1 "$VENV/bin/python" -c "import vidur.main, vidur; print('vidur', vidur.__version__, 'installed in $VENV')"

KVSIM_PYTHON="${KVSIM_PYTHON:-$HERE/../.venv/bin/python}"
if [ -x "$KVSIM_PYTHON" ]; then
  PYTHONPATH="$HERE" "$KVSIM_PYTHON" -c "
from pathlib import Path
from bench_vidur import BLOCK_SIZE, MAX_SEQS, MAX_TOKENS
from vidur_profile import write_profile
print('profile datasets', *write_profile(Path('$VENV') / 'vidur-cache', BLOCK_SIZE, MAX_TOKENS, MAX_SEQS))"
else
  echo "no kvsim interpreter at $KVSIM_PYTHON: bench_vidur.py will lay out the profile tables when it runs"
fi
