#!/usr/bin/env bash
# Character-level language model on tinyshakespeare: nanoGPT's CPU recipe, in anatomy.
# 4 layers, 4 heads, d_model 128, context 64, batch 12, 2000 steps, lr 1e-3 -> 1e-4 (cosine,
# 100 warmup), AdamW (0.9, 0.99), weight decay 0.1, clip 1.0, no dropout.
# First 90% of the characters train, the last 10% validate.
# usage: [VARIANT=baseline|modern|muon] recipes/char_shakespeare.sh [OUT_DIR] [extra anatomy-train arguments...]
#   VARIANT=baseline (default): pre-norm, LayerNorm, GELU, learned positions, biases, tied embeddings.
#   VARIANT=modern: the same budget with SwiGLU (d_ff 336: 3 x 128 x 336 weights, 2% fewer than
#   GELU's 2 x 128 x 512, and a multiple of 16 runs 12% faster here than 341), rotary positions and
#   no biases. RMSNorm is left out: it changed the loss by +0.003 alone and made the step 8% slower
#   on this CPU (recipes/ablation.sh measures each change alone and together; recipes/README.md).
#   VARIANT=muon: modern, with Muon for the blocks' matrices (AdamW for the rest) at lr 5e-3, its
#   orthogonalisation two Polar Express iterations after scaling by the Gram-matrix bound (torch's
#   default, Jordan's five after the Frobenius norm, spends twice the optimizer's time for the
#   same loss; recipes/README.md has both measured), for 1900 steps: Muon's step costs about 12%
#   more than AdamW's, so 5% fewer steps keep the run within 1.1x the modern recipe's time
#   (1.06x over 6 seeds, each pair 1.05-1.08x; val loss 1.594; --max-steps 2000: 1.12x, 1.583).
# Extra arguments come last and win (e.g. --seed 7, --max-steps 50).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the repository; data lives beside it in ../shared/data
DATA=${DATA:-$ROOT/../shared/data/tinyshakespeare/input.txt}  # DATA=FILE overrides
OUT=${1:-runs/char-shakespeare}
shift || true
case "${VARIANT:-baseline}" in
  baseline) CHANGES=() ;;
  modern) CHANGES=(--activation swiglu --d-ff 336 --pos-encoding rotary --no-bias) ;;
  muon) CHANGES=(--activation swiglu --d-ff 336 --pos-encoding rotary --no-bias --optimizer muon --lr 5e-3
              --ns-coefficients polar-express --ns-steps 2 --ns-norm gram --max-steps 1900) ;;
  *) echo "VARIANT must be baseline, modern or muon, not '${VARIANT}'" >&2; exit 2 ;;
esac
python -m anatomy.cli train lm --data "$DATA" --val-fraction 0.1 --tokenizer char --out "$OUT" \
  --n-layers 4 --n-heads 4 --d-model 128 --context 64 --batch-size 12 --dropout 0.0 \
  --max-steps 2000 --lr 1e-3 --min-lr-ratio 0.1 --warmup 100 --beta2 0.99 --weight-decay 0.1 --clip 1.0 \
  --eval-every 250 --eval-batches 50 --save-every 500 --log-every 50 --threads "${THREADS:-1}" --no-progress \
  ${CHANGES[@]+"${CHANGES[@]}"} "$@"
