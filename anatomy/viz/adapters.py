"""From a real forward pass to the views' data: trace the attention, keep it as AttentionMaps.

Shape letters: L layers, H heads, T query positions, S key positions, D head width.

Trace point names, per layer i (see anatomy.trace):
    blocks.i.attn.pattern               [B, H, T, S] softmax weights (encoder or decoder model)
    blocks.i.attn.q / .k                [B, H, T, D] / [B, K, S, D] (K key heads; .q_rot/.k_rot with rotary)
    encoder.blocks.i.attn.*, decoder.blocks.i.attn.*, decoder.blocks.i.cross_attn.*   (encoder-decoder)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

import anatomy
from anatomy.trace import trace, trace_points
from anatomy.viz.data import AttentionMap, to_numpy

# The points the views read: weights, and the queries and keys for the neuron view.
ATTENTION_POINT = re.compile(r"(^|\.)(attn|cross_attn)\.(pattern|q|k|q_rot|k_rot)$")


def from_trace(
    recorded,
    queries: Sequence[str],
    keys: Sequence[str] | None = None,
    *,
    stack: str = "",
    attention: str = "attn",
    name: str = "self-attention",
    sentence_b_start: int | None = None,
) -> AttentionMap:
    """The AttentionMap of `{stack}blocks.{i}.{attention}` for every layer i in a Trace (batch item 0).

    stack is "" for an encoder or decoder model, "encoder." or "decoder." for an encoder-decoder;
    attention is "attn" (self-attention) or "cross_attn". q and k are kept when the trace has them
    (after rotary where the model uses it); grouped key heads are repeated to one per query head.
    Raises KeyError when the trace holds no pattern for that stack and attention.
    """
    prefix = re.escape(f"{stack}blocks.")
    layer_names = {int(m[1]): m[0][: -len(".pattern")] for n in recorded
                   if (m := re.fullmatch(rf"{prefix}(\d+)\.{attention}\.pattern", n))}
    if not layer_names:
        raise KeyError(f"the trace has no {stack}blocks.<i>.{attention}.pattern; it holds {sorted(recorded)}")
    layers = [layer_names[i] for i in sorted(layer_names)]
    weights = torch.stack([recorded[f"{layer}.pattern"][0] for layer in layers])  # (L, H, T, S)
    q = k = None
    if all(f"{layer}.q" in recorded and f"{layer}.k" in recorded for layer in layers):
        q = torch.stack([_rotated(recorded, layer, "q")[0] for layer in layers])  # (L, H, T, D)
        k = torch.stack([_rotated(recorded, layer, "k")[0] for layer in layers])  # (L, K, S, D)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (L, H, S, D)
    return AttentionMap(
        name, to_numpy(weights), list(queries), list(queries if keys is None else keys),
        q=None if q is None else to_numpy(q), k=None if k is None else to_numpy(k),
        sentence_b_start=sentence_b_start, cross=attention == "cross_attn",
    )


def _rotated(recorded, layer: str, which: str) -> torch.Tensor:
    """q or k as they enter the dot product: after rotary (`q_rot`) when the model has it."""
    return recorded.get(f"{layer}.{which}_rot", recorded[f"{layer}.{which}"])


def traced_forward(model, *args, **kwargs):
    """Run model(*args, **kwargs) with every attention trace point recorded; return the Trace."""
    names = [name for name in trace_points(model) if ATTENTION_POINT.search(name)]
    with torch.no_grad(), trace(model, names) as recorded:
        model(*args, **kwargs)
    return recorded


def attention_from_ids(model, ids: Sequence[int], tokens: Sequence[str], *, token_type_ids=None,
                       sentence_b_start: int | None = None) -> list[AttentionMap]:
    """The self-attention of an encoder or decoder model on one sequence of ids, as one AttentionMap."""
    ids = torch.tensor([list(ids)])  # (1, T)
    kwargs = {}
    if token_type_ids is not None and getattr(model.config, "type_vocab_size", 0):
        kwargs["token_type_ids"] = torch.tensor([list(token_type_ids)])
    recorded = traced_forward(model, ids, **kwargs)
    name = "causal self-attention" if model.config.arch == "decoder" else "self-attention"
    return [from_trace(recorded, tokens, name=name, sentence_b_start=sentence_b_start)]


def seq2seq_attention(model, src_ids: Sequence[int], src_tokens: Sequence[str],
                      tgt_ids: Sequence[int], tgt_tokens: Sequence[str]) -> list[AttentionMap]:
    """An encoder-decoder's three attentions: encoder self (S x S), decoder self (T x T), cross (T x S)."""
    recorded = traced_forward(model, torch.tensor([list(src_ids)]), torch.tensor([list(tgt_ids)]))
    return [
        from_trace(recorded, src_tokens, stack="encoder.", name="encoder self-attention"),
        from_trace(recorded, tgt_tokens, stack="decoder.", name="decoder self-attention (causal)"),
        from_trace(recorded, tgt_tokens, src_tokens, stack="decoder.", attention="cross_attn", name="cross-attention"),
    ]


def encode(tokenizer, text: str, text_b: str | None = None) -> tuple[list[int], list[str], list[int]]:
    """ids, tokens and token type ids (0 for text, 1 for text_b), with the tokenizer's special tokens.

    tokenizer is a Hugging Face `tokenizers.Tokenizer`, or anything holding one as `.backend`
    (anatomy's Tokenizer), or a `transformers` tokenizer.
    """
    hf = getattr(tokenizer, "backend", tokenizer)
    if hasattr(hf, "convert_ids_to_tokens"):  # transformers
        batch = hf(text, text_b)
        ids = batch["input_ids"]
        types = batch.get("token_type_ids") or [0] * len(ids)
        return ids, hf.convert_ids_to_tokens(ids), types
    encoding = hf.encode(text, text_b, add_special_tokens=True)
    return encoding.ids, encoding.tokens, encoding.type_ids


def token_text(tokenizer, token_id: int) -> str:
    """The token string of one id, for the same tokenizers as `encode`."""
    hf = getattr(tokenizer, "backend", tokenizer)
    if hasattr(hf, "convert_ids_to_tokens"):
        return hf.convert_ids_to_tokens(token_id)
    return hf.id_to_token(token_id)


def attention_from_model(model, tokenizer, text: str, text_b: str | None = None) -> list[AttentionMap]:
    """Tokenize, run the model once with the attention traced, and return its AttentionMaps.

    Encoder or decoder: text (and text_b as a sentence pair, where B starts at the first type-1
    token). Encoder-decoder: text is the source, text_b the target (required).
    """
    if model.config.arch == "encoder-decoder":
        if text_b is None:
            raise ValueError("an encoder-decoder model needs a source text and a target text (TEXT TEXT_B)")
        src_ids, src_tokens, _ = encode(tokenizer, text)
        tgt_ids, tgt_tokens, _ = encode(tokenizer, text_b)
        return seq2seq_attention(model, src_ids, src_tokens, tgt_ids, tgt_tokens)
    ids, tokens, types = encode(tokenizer, text, text_b)
    b_start = types.index(1) if text_b is not None and 1 in types else None
    return attention_from_ids(model, ids, tokens, token_type_ids=types, sentence_b_start=b_start)


def greedy_continuation(model, ids: Sequence[int], n_new: int) -> list[int]:
    """ids followed by n_new tokens, each the argmax of a decoder model's next-token logits.

    Raises ValueError when the result would not fit the model's max_seq_len.
    """
    limit = model.config.max_seq_len
    if len(ids) + n_new > limit:
        raise ValueError(f"{len(ids)} prompt tokens + {n_new} new ones exceed the model's max_seq_len {limit}")
    return anatomy.generate(model, torch.tensor([list(ids)]), max_new_tokens=n_new, strategy="greedy").sequences[0].tolist()
