#!/usr/bin/env bash
# The README's worked example: the attribution graph of a prompt SmolLM2-135M gets right, through the
# transcoders of recipes/transcoders_smollm2.sh (trained first if TRANSCODER_RUN has none).
#   prompt   "The capital of the state containing Dallas is Austin. The capital of Germany is" -> " Berlin"
# Writes OUT/graph.html (the page: every feature's promoted tokens and top contexts on the held-out text),
# OUT/graph.json (Neuronpedia's format), OUT/graph.safetensors (the whole graph), OUT/summary.txt (the check,
# the scores, the pruned graph), OUT/ablation.txt (the most influential feature ablated in the model, beside
# the graph's prediction, frozen and not), and docs/circuits-smollm2.png (the page, that feature clicked).
# usage: recipes/circuits_smollm2.sh [TRANSCODER_RUN] [OUT_DIR]        THREADS=2 by default
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUN=${1:-runs/transcoders-smollm2}
OUT=${2:-runs/circuits-smollm2}
PROMPT="The capital of the state containing Dallas is Austin. The capital of Germany is"
[ -f "$RUN/transcoders/config.yaml" ] || "$ROOT/recipes/transcoders_smollm2.sh" "$RUN"
mkdir -p "$OUT"
python -m anatomy.cli circuits "$PROMPT" --model smollm2 --transcoders "$RUN" --threads "${THREADS:-2}" \
  --contexts "$RUN/heldout.txt" --out "$OUT/graph.html" "$OUT/graph.json" "$OUT/graph.safetensors" | tee "$OUT/summary.txt"
# the most influential feature of the pruned graph, ablated where it fires
TOP=$(python - "$OUT/graph.safetensors" <<'PY'
import sys
from anatomy.circuits import load_graph, prune
graph = load_graph(sys.argv[1])
influence = prune(graph).influence
node = max((i for i, n in enumerate(graph.nodes) if n.kind == "feature"), key=lambda i: float(influence[i]))
node = graph.nodes[node]
print(f"{node.layer}:{node.index}@{node.column}")
PY
)
: > "$OUT/ablation.txt"
for FREEZE in all none; do
  python -m anatomy.cli circuits "$PROMPT" --model smollm2 --transcoders "$RUN" --threads "${THREADS:-2}" \
    --out "$OUT/ablated-$FREEZE.html" --ablate "$TOP" --freeze "$FREEZE" | sed -n '/^interventions/,$p' >> "$OUT/ablation.txt"
done
cat "$OUT/ablation.txt"
python "$ROOT/recipes/graph_figure.py" "$OUT/graph.html" "$ROOT/docs/circuits-smollm2.png"
