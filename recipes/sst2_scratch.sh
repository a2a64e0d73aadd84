#!/usr/bin/env bash
# SST-2 sentiment with a small encoder trained from scratch (dev.tsv is the labelled test split).
# WordPiece (8000) trained on train.tsv; 2 layers, d_model 128, mean pooling, max 64 tokens.
# usage: recipes/sst2_scratch.sh [OUT_DIR] [extra anatomy-train arguments...]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the repository; data lives beside it in ../shared/data
D=${DATA:-$ROOT/../shared/data/sst2}  # DATA=FOLDER overrides
OUT=${1:-runs/sst2-scratch}
shift || true
python -m anatomy.cli train classify --train "$D/train.tsv" --val "$D/dev.tsv" --out "$OUT" \
  --tokenizer wordpiece --vocab-size 8000 --max-len 64 --pooling mean \
  --d-model 128 --n-heads 4 --n-layers 2 --dropout 0.1 --pos-encoding learned \
  --batch-size 64 --max-steps ${STEPS:-2000} --lr 1e-3 --warmup 100 --weight-decay 0.01 \
  --eval-every 500 --save-every 1000 --log-every 100 --threads "${THREADS:-1}" --no-progress "$@"
