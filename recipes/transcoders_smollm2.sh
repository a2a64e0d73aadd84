#!/usr/bin/env bash
# A transcoder on every one of SmolLM2-135M's 30 layers, trained in one pass, on this CPU.
# Each reads its MLP's input (blocks.L.mlp_norm.out) and predicts its output (blocks.L.mlp.out) as a skip
# transcoder: 2304 BatchTopK features (4 x d_model, k = 32 a token on average) plus a linear path that starts
# at the least-squares map from input to output (Paulo et al. 2025), the encoder at a tenth of its norm;
# Adam (0.9, 0.999), lr 4e-3, 50 warmup steps, cosine decay to 0; batches of 1024 tokens, 600 steps
# (0.61M tokens, about 0.8 of an epoch); AuxK on features silent for 250k tokens.
# Why these: 49 minutes of 2 shared cores (measured; BENCHMARKS.md) train about 0.6M tokens through all 30
# layers (harvest and training cost about the same: 265 tokens/s and 265 rows/s with one thread on the shared machine, `anatomy bench --only
# sae`). Measured on layers 2, 14, 26 (150 and 300 steps of 1024; FVE of the MLP output on held-out
# Shakespeare): the linear path alone explains 0.36 / 0.62 / 0.49; features started at full strength added
# nothing in 150 steps, started small 0.05-0.10; lr 4e-3 gave 0.67 / 0.76 / 0.70 after 300 steps (7e-4:
# far less, 8e-3: the same with more dead features); k = 64 gained 0.01; no skip path: 0.18 / 0.30 / 0.29.
# Text: tinyshakespeare and the English side of Multi30k (../shared/data, about 0.83M tokens); the last 5%
# of each file is held out. One harvest pass per fill records every layer's MLP input and output at once,
# stopping at layer 29's MLP (no final norm, no LM head), into a buffer of at most BUFFER GiB (bfloat16);
# a fill is harvested again each epoch, so memory stays bounded whatever the size of the text.
# At the end: transcoders/ (circuit-tracer's layout: circuit-tracer and anatomy.load_transcoders read it),
# eval.json (per layer FVE of the MLP output, L0 and dead features on the held-out text; with all 30
# transcoders spliced in at once, the CE loss recovered without and with error terms, against zero and
# mean ablation), transcoders.png, and heldout.txt.
# usage: recipes/transcoders_smollm2.sh [OUT_DIR] [extra `anatomy sae train-transcoders` arguments...]
#        THREADS=2 by default (the full run: 49 minutes measured on 2 shared cores, 4.7 GB at most); BUFFER=1 (GiB).
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
    --kind batchtopk --features 2304 --k 32 --context 128 --skip 1 --batch-size 1024 --max-steps 600 --lr 4e-3 \
    --warmup 50 --dead-tokens 250000 --eval-every 125 --save-every 125 --log-every 20 --ce-contexts 32 \
    --buffer-memory "${BUFFER:-1}" \
    --out "$OUT" --threads "${THREADS:-2}" --no-progress ${RESUME[@]+"${RESUME[@]}"} "$@"
fi
# the held-out text: the last 5% of each file, as training held it out (for `anatomy sae eval-transcoders`)
python "$ROOT/recipes/heldout_text.py" "$OUT/heldout.txt" "${TEXT[@]}"
echo "$OUT/transcoders: anatomy sae eval-transcoders $OUT --data $OUT/heldout.txt"
