#!/usr/bin/env bash
# Set up the Vidur paper's code (microsoft/vidur @ 7d47513, MLSys'24, MIT) beside kvsim for
# benchmarks/bench_vidur.py.
#
#   bash benchmarks/setup_vidur_paper.sh       # in $VIDUR_PAPER, default /tmp/vidur-paper
#
# Unpacks ../shared/peers/vidur-7d47513.tar.gz (the public repository's source tree, unchanged,
# without data/ and assets/) into $VIDUR_PAPER/src and makes $VIDUR_PAPER/venv from its
# requirements.txt (numpy, pandas, scikit-learn, wandb, kaleido, ddsketch, plotly_express,
# matplotlib, seaborn, fasteners), pinned to the versions setup_vidur.sh gives the 0.0.26 package
# so both Vidurs run on the same libraries (plotly<6 and kaleido 0.2.1 as ../shared/peers/README.md
# advises). The code is not installed: bench_vidur.py runs `python -m vidur.main` from src/, as its
# README says. Its profile tables are plain CSVs that bench_vidur.py writes from kvsim's roofline
# (benchmarks/vidur_profile.py, write_csv_profile): its measured attention.csv files are not public
# here. Never a kvsim dependency; the folder must be outside the repository.
set -euo pipefail

DEST="$(realpath -m "${VIDUR_PAPER:-/tmp/vidur-paper}")"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TARBALL="$HERE/../../shared/peers/vidur-7d47513.tar.gz"

case "$DEST/" in
  "$(cd "$HERE/.." && pwd)/"*) echo "setup_vidur_paper.sh: VIDUR_PAPER=$DEST is inside the repository; choose a path outside it" >&2; exit 2 ;;
esac
[ -f "$TARBALL" ] || { echo "setup_vidur_paper.sh: $TARBALL not found (../shared/peers beside the checkout)" >&2; exit 2; }

mkdir -p "$DEST"
if [ ! -f "$DEST/src/vidur/main.py" ]; then
  rm -rf "$DEST/src.tmp" && mkdir "$DEST/src.tmp"
  tar -xzf "$TARBALL" -C "$DEST/src.tmp"
  mv "$DEST/src.tmp"/vidur-7d47513 "$DEST/src" && rmdir "$DEST/src.tmp"
fi
[ -x "$DEST/venv/bin/python" ] || "$PYTHON" -m venv "$DEST/venv"
"$DEST/venv/bin/python" -m pip install --quiet --upgrade pip
"$DEST/venv/bin/python" -m pip install --quiet numpy==2.4.6 pandas==3.1.1 scikit-learn==1.9.1 fasteners==0.20 \
  ddsketch==3.0.1 plotly-express==0.4.1 "plotly<6" kaleido==0.2.1 wandb==0.31.0 matplotlib seaborn
(cd "$DEST/src" && WANDB_MODE=disabled "$DEST/venv/bin/python" -c "import vidur.main; print('vidur paper code (7d47513) ready in $DEST')")
