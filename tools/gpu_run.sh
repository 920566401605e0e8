#!/usr/bin/env bash
# Everything the book measures on a GPU, in one run, from the repository root on a
# CUDA machine:  bash tools/gpu_run.sh OUT_DIR
#   OUT_DIR/bench/      python -m flashbook.bench (the sweep of chapter 9)
#   OUT_DIR/blocks/     python -m flashbook.bench --sweep-blocks (the explorer's data)
#   OUT_DIR/ladder/     python -m flashbook.bench --ladder (chapter 10's rungs)
#   OUT_DIR/notebooks/  the GPU chapters executed top to bottom (tools/run_notebooks.py)
set -u
shopt -s nullglob
out=${1:?usage: bash tools/gpu_run.sh OUT_DIR}
py=${PYTHON:-python3}
mkdir -p "$out"
status=0
$py -m flashbook.bench --out "$out/bench" --no-progress || status=1
$py -m flashbook.bench --sweep-blocks --out "$out/blocks" --no-progress || status=1
$py -m flashbook.bench --ladder --out "$out/ladder" --no-progress || status=1
# also OUT_DIR/notebooks/gpu_outputs/: what the book shows for cells tagged gpu (commit it
# to benchmarks/results/gpu_outputs/)
$py tools/run_notebooks.py "$out/notebooks" notebooks/0[6-9]_*.ipynb notebooks/1[0-9]_*.ipynb || status=1
exit $status
