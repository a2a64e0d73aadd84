#!/usr/bin/env bash
# SST-2 sentiment with a small encoder trained from scratch (dev.tsv is the labelled test split).
# WordPiece (8000) trained on train.tsv; 2 layers, d_model 128, mean pooling, max 64 tokens.
# usage: [VARIANT=single|ensemble] [SEED=1337] [STEPS=2000] recipes/sst2_scratch.sh [OUT_DIR] [extra args...]
#   VARIANT=single (default): one encoder, learned positions, STEPS x 64 sentences.
#   VARIANT=ensemble: the same budget spent on two encoders, STEPS/2 x 64 sentences each: learned
#   positions (seed SEED, OUT_DIR/member-1), then rotary positions (seed SEED+1, OUT_DIR/member-2),
#   whose final evaluation also scores the mean of both encoders' class probabilities
#   (ensemble_accuracy in OUT_DIR/member-2/metrics.jsonl; recipes/README.md measures both variants).
# Extra arguments come last and win (e.g. --threads 2); give the seed as SEED=N.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the repository; data lives beside it in ../shared/data
D=${DATA:-$ROOT/../shared/data/sst2}  # DATA=FOLDER overrides
OUT=${1:-runs/sst2-scratch}
shift || true
SEED=${SEED:-1337}
STEPS=${STEPS:-2000}
train() {
  python -m anatomy.cli train classify --train "$D/train.tsv" --val "$D/dev.tsv" \
    --tokenizer wordpiece --vocab-size 8000 --max-len 64 --pooling mean \
    --d-model 128 --n-heads 4 --n-layers 2 --dropout 0.1 \
    --batch-size 64 --lr 1e-3 --warmup 100 --weight-decay 0.01 \
    --eval-every 500 --save-every 1000 --log-every 100 --threads "${THREADS:-1}" --no-progress "$@"
}
case "${VARIANT:-single}" in
  single) train --out "$OUT" --pos-encoding learned --max-steps "$STEPS" --seed "$SEED" "$@" ;;
  ensemble)
    train --out "$OUT/member-1" --pos-encoding learned --max-steps $((STEPS / 2)) --seed "$SEED" "$@"
    train --out "$OUT/member-2" --pos-encoding rotary --max-steps $((STEPS / 2)) --seed $((SEED + 1)) \
      --ensemble-with "$OUT/member-1" "$@" ;;
  *) echo "VARIANT must be single or ensemble, not '${VARIANT}'" >&2; exit 2 ;;
esac
