"""The four attention views, each one self-contained HTML file.

Shape letters: L layers, H heads, T query positions, S key positions, D head width.

Each function takes what bertviz takes (weights [L, H, T, S] or one [1, H, T, S] tensor per layer,
plus tokens) or `AttentionMap`s, and returns a `View`: shown inline in Jupyter, written with
`.save("attention.html")`.
"""

from __future__ import annotations

from collections.abc import Sequence

from .data import AttentionMap, as_maps
from ..checkpoints.token_text import legend_for
from .html import View, map_payload, render


def head_view(
    attention,
    tokens: Sequence[str] | None = None,
    sentence_b_start: int | None = None,
    *,
    layer: int = 0,
    heads: Sequence[int] | None = None,
    title: str = "Attention heads",
) -> View:
    """Lines from each query token to the key tokens it attends to, one colour per head.

    Several maps (an encoder-decoder's encoder, decoder and cross-attention) get a selector;
    a map with `sentence_b_start` gets the sentence filter A→A, B→B, A→B, B→A.
    """
    maps = as_maps(attention, tokens, sentence_b_start)
    maps[0].check_layer_head(layer)
    heads = list(range(maps[0].n_heads)) if heads is None else list(heads)
    for head in heads:
        maps[0].check_layer_head(layer, head)
    initial = {"map": 0, "layer": layer, "heads": heads}
    return _view("head", title, maps, initial)


def model_view(
    attention,
    tokens: Sequence[str] | None = None,
    sentence_b_start: int | None = None,
    *,
    layer: int = 0,
    head: int = 0,
    title: str = "Attention in every layer and head",
) -> View:
    """Every layer x head as a small heatmap; the one clicked (first: layer, head) opens large."""
    maps = as_maps(attention, tokens, sentence_b_start)
    maps[0].check_layer_head(layer, head)
    return _view("model", title, maps, {"map": 0, "layer": layer, "head": head})


def neuron_view(
    attention: AttentionMap | Sequence[AttentionMap],
    *,
    layer: int = 0,
    head: int = 0,
    query: int = 0,
    title: str = "Inside one attention head",
) -> View:
    """For one query token: q, every key's k, q∘k, the scores q·k/√D and the softmax weights.

    The maps must carry q and k (AttentionMap(..., q=, k=)); the adapters fill them from the trace.
    """
    maps = [m for m in as_maps(attention) if m.has_vectors]
    if not maps:
        raise ValueError("the neuron view needs query and key vectors: build the AttentionMap with q= and k=")
    maps[0].check_layer_head(layer, head)
    if not 0 <= query < len(maps[0].queries):
        raise IndexError(f"query {query} is out of range: {maps[0].name} has query positions 0..{len(maps[0].queries) - 1}")
    return _view("neuron", title, maps, {"map": 0, "layer": layer, "head": head, "query": query}, vectors=True)


def generation_view(
    attention,
    tokens: Sequence[str] | None = None,
    prompt_length: int = 1,
    *,
    layer: int = 0,
    title: str = "Attention while generating",
) -> View:
    """Step through generation: what each new token's prediction attended to.

    attention is the causal self-attention of the whole generated sequence, [L, H, T, T]; with a
    causal mask, row t - 1 of one full pass equals the attention that produced token t, step by step.
    Tokens 0..prompt_length-1 are the prompt, the rest were generated.
    """
    maps = as_maps(attention, tokens)
    attention = maps[0]
    attention.check_layer_head(layer)
    n_tokens = len(attention.queries)
    if not 1 <= prompt_length < n_tokens:
        raise ValueError(f"prompt_length must be in 1..{n_tokens - 1} (there are {n_tokens} tokens), got {prompt_length}")
    initial = {"map": 0, "layer": layer, "promptLength": prompt_length}
    return _view("generation", title, [attention], initial)


def subtitle(maps: list[AttentionMap]) -> str:
    """Counts per side: an encoder-decoder's source and target lengths (read off its cross-attention,
    [T, S]) and each stack's layers and heads; else one sequence's tokens, layers and heads."""
    cross = next((m for m in maps if m.cross), None)
    if cross is None:
        first = maps[0]
        sizes = f"{len(first.queries)} tokens · {first.n_layers} layers · {first.n_heads} heads"
    else:
        encoder = next((m for m in maps if not m.cross and m.keys == cross.keys), None)
        sides = [("encoder", len(cross.keys), encoder), ("decoder", len(cross.queries), cross)]
        sizes = " · ".join(
            f"{side}: {n} tokens" + (f", {m.n_layers} layers, {m.n_heads} heads" if m is not None else "")
            for side, n, m in sides)
    return sizes + (f" · {len(maps)} attention maps" if len(maps) > 1 else "")


def _view(view: str, title: str, maps: list[AttentionMap], initial: dict, vectors: bool = False) -> View:
    payload = {"view": view, "initial": initial, "maps": [map_payload(m, vectors) for m in maps],
               "tokenLegend": legend_for(t for m in maps for t in (*m.queries, *m.keys))}
    rows = max(max(len(m.queries), len(m.keys)) for m in maps)
    height = min(900, 260 + 20 * rows) if view == "head" else 760
    return View(view, render(view, title, subtitle(maps), payload), height=height)
