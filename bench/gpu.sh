#!/usr/bin/env bash
# The prepared GPU run: bench/gpu.py (see its docstring and docs/benchmarks.md, "GPU"), its output also in
# OUT/gpu_log.txt. Needs the Multi30k files: --data-dir, $MULTI30K_DIR, or a copy in the checkout's
# data/multi30k (git-ignored), used when it is there.
# Usage: [PY=python] bash bench/gpu.sh OUT [--smoke] [--train-minutes 5] [--budget-s 570] ...
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: bash bench/gpu.sh OUT [bench/gpu.py options]}"
PY="${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"  # the checkout's .venv if set up
mkdir -p "$OUT"
if [ -z "${MULTI30K_DIR:-}" ] && [ -d data/multi30k ]; then export MULTI30K_DIR=data/multi30k; fi
PYTHONUNBUFFERED=1 "$PY" bench/gpu.py "$@" 2>&1 | tee "$OUT/gpu_log.txt"
