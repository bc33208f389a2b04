#!/usr/bin/env bash
# The prepared GPU run: bench/gpu.py (see its docstring and docs/benchmarks.md, "GPU"), its output also in
# OUT/gpu_log.txt. Needs the Multi30k files in data/multi30k (git-ignored) or --data-dir.
# Usage: [PY=python] bash bench/gpu.sh OUT [--smoke] [--train-minutes 5] [--budget-s 570] ...
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: bash bench/gpu.sh OUT [bench/gpu.py options]}"
PY="${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"  # the checkout's .venv if set up
mkdir -p "$OUT"
PYTHONUNBUFFERED=1 "$PY" bench/gpu.py "$@" 2>&1 | tee "$OUT/gpu_log.txt"
