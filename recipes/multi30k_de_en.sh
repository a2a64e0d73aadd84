#!/usr/bin/env bash
# German -> English translation on Multi30k (task 1): the paper's encoder-decoder, scaled to a CPU.
# Joint byte-level BPE (8000) over both languages, shared embeddings, sinusoidal positions scaled
# embeddings (sqrt(d_model)), label smoothing 0.1, AdamW (0.9, 0.98). BLEU: sacrebleu on
# test_2016_flickr at the end, beam search (5 beams, length penalty 1.0; the CPU recipe).
#
# usage: recipes/multi30k_de_en.sh [OUT_DIR] [extra anatomy-train arguments...]
# CPU (what recipes/README.md reports: 40.3 BLEU, 39.0 greedy): the defaults below, ~43 min on one core.
# Full run (GPU): SIZE=full recipes/multi30k_de_en.sh runs/de-en-full
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the repository; data lives beside it in ../shared/data
D=${DATA:-$ROOT/../shared/data/multi30k}  # DATA=FOLDER overrides
OUT=${1:-runs/multi30k-de-en}
shift || true
if [ "${SIZE:-cpu}" = full ]; then
  MODEL=(--d-model 512 --n-heads 8 --n-layers 6 --d-ff 2048 --dropout 0.1)
  TRAIN=(--batch-size 128 --max-steps 20000 --schedule inverse-sqrt --lr 1.0 --warmup 4000 --eval-every 1000
         --save-every 1000 --bleu-samples 200)
else
  MODEL=(--d-model 256 --n-heads 4 --n-layers 3 --d-ff 1024 --dropout 0.1)
  TRAIN=(--batch-size 64 --max-steps ${STEPS:-3000} --schedule cosine --lr 1e-3 --min-lr-ratio 0.05 --warmup 200
         --eval-every 500 --save-every 500 --threads "${THREADS:-1}" --beams 5 --length-penalty 1.0)
fi
python -m anatomy.cli train seq2seq --src "$D/train.de" --tgt "$D/train.en" \
  --val-src "$D/val.de" --val-tgt "$D/val.en" --test-src "$D/test_2016_flickr.de" --test-tgt "$D/test_2016_flickr.en" \
  --tokenizer bpe --vocab-size 8000 --max-len 64 --out "$OUT" --pos-encoding sinusoidal \
  --label-smoothing 0.1 --beta1 0.9 --beta2 0.98 --weight-decay 0.01 --log-every 50 --no-progress \
  "${MODEL[@]}" "${TRAIN[@]}" "$@"
