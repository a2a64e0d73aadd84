#!/usr/bin/env bash
# A TopK sparse autoencoder on the middle of SmolLM2-135M (blocks.15.resid_post, 30 layers), on this CPU.
# 4608 features (8 x d_model 576), k = 32 active per token; Adam (0.9, 0.999), lr 7e-4, 100 warmup steps,
# cosine decay to 0; batches of 4096 vectors; AuxK on dead features (Gao et al. 2024).
# Text: tinyshakespeare and the English side of Multi30k (../shared/data, about 0.85M tokens); the last 5%
# of each file is held out. Activations are harvested once (passes stop at layer 15) into safetensors shards
# under SHARDS and read back on later epochs. At the end: sae/ (SAELens's format), eval.json (L0, fraction
# of variance explained, CE loss recovered, dead and dense features on the held-out text), sae.png, and
# features.html (top contexts of every feature, from the held-out text).
# usage: recipes/sae_smollm2.sh [OUT_DIR] [extra `anatomy sae train` arguments...]   (THREADS=1 by default)
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
python -m anatomy.cli sae train --model smollm2 --point blocks.15.resid_post --data "${TEXT[@]}" --eval-fraction 0.05 \
  --kind topk --features 4608 --k 32 --context 128 --skip 1 --batch-size 4096 --max-steps 3000 --lr 7e-4 --warmup 100 \
  --eval-every 100 --save-every 250 --log-every 20 --ce-contexts 64 --shards "$SHARDS" --out "$OUT" \
  --threads "${THREADS:-1}" --no-progress "$@"
# the held-out text: the last 5% of each file, as training held it out
python - "$OUT/heldout.txt" "${TEXT[@]}" <<'PY'
import sys
parts = []
for path in sys.argv[2:]:
    text = open(path, encoding="utf-8").read()
    parts.append(text[int(len(text) * 0.95):])
open(sys.argv[1], "w", encoding="utf-8").write("\n".join(parts))
PY
python -m anatomy.cli sae features "$OUT" --data "$OUT/heldout.txt" --out "$OUT/features.html" --threads "${THREADS:-1}"
