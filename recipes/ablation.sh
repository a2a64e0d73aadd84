#!/usr/bin/env bash
# What each design choice buys, on nanoGPT's CPU budget for tinyshakespeare: the char-LM recipe
# (recipes/char_shakespeare.sh: 2000 steps x 12 x 64 characters, one thread, the 90/10 split, the same
# 50 fixed validation batches), changed one flag at a time (architecture, then optimisation: learning
# rate, warm-up, schedule, optimizer, checkpoint averaging), then the recipe's VARIANTs (modern, tuned).
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
  [wsd]="--schedule wsd --min-lr-ratio 0"
  [muon]="--optimizer muon"
  [average-4]="--average-last 4 --keep 4 --save-every 125"
  [modern]="VARIANT=modern"
  [tuned]="VARIANT=tuned"
)
ORDER="baseline post-norm rmsnorm relu swiglu sinusoidal rotary alibi no-bias untied dropout-0.1 qk-norm
       lr-2e-3 lr-5e-4 warmup-0 warmup-300 constant-lr wsd muon average-4 modern tuned"

for name in ${VARIANTS:-$ORDER}; do
  if [ -z "${FLAGS[$name]+set}" ]; then
    echo "unknown variant '$name'; known: $ORDER" >&2
    exit 2
  fi
  for seed in ${SEEDS:-1337 1338 1339}; do
    run="$OUT/$name/seed$seed"
    if [[ "${FLAGS[$name]}" == VARIANT=* ]]; then
      run_once "$run" env "${FLAGS[$name]}" "$HERE/char_shakespeare.sh" "$run" --seed "$seed" "$@"
    else
      # shellcheck disable=SC2086  # the flags are words
      run_once "$run" "$HERE/char_shakespeare.sh" "$run" --seed "$seed" ${FLAGS[$name]} "$@"
    fi
  done
done
python "$HERE/ablation_report.py" "$OUT"
