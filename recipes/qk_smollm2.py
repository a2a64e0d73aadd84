"""Why SmolLM2's induction head looks where it looks: the README's worked example of QK attributions.

    python recipes/qk_smollm2.py [TRANSCODER_RUN] --threads 2

On the README's prompt ("The capital of the state containing Dallas is Austin. The capital of Germany is"),
the head with the most attention on the induction positions (from a repeated token to the token after its
earlier occurrence) is found from the model's patterns; its score at its strongest such pair is split into
pairs of nodes of the prompt's attribution graph (anatomy.circuits.qk_attribution), and the pairs are summed
by position. TRANSCODER_RUN: a trained transcoder set; without one, a random set calibrated to fire as trained
ones do (anatomy/bench/circuit_sets.py) stands in, and the output says so: its features mean nothing, so
what the MLPs wrote sits in the error nodes, and the positions, the tokens and the errors tell the story.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import anatomy
from anatomy.bench.circuit_sets import calibrated_random_transcoders
from anatomy.circuits import qk_attribution
from anatomy.circuits.attribute import prompt_ids

PROMPT = "The capital of the state containing Dallas is Austin. The capital of Germany is"


def induction_head(model, ids: torch.Tensor) -> tuple[int, int, int, int, float]:
    """(layer, head, query, key, weight): the head with the largest mean attention from each repeated token to the
    token after its earlier occurrence, at its strongest such pair."""
    L = model.config.n_layers
    pairs = [(p, j + 1) for p in range(len(ids)) for j in range(p - 1) if ids[j] == ids[p]]
    with torch.no_grad(), anatomy.trace(model, [f"blocks.{l}.attn.pattern" for l in range(L)]) as t:
        model(ids[None])
    best = max(((sum(float(t[f"blocks.{l}.attn.pattern"][0, h, p, k]) for p, k in pairs) / len(pairs), l, h)
                for l in range(L) for h in range(model.config.n_heads)))
    _, layer, head = best
    pattern = t[f"blocks.{layer}.attn.pattern"][0, head]
    query, key = max(pairs, key=lambda pair: float(pattern[pair]))
    return layer, head, query, key, float(pattern[query, key])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", help="a trained transcoder set (default: random, calibrated)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = anatomy.from_pretrained("smollm2").eval()
    ids = prompt_ids(model, PROMPT)
    if args.run and Path(args.run).exists():
        transcoders, which = anatomy.load_transcoders(args.run), f"the transcoders of {args.run}"
    else:
        transcoders = calibrated_random_transcoders(model, ids[None])
        which = "RANDOM transcoders calibrated to fire 42 features per token (no trained set given): features mean nothing"
    labels = model.tokenizer.labels(ids.tolist())
    layer, head, query, key, weight = induction_head(model, ids)
    result = qk_attribution(model, transcoders, ids, layer, head, query, key, top=8)
    print(f"SmolLM2-135M, {which}")
    print(f"L{layer} H{head} at {labels[query]!r} @{query} gives {weight:.3f} of its attention to {labels[key]!r} @{key}")
    print(result.check)
    print("pairs of positions (query side x key side: the pair terms of their nodes, summed)")
    for q, k, term in result.position_pairs[:5]:
        print(f"  {labels[q]!r:>12} @{q:<3} x {labels[k]!r:>12} @{k:<3} {term:+.3f}")
    print("pairs of nodes")
    for q, k, term in result.pairs[:6]:
        print(f"  {q.name:>22} x {k.name:<22} {term:+.3f}")
    for side, marginals in (("query", result.query_positions), ("key", result.key_positions)):
        shown = ", ".join(f"{labels[p]!r} @{p} {v:+.2f}" for p, v in marginals[:4])
        print(f"{side} side by position: {shown}")
    print("terms with no node: " + ", ".join(f"{name} {value:+.3f}" for name, value in result.no_node.items()))


if __name__ == "__main__":
    main()
