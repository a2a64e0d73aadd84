"""auto-circuit's side of the discovery bench, run by the python of auto-circuit's own environment
(it needs TransformerLens 2.x): a transformers GPT-2 folder as a HookedTransformer with the weights as
they are (no folding, no centring), auto-circuit's patchable model with split q/k/v inputs, and its
mask_gradient_prune_scores on the given pairs. Imports nothing from anatomy; the test fixtures'
script (tests/circuits/fixtures/make_autocircuit_fixtures.py) uses the same functions.

    python autocircuit_worker.py MODEL_FOLDER PAIRS.safetensors SAMPLES OUT.json [ACDC_BASE ACDC_EXPONENT]

With the last two, ACDC too, at tau = ACDC_BASE * 10**ACDC_EXPONENT: the edges it keeps and its seconds.
"""

from __future__ import annotations

import json
import sys
import time

import torch


def hooked_gpt2(folder: str):
    """The GPT-2 folder as a TransformerLens HookedTransformer, weights unchanged, heads' outputs and
    split q/k/v inputs on (what auto-circuit's patchable model reads)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(folder).eval()
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, d_head=c.n_embd // c.n_head, n_heads=c.n_head,
        d_mlp=c.n_inner or 4 * c.n_embd, d_vocab=c.vocab_size, n_ctx=c.n_positions, act_fn="gelu_new",
        normalization_type="LN", positional_embedding_type="standard", original_architecture="GPT2LMHeadModel",
        default_prepend_bos=False, eps=c.layer_norm_epsilon)
    model = HookedTransformer(cfg)
    model.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), fold_ln=False, center_writing_weights=False,
                                      center_unembed=False, fold_value_biases=False)
    model.set_use_attn_result(True)
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    return model.eval()


def source_name(name: str) -> str:
    """auto-circuit's source names -> anatomy's: Resid Start, A1.2, MLP 0 -> embed, L1H2, L0 MLP."""
    if name == "Resid Start":
        return "embed"
    if name.startswith("MLP "):
        return f"L{name[4:]} MLP"
    layer, head = name[1:].split(".")
    return f"L{layer}H{head}"


def destination_name(name: str) -> str:
    """A1.2.Q, MLP 0, Resid End -> L1H2.q, L0 MLP.in, logits."""
    if name == "Resid End":
        return "logits"
    if name.startswith("MLP "):
        return f"L{name[4:]} MLP.in"
    layer, head, letter = name[1:].split(".")
    return f"L{layer}H{head}.{letter.lower()}"


def edge_scores(model, pairs: dict, runs: dict[str, dict]) -> tuple[dict, dict]:
    """({run: {anatomy edge name: score}}, {run: seconds}) of mask_gradient_prune_scores(logit, avg_diff,
    **options) for each named run of options, on every pair in one batch."""
    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
    from auto_circuit.utils.graph_utils import patchable_model

    dataset = PromptDataset(pairs["clean"], pairs["corrupt"], list(pairs["answers"]), list(pairs["wrongs"]))
    loader = PromptDataLoader(dataset, seq_len=None, diverge_idx=0, batch_size=len(pairs["clean"]), shuffle=False)
    patchable = patchable_model(model, factorized=True, slice_output="last_seq", separate_qkv=True,
                                device=torch.device("cpu"))
    scores, seconds = {}, {}
    for name, options in runs.items():
        for wrapper in patchable.dest_wrappers:
            wrapper.patch_mask.grad = None
        started = time.perf_counter()
        result = mask_gradient_prune_scores(patchable, loader, None, grad_function="logit", answer_function="avg_diff",
                                            **options)
        seconds[name] = time.perf_counter() - started
        scores[name] = {f"{source_name(e.src.name)} → {destination_name(e.dest.name)}":
                        float(result[e.dest.module_name][e.patch_idx]) for e in patchable.edges}
    return scores, seconds


def anatomy_order(edges, n_layers: int, n_heads: int) -> list:
    """auto-circuit's edges in anatomy's ACDC order (circuits/discovery/acdc.py, acdc_order): destinations from
    the logits back (a layer's MLP input, then its heads' v, k and q inputs, each from the last head), each
    destination's sources from the latest (a layer's MLP, then its heads from the last) to the embeddings."""
    sources = ["embed"] + [name for layer in range(n_layers)
                           for name in [f"L{layer}H{h}" for h in range(n_heads)] + [f"L{layer} MLP"]]
    destinations = [name for layer in range(n_layers)
                    for name in [f"L{layer}H{h}.{which}" for which in ("q", "k", "v") for h in range(n_heads)]
                    + [f"L{layer} MLP.in"]] + ["logits"]
    rank = {(s, d): (-destinations.index(d), -sources.index(s)) for s in sources for d in destinations}
    return sorted(edges, key=lambda e: rank[(source_name(e.src.name), destination_name(e.dest.name))])


def acdc_kept(model, pairs: dict, taus: list[tuple[int, int]], seconds: dict | None = None) -> tuple[dict, list[str]]:
    """({tau as "b x 10^e": [anatomy names of the edges kept]}, the order the edges were tested in) of
    auto-circuit's acdc_prune_scores (KL, the corrupted outputs patched in) at each tau = b * 10**e, its
    edges put in anatomy's order first (auto-circuit sorts them by destination layer, a stable sort, from
    a set whose order Python's hash seed decides)."""
    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.prune_algos.ACDC import acdc_prune_scores
    from auto_circuit.utils.graph_utils import patchable_model

    dataset = PromptDataset(pairs["clean"], pairs["corrupt"], list(pairs["answers"]), list(pairs["wrongs"]))
    loader = PromptDataLoader(dataset, seq_len=None, diverge_idx=0, batch_size=len(pairs["clean"]), shuffle=False)
    patchable = patchable_model(model, factorized=True, slice_output="last_seq", separate_qkv=True,
                                device=torch.device("cpu"))
    patchable.edges = anatomy_order(patchable.edges, model.cfg.n_layers, model.cfg.n_heads)
    order = [f"{source_name(e.src.name)} → {destination_name(e.dest.name)}"
             for e in sorted(patchable.edges, key=lambda x: x.dest.layer, reverse=True)]  # as acdc_prune_scores does
    kept = {}
    for base, exponent in taus:
        started = time.perf_counter()
        scores = acdc_prune_scores(patchable, loader, None, tao_exps=[exponent], tao_bases=[base],
                                   faithfulness_target="kl_div")
        if seconds is not None:
            seconds[f"{base}e{exponent}"] = time.perf_counter() - started
        kept[f"{base}e{exponent}"] = sorted(f"{source_name(e.src.name)} → {destination_name(e.dest.name)}"
                                            for e in patchable.edges
                                            if scores[e.dest.module_name][e.patch_idx] == float("inf"))
    return kept, order


def main(folder: str, pairs_path: str, samples: int, out: str, acdc: tuple[int, int] | None = None) -> None:
    from safetensors.torch import load_file

    torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "1")))
    pairs = load_file(pairs_path)
    scores, seconds = edge_scores(hooked_gpt2(folder), pairs, {"ig": {"integrated_grad_samples": samples}})
    reply = {"scores": scores["ig"], "seconds": seconds["ig"]}
    if acdc is not None:
        timed: dict = {}
        kept, _ = acdc_kept(hooked_gpt2(folder), pairs, [acdc], timed)
        reply["acdc"] = {"kept": next(iter(kept.values())), "seconds": next(iter(timed.values()))}
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(reply, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4],
         (int(sys.argv[5]), int(sys.argv[6])) if len(sys.argv) > 6 else None)
