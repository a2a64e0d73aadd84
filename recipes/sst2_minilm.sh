#!/usr/bin/env bash
# SST-2 sentiment by fine-tuning MiniLM (sentence-transformers/all-MiniLM-L6-v2, 6 layers, d 384),
# loaded with anatomy.from_pretrained("minilm"), with a new classification head on mean pooling.
# CPU-sized: STEPS x 32 examples of train.tsv (default 1000 x 32 = 32,000, 48% of one epoch),
# max 64 tokens. A full run: STEPS=4200 (2 epochs).
# usage: recipes/sst2_minilm.sh [OUT_DIR] [extra anatomy-train arguments...]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the repository; data lives beside it in ../shared/data
D=${DATA:-$ROOT/../shared/data/sst2}  # DATA=FOLDER overrides
OUT=${1:-runs/sst2-minilm}
shift || true
python -m anatomy.cli train classify --train "$D/train.tsv" --val "$D/dev.tsv" --out "$OUT" \
  --init minilm --max-len 64 --pooling mean --dropout 0.1 \
  --batch-size 32 --max-steps ${STEPS:-1000} --lr 1e-4 --warmup 100 --weight-decay 0.01 --min-lr-ratio 0.0 \
  --eval-every 500 --save-every 500 --log-every 50 --threads "${THREADS:-1}" --no-progress "$@"
