#!/usr/bin/env bash
# The run that shows a refactor changed nothing: in checkout SRC_TREE, a 200-step run of the main config
# (validation every 100 steps) and a 2-process torchrun (100 steps, validation every 50 on 200 sentences),
# into OUT_DIR/single and OUT_DIR/ddp. Do it for the commit before and after, then compare:
#   git worktree add /tmp/before <old commit>; git worktree add /tmp/after <new commit>
#   bash bench/same_run.sh /tmp/before /tmp/runs_before; bash bench/same_run.sh /tmp/after /tmp/runs_after
#   python bench/compare_runs.py /tmp/runs_before/single /tmp/runs_after/single   # and .../ddp
# usage: bash bench/same_run.sh SRC_TREE OUT_DIR [DATA_DIR]   (about 10 minutes on 2 CPU cores)
set -euo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"
SRC=$1; OUT=$2; DATA=${3:-${MULTI30K_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/transformer-mt/multi30k}}  # data/README.md's rule
PY=$HERE/.venv/bin/python
cd "$SRC"
rm -rf "$OUT"; mkdir -p "$OUT"
"$PY" train.py --config multi30k_de_en --run-dir "$OUT/single" --data-dir "$DATA" \
  --set train.max_steps=200 --set train.max_minutes=0 --set eval.every_steps=100 > "$OUT/single.log" 2>&1
OMP_NUM_THREADS=1 "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 train.py \
  --config multi30k_de_en --run-dir "$OUT/ddp" --data-dir "$DATA" --set train.max_steps=100 \
  --set train.max_minutes=0 --set eval.every_steps=50 --set data.eval_limit=200 > "$OUT/ddp.log" 2>&1
echo "wrote $OUT/single and $OUT/ddp"
