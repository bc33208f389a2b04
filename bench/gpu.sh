#!/usr/bin/env bash
# On a machine with CUDA: base-config training throughput in bf16 (ours vs nn.Transformer, with MFU),
# then decoding speed (with no checkpoint given, decode_speed.py first trains one for 5 minutes).
# Usage: bash bench/gpu.sh [DATA_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR="${1:-${MULTI30K_DIR:-../shared/data/multi30k}}"
PY="${PY:-python}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$PY bench/train_throughput.py --device cuda --precision bf16 --sizes base default \
    --max-tokens 25000 --steps 30 --data-dir "$DATA_DIR"
$PY bench/decode_speed.py --device cuda --data-dir "$DATA_DIR"
