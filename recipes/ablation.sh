#!/usr/bin/env bash
# What each design choice buys, on nanoGPT's CPU budget for tinyshakespeare: the char-LM recipe
# (recipes/char_shakespeare.sh: 2000 steps x 12 x 64 characters, one thread, the 90/10 split, the same
# 50 fixed validation batches), changed one flag at a time (architecture, then optimisation: learning
# rate, warm-up, schedule), then the recipe's modern VARIANT, and on it the optimisation options
# (WSD schedule, checkpoint averaging, Muon: VARIANT=muon).
# Each variant runs once per seed; recipes/ablation_report.py then writes OUT/ablation.md (val loss mean
# and spread, parameters, wall time, tokens/s) and OUT/ablation.png (the validation curves).
#
# usage: recipes/ablation.sh [OUT_DIR] [extra anatomy-train arguments for every run...]
#   SEEDS="1337 1338 1339" (default)   VARIANTS="baseline post-norm ..." (default: all below)
#   a smoke test: SEEDS=1 VARIANTS="baseline modern" recipes/ablation.sh runs/ablation-smoke --max-steps 50
# Runs that finished (OUT/VARIANT/seedN/model exists) are skipped, so a killed ablation continues.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/run_once.sh"
OUT=${1:-runs/ablation}
shift || true

# name -> the flags that differ from the baseline recipe
declare -A FLAGS=(
  [baseline]=""
  [post-norm]="--norm-position post"
  [rmsnorm]="--norm rmsnorm"
  [relu]="--activation relu"
  [swiglu]="--activation swiglu --d-ff 341"
  [sinusoidal]="--pos-encoding sinusoidal"
  [rotary]="--pos-encoding rotary"
  [alibi]="--pos-encoding alibi"
  [no-bias]="--no-bias"
  [untied]="--untied"
  [dropout-0.1]="--dropout 0.1"
  [qk-norm]="--qk-norm per_head"
  [lr-2e-3]="--lr 2e-3"
  [lr-5e-4]="--lr 5e-4"
  [warmup-0]="--warmup 0"
  [warmup-300]="--warmup 300"
  [constant-lr]="--schedule constant"
  [modern]="VARIANT=modern"
  # the optimisation options, on the modern variant: a schedule, an optimizer, checkpoint averaging
  [modern-wsd]="VARIANT=modern --schedule wsd --lr 2e-3 --min-lr-ratio 0"
  [modern-average-4]="VARIANT=modern --average-last 4 --keep 4 --save-every 125"
  # Muon on the same 2000 steps as every other row; muon-1900 is VARIANT=muon as the recipe runs it
  # (5% fewer steps, so that its time stays within 1.1x the modern recipe's)
  [muon]="VARIANT=muon --max-steps 2000"
  [muon-jordan-5]="VARIANT=muon --max-steps 2000 --ns-coefficients jordan --ns-steps 5 --ns-norm frobenius"  # torch.optim.Muon's
  [muon-1900]="VARIANT=muon"
)
ORDER="baseline post-norm rmsnorm relu swiglu sinusoidal rotary alibi no-bias untied dropout-0.1 qk-norm
       lr-2e-3 lr-5e-4 warmup-0 warmup-300 constant-lr modern modern-wsd modern-average-4 muon muon-jordan-5
       muon-1900"

for name in ${VARIANTS:-$ORDER}; do
  if [ -z "${FLAGS[$name]+set}" ]; then
    echo "unknown variant '$name'; known: $ORDER" >&2
    exit 2
  fi
  for seed in ${SEEDS:-1337 1338 1339}; do
    run="$OUT/$name/seed$seed"
    if [[ "${FLAGS[$name]}" == VARIANT=* ]]; then  # VARIANT=NAME [flags...]: the recipe's variant, changed
      read -r variant flags <<< "${FLAGS[$name]}"
      # shellcheck disable=SC2086  # the flags are words
      run_once "$run" env "$variant" "$HERE/char_shakespeare.sh" "$run" --seed "$seed" $flags "$@"
    else
      # shellcheck disable=SC2086  # the flags are words
      run_once "$run" "$HERE/char_shakespeare.sh" "$run" --seed "$seed" ${FLAGS[$name]} "$@"
    fi
  done
done
python "$HERE/ablation_report.py" "$OUT"
