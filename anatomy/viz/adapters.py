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

from ..checkpoints import Tokenizer
from ..generation import generate
from ..models import EncoderDecoderModel
from ..trace import trace, trace_points
from .data import AttentionMap, to_numpy

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
    layers: Sequence[int] | None = None,
) -> AttentionMap:
    """The AttentionMap of `{stack}blocks.{i}.{attention}` for every layer i in a Trace (batch item 0),
    or for the `layers` given only (the map's layer l is then layers[l]: one layer of a long text
    without stacking the others).

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
    missing = [i for i in (layers or []) if i not in layer_names]
    if missing:
        raise KeyError(f"the trace has no {stack}blocks.{missing[0]}.{attention}.pattern")
    layers = [layer_names[i] for i in (sorted(layer_names) if layers is None else layers)]
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
    device = next(model.parameters()).device
    ids = torch.tensor([list(ids)], device=device)  # (1, T)
    kwargs = {}
    if token_type_ids is not None and getattr(model.config, "type_vocab_size", 0):
        kwargs["token_type_ids"] = torch.tensor([list(token_type_ids)], device=device)
    recorded = traced_forward(model, ids, **kwargs)
    name = "causal self-attention" if model.config.arch == "decoder" else "self-attention"
    return [from_trace(recorded, tokens, name=name, sentence_b_start=sentence_b_start)]


def seq2seq_attention(model, src_ids: Sequence[int], src_tokens: Sequence[str],
                      tgt_ids: Sequence[int], tgt_tokens: Sequence[str]) -> list[AttentionMap]:
    """An encoder-decoder's three attentions: encoder self (S x S), decoder self (T x T), cross (T x S)."""
    device = next(model.parameters()).device
    recorded = traced_forward(model, torch.tensor([list(src_ids)], device=device),
                              torch.tensor([list(tgt_ids)], device=device))
    return [
        from_trace(recorded, src_tokens, stack="encoder.", name="encoder self-attention"),
        from_trace(recorded, tgt_tokens, stack="decoder.", name="decoder self-attention (causal)"),
        from_trace(recorded, tgt_tokens, src_tokens, stack="decoder.", attention="cross_attn", name="cross-attention"),
    ]


def tokens_of(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token as text, as anatomy shows tokens everywhere (Tokenizer.labels: "␣capital")."""
    return tokenizer.labels(ids)


def cut(ids: list[int], limit: int | None, what: str, notes: list[str] | None) -> list[int]:
    """ids cut to a stack's `limit` positions (None: unbounded). The cut is written in `notes`;
    without notes a text too long is an error, never cut silently."""
    if limit is None or len(ids) <= limit:
        return ids
    message = f"{what} has {len(ids)} tokens; the model takes {limit} positions"
    if notes is None:
        raise ValueError(f"{message}: shorten it, or pass notes=[] to cut it to the first {limit}")
    notes.append(f"{message}: the view shows the first {limit}")
    return ids[:limit]


def attention_from_model(model, tokenizer: Tokenizer, text: str, text_b: str | None = None, *,
                         notes: list[str] | None = None) -> list[AttentionMap]:
    """Tokenize, run the model once with the attention traced, and return its AttentionMaps.

    Encoder: text, or the pair text / text_b (BERT's [CLS] A [SEP] B [SEP]; B starts at the first
    type-1 token). Decoder: text only. Encoder-decoder: text is the source, text_b the target; with
    no text_b the decoder reads the model's own greedy translation (`greedy_target`), and `notes`
    says so. A text longer than the model's positions is cut and described in `notes`; without
    `notes` it raises ValueError.
    """
    arch = model.config.arch
    if isinstance(model, EncoderDecoderModel):
        src = cut(tokenizer.encode(text), model.encoder.max_positions, "the source", notes)
        if text_b is None:
            tgt = greedy_target(model, tokenizer, src)
            if notes is not None:
                translation = tokenizer.decode(tgt[1:])
                notes.append(f"target: the model's own greedy translation, {translation!r}")
        else:
            tgt = cut(tokenizer.encode_target(text_b, model.config.decoder_start_token_id),
                      model.decoder.max_positions, "the target", notes)
        return seq2seq_attention(model, src, tokens_of(tokenizer, src), tgt, tokens_of(tokenizer, tgt))
    if text_b is not None and arch != "encoder":
        raise ValueError(f"a {arch} reads one text: a sentence pair (TEXT_B) needs an encoder, a translation "
                         "target an encoder-decoder")
    if arch == "decoder":  # a prompt: the tokenizer's template, never a closing EOS
        ids = cut(tokenizer.encode_prompt(text), model.max_positions, "the text", notes)
        return attention_from_ids(model, ids, tokens_of(tokenizer, ids))
    encoding = tokenizer.backend.encode(text, text_b)  # the pair template and token types of the tokenizer
    ids = cut(encoding.ids, model.max_positions, "the text" if text_b is None else "the pair", notes)
    types = encoding.type_ids[:len(ids)]
    sequences = encoding.sequence_ids[:len(ids)]  # 0: text, 1: text_b, None: a special token
    b_start = sequences.index(1) if text_b is not None and 1 in sequences else None
    return attention_from_ids(model, ids, tokens_of(tokenizer, ids), token_type_ids=types, sentence_b_start=b_start)


def greedy_target(model, tokenizer: Tokenizer, src_ids: Sequence[int], max_new_tokens: int = 64) -> list[int]:
    """An encoder-decoder's own greedy translation of src_ids, as its decoder reads a target: the
    start token and the generated tokens, up to the end-of-sequence token (left out, as
    `Tokenizer.encode_target` leaves it out of a given text) or the decoder's positions."""
    device = next(model.parameters()).device
    room = model.decoder.max_positions - 1 if model.decoder.max_positions else max_new_tokens
    output = generate(model, src_ids=torch.tensor([list(src_ids)], device=device),
                      max_new_tokens=max(1, min(max_new_tokens, room)), strategy="greedy",
                      stop_tokens=tokenizer.eos_id)
    ids = output.sequences[0].tolist()
    if tokenizer.eos_id in ids[1:]:
        ids = ids[:ids.index(tokenizer.eos_id, 1)]
    return ids


def greedy_continuation(model, ids: Sequence[int], n_new: int, limit: int | None = None) -> list[int]:
    """ids followed by n_new tokens, each the argmax of a decoder model's next-token logits: one
    sequence whose causal attention, in one pass, is the attention of every step.

    Raises ValueError, before generating, when the result would not fit in one pass: the model's
    positions, or `limit` for a model without a position table.
    """
    limit = model.max_positions or limit
    if limit is not None and len(ids) + n_new > limit:
        room = limit - len(ids)
        raise ValueError(f"one pass of the model holds {limit} positions and the prompt has {len(ids)} tokens: "
                         + (f"at most {room} new tokens" if room >= 1 else "shorten the prompt"))
    device = next(model.parameters()).device
    return generate(model, torch.tensor([list(ids)], device=device), max_new_tokens=n_new,
                    strategy="greedy").sequences[0].tolist()
