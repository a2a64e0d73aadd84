#!/usr/bin/env bash
# A transcoder on every one of SmolLM2-135M's 30 layers, trained in one pass, on this CPU.
# Each reads its MLP's input (blocks.L.mlp_norm.out) and predicts its output (blocks.L.mlp.out) as a skip
# transcoder: 2304 BatchTopK features (4 x d_model, k = 32 a token on average) plus a linear path that starts
# at the least-squares map from input to output (Paulo et al. 2025); Adam (0.9, 0.999), lr 7e-4, 30 warmup
# steps, cosine decay to 0; batches of 2048 tokens, 560 steps (1.15M tokens, about 1.4 epochs).
# Text: tinyshakespeare and the English side of Multi30k (../shared/data, about 0.83M tokens); the last 5%
# of each file is held out. One harvest pass per fill records every layer's MLP input and output at once,
# stopping at layer 29's MLP (no final norm, no LM head), into a buffer of at most BUFFER GiB (bfloat16);
# a fill is harvested again each epoch, so memory stays bounded whatever the size of the text.
# At the end: transcoders/ (circuit-tracer's layout: circuit-tracer and anatomy.load_transcoders read it),
# eval.json (per layer FVE of the MLP output, L0 and dead features on the held-out text; with all 30
# transcoders spliced in at once, the CE loss recovered without and with error terms, against zero and
# mean ablation), transcoders.png, and heldout.txt.
# usage: recipes/transcoders_smollm2.sh [OUT_DIR] [extra `anatomy sae train-transcoders` arguments...]
#        THREADS=2 by default (the full run: about an hour on 2 idle cores); BUFFER=1 (GiB).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the repository; the data lives beside it in ../shared/data
DATA_DIR=${DATA_DIR:-$ROOT/../shared/data}
OUT=${1:-runs/transcoders-smollm2}
shift || true
TEXT=("$DATA_DIR/tinyshakespeare/input.txt")
for split in train val test_2016_flickr test_2017_flickr test_2017_mscoco test_2018_flickr; do
  TEXT+=("$DATA_DIR/multi30k/$split.en")
done
if [ ! -f "$OUT/eval.json" ]; then
  RESUME=()
  [ -d "$OUT/checkpoints" ] && RESUME=(--resume)  # a killed run continues where its last checkpoint left it
  python -m anatomy.cli sae train-transcoders --model smollm2 --data "${TEXT[@]}" --eval-fraction 0.05 \
    --kind batchtopk --features 2304 --k 32 --context 128 --skip 1 --batch-size 2048 --max-steps 560 --lr 7e-4 \
    --warmup 30 --eval-every 70 --save-every 70 --log-every 10 --ce-contexts 32 --buffer-memory "${BUFFER:-1}" \
    --out "$OUT" --threads "${THREADS:-2}" --no-progress ${RESUME[@]+"${RESUME[@]}"} "$@"
fi
# the held-out text: the last 5% of each file, as training held it out (for `anatomy sae eval-transcoders`)
python "$ROOT/recipes/heldout_text.py" "$OUT/heldout.txt" "${TEXT[@]}"
echo "$OUT/transcoders: anatomy sae eval-transcoders $OUT --data $OUT/heldout.txt"
