#!/usr/bin/env bash
# A TopK sparse autoencoder on the middle of SmolLM2-135M (blocks.15.resid_post, 30 layers), on this CPU.
# 4608 features (8 x d_model 576), k = 32 active per token; Adam (0.9, 0.999), lr 7e-4, 100 warmup steps,
# cosine decay to 0; batches of 4096 vectors; AuxK on dead features (Gao et al. 2024).
# Text: tinyshakespeare and the English side of Multi30k (../shared/data, about 0.85M tokens); the last 5%
# of each file is held out. Activations are harvested once (passes stop at layer 15) into safetensors shards
# under SHARDS and read back on later epochs. At the end: sae/ (SAELens's format), eval.json (L0, fraction
# of variance explained, CE loss recovered, dead and dense features on the held-out text), sae.png, and
# features.html (top contexts of every feature, from the held-out text).
# FRONTIER=1 then trains the same SAE at k = 8, 16, 64, 128 (OUT_DIR-k8, ...: the shards are shared, only the
# SAE is trained) and draws held-out variance explained against L0 for the five into OUT_DIR/frontier.png.
# usage: [FRONTIER=1] recipes/sae_smollm2.sh [OUT_DIR] [extra `anatomy sae train` arguments...]   (THREADS=1 by default)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the repository; the data lives beside it in ../shared/data
DATA_DIR=${DATA_DIR:-$ROOT/../shared/data}
OUT=${1:-runs/sae-smollm2}
shift || true
SHARDS=${SHARDS:-runs/sae-shards}
TEXT=("$DATA_DIR/tinyshakespeare/input.txt")
for split in train val test_2016_flickr test_2017_flickr test_2017_mscoco test_2018_flickr; do
  TEXT+=("$DATA_DIR/multi30k/$split.en")
done
train() {  # train OUT K [extra arguments...]
  local out=$1 k=$2
  shift 2
  python -m anatomy.cli sae train --model smollm2 --point blocks.15.resid_post --data "${TEXT[@]}" --eval-fraction 0.05 \
    --kind topk --features 4608 --k "$k" --context 128 --skip 1 --batch-size 4096 --max-steps 3000 --lr 7e-4 \
    --warmup 100 --eval-every 100 --save-every 250 --log-every 20 --ce-contexts 64 --shards "$SHARDS" --out "$out" \
    --threads "${THREADS:-1}" --no-progress "$@"
}
[ -f "$OUT/eval.json" ] || train "$OUT" 32 "$@"
# the held-out text: the last 5% of each file, as training held it out
python "$ROOT/recipes/heldout_text.py" "$OUT/heldout.txt" "${TEXT[@]}"
python -m anatomy.cli sae features "$OUT" --data "$OUT/heldout.txt" --out "$OUT/features.html" --threads "${THREADS:-1}"
if [ "${FRONTIER:-0}" = 1 ]; then
  for k in 8 16 64 128; do
    [ -f "$OUT-k$k/eval.json" ] || train "$OUT-k$k" "$k" "$@"
  done
  python - "$OUT" <<'PY'
import json, sys
from anatomy.sae.plots import plot_frontier
out = sys.argv[1]
runs = []
for folder, k in [(out, 32)] + [(f"{out}-k{k}", k) for k in (8, 16, 64, 128)]:
    result = json.load(open(f"{folder}/eval.json"))
    runs.append({"l0": result["l0"], "fve": result["fve"], "label": f"k={k}, CE rec. {result['loss_recovered']:.3f}"})
plot_frontier(runs, f"{out}/frontier.png", "SmolLM2-135M blocks.15.resid_post, 4608 features, held-out text")
print(f"{out}/frontier.png")
PY
fi
