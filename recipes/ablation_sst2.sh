#!/usr/bin/env bash
# Positions on SST-2 from scratch (recipes/sst2_scratch.sh, its budget unchanged): learned (the
# recipe), rotary, and none at all (mean pooling over an order-blind encoder: a bag of words).
# Each runs once per seed; recipes/ablation_report.py then writes OUT/ablation.md with dev accuracy.
# usage: recipes/ablation_sst2.sh [OUT_DIR] [extra anatomy-train arguments for every run...]
#   SEEDS="1337 1338 1339" (default)   VARIANTS="learned rotary none" (default)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/run_once.sh"
OUT=${1:-runs/ablation-sst2}
shift || true
for name in ${VARIANTS:-learned rotary none}; do
  case "$name" in learned|rotary|none) ;; *) echo "unknown variant '$name'; known: learned rotary none" >&2; exit 2 ;; esac
  for seed in ${SEEDS:-1337 1338 1339}; do
    run_once "$OUT/$name/seed$seed" "$HERE/sst2_scratch.sh" "$OUT/$name/seed$seed" --seed "$seed" --pos-encoding "$name" "$@"
  done
done
python "$HERE/ablation_report.py" "$OUT" --baseline learned
