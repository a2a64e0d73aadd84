"""The compare panel: two runs side by side, two models on one text (a Q4 GGUF against the same weights in
float32, a base model against its fine-tune) or one model on two texts.

Shape letters: E model width.
"""

from __future__ import annotations

import torch
from torch import nn

from ..analysis.lens import stack_prefix
from ..generation import generate
from .models import ModelSlot
from .panels import default_position, distribution, kl_divergence, layer_count
from .state import Pass
from .values import int_setting


def greedy_text(model: nn.Module, p: Pass, n: int) -> list[int]:
    """The next n tokens greedy decoding writes after a decoder's text, up to its end-of-sequence
    token (as `anatomy generate` stops); [] for an encoder or an encoder-decoder."""
    if p.source_ids is not None or model.config.arch != "decoder":
        return []
    stops = [i for i in (model.config.eos_token_id, model.tokenizer.eos_id) if i is not None]
    out = generate(model, torch.tensor([p.ids]), max_new_tokens=n, strategy="greedy", stop_tokens=stops or None)
    return out.new_tokens[0][out.padding_mask[0, out.prompt_length:]].tolist()


def compare(a_slot: ModelSlot, a: Pass, b_slot: ModelSlot, b: Pass, settings: dict) -> dict:
    """Two runs side by side (two models on one text, or one model on two texts): their next-token
    distributions, the residual stream's divergence layer by layer at the last position (when
    both have the same width and layers), and the first new token where greedy outputs differ."""
    n_new = int_setting(settings, "new_tokens", 12, 1, 64)
    sides = []
    for slot, p in ((a_slot, a), (b_slot, b)):
        model = slot.get()
        position = default_position(model, p)
        sides.append({"model": slot.name, "text": p.text, "tokens": p.tokens,
                      "distribution": None if position is None else distribution(model, p, position, {}),
                      "greedy": greedy_text(model, p, n_new)})
    model_a, model_b = a_slot.get(), b_slot.get()
    for side, model in zip(sides, (model_a, model_b)):
        side["greedy_tokens"] = model.tokenizer.labels(side["greedy"])
    divergence = None
    prefix_a, prefix_b = stack_prefix(model_a), stack_prefix(model_b)
    if model_a.config.d_model == model_b.config.d_model and layer_count(model_a) == layer_count(model_b):
        rows = []
        for layer in range(layer_count(model_a)):
            x = a.trace[f"{prefix_a}blocks.{layer}.resid_post"][0, -1].double()
            y = b.trace[f"{prefix_b}blocks.{layer}.resid_post"][0, -1].double()
            rows.append({"layer": layer, "relative": float((x - y).norm() / x.norm().clamp_min(1e-30)),
                         "cosine": float(torch.nn.functional.cosine_similarity(x, y, dim=0))})
        divergence = rows
    same_vocab = model_a.tokenizer.vocab_size == model_b.tokenizer.vocab_size
    first = None
    if sides[0]["greedy"] and sides[1]["greedy"]:  # an encoder or an encoder-decoder writes none here
        first = next((i for i, (x, y) in enumerate(zip(sides[0]["greedy"], sides[1]["greedy"])) if x != y), None)
        if first is None and len(sides[0]["greedy"]) != len(sides[1]["greedy"]):
            first = min(len(sides[0]["greedy"]), len(sides[1]["greedy"]))
    kl = None
    if same_vocab and sides[0]["distribution"] and sides[1]["distribution"]:
        kl = kl_divergence(a.logits[default_position(model_a, a)], b.logits[default_position(model_b, b)])
    return {"sides": sides, "divergence": divergence, "first_difference": first, "kl": kl, "same_vocab": same_vocab,
            "greedy_compared": bool(sides[0]["greedy"] and sides[1]["greedy"])}


__all__ = ["compare", "greedy_text"]
