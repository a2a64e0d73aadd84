"""What a graph's feature nodes mean: the tokens they promote, where they fire hardest on a corpus, a label.

Shape letters: F the graph's features, E d_model, n contexts in a batch, T tokens per context.

For each feature node of a graph (the sae floor's numbers, for the few features a graph shows):

    promoted, suppressed   the tokens whose logits its decoder direction raises and lowers most,
                           W_U (g * sum_j d_j) centred over the vocabulary (sae.features.direct_logits), g the
                           final norm's gain, a cross-layer feature's rows to every layer it writes summed
    contexts               its strongest contexts on a corpus (sae.contexts.TopContexts): one pass per batch
                           records every layer's transcoder input at once (sae.store.harvest), within a
                           budget of tokens and of seconds, stated on the page
    label                  a short automatic label (feature_label): the tokens it fires on -> the token it
                           promotes most, marked "auto:" until a reader edits it on the page

Every token is shown as everywhere in anatomy (tokenizer.labels: "␣capital", "↵", control characters
escaped).
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import torch
from torch import nn

from ..sae.contexts import BEFORE, TopContexts, context_batches
from ..sae.features import direct_logits, final_norm_gain
from ..sae.store import harvest
from .graph import Graph
from .page import FeatureDetails


def feature_nodes(graph: Graph) -> list[int]:
    """The indices of the graph's feature nodes."""
    return [i for i, node in enumerate(graph.nodes) if node.kind == "feature"]


@torch.no_grad()
def promoted_tokens(model: nn.Module, transcoders, graph: Graph, k: int = 6) -> FeatureDetails:
    """Each feature node's k most promoted and suppressed tokens, with their direct logits (centred), and
    a label from them (feature_label)."""
    details = FeatureDetails()
    chosen = feature_nodes(graph)
    if not chosen:
        return details
    device = model.lm_head.proj.weight.device
    directions = torch.stack([transcoders.decoder_vectors(graph.nodes[i].layer)[graph.nodes[i].index].detach().float().sum(0)
                              for i in chosen]).to(device) * final_norm_gain(model)  # (F, E)
    up, up_logits, down, down_logits = direct_logits(model, directions, k)
    labels = model.tokenizer.labels
    for row, i in enumerate(chosen):
        node_id = graph.nodes[i].id
        details.promoted[node_id] = list(zip(labels(up[row].tolist()), up_logits[row].tolist()))
        details.suppressed[node_id] = list(zip(labels(down[row].tolist()), down_logits[row].tolist()))
        details.labels[node_id] = feature_label([], details.promoted[node_id])
    return details


@torch.no_grad()
def top_contexts(model: nn.Module, transcoders, graph: Graph, tokens: np.ndarray, details: FeatureDetails, *,
                 context: int = 64, top: int = 4, batch: int = 8, skip: int = 1, seconds: float | None = None,
                 progress=None) -> FeatureDetails:
    """Add to `details` each feature node's `top` strongest contexts in `tokens` (consecutive contexts of
    `context` tokens; the first `skip` positions of each left out, as the SAE pages leave them), and its
    label again, now from them. seconds: stop after the batch that spends this budget (details.scanned says
    how many tokens were read). progress(done, total) after each batch of contexts. Raises ValueError when
    the text makes no context."""
    chosen = feature_nodes(graph)
    batches = context_batches(tokens, context, batch)  # refuses a text too short for one context, before any work
    if not chosen:
        return details
    layers = sorted({graph.nodes[i].layer for i in chosen})
    points = [transcoders.input_point(layer) for layer in layers]
    # the chosen features' columns, layer by layer, in the order of `chosen`
    by_layer = {layer: [row for row, i in enumerate(chosen) if graph.nodes[i].layer == layer] for layer in layers}
    order = torch.tensor([row for layer in layers for row in by_layer[layer]], device="cpu").argsort()  # (F,)
    found = TopContexts(len(chosen), top)
    started, scanned = time.perf_counter(), 0
    device = next(model.parameters()).device  # the model runs there; the tables stay on the CPU
    for done, total, ids in batches:
        values = harvest(model, ids.to(device), points)  # each layer's input: (n, T, E)
        acts = torch.cat([transcoders.encode(layer, x)[..., [graph.nodes[chosen[row]].index for row in by_layer[layer]]]
                          for layer, x in zip(layers, values)], dim=-1)[..., order.to(device)]  # (n, T, F)
        acts = acts.to("cpu", torch.float32)
        acts[:, :skip] = 0
        found.add(ids, acts)
        scanned += ids.numel()
        if progress is not None:
            progress(done, total)
        if seconds is not None and time.perf_counter() - started >= seconds:
            break
    used = torch.unique(found.windows[found.windows >= 0]).tolist()
    text_of = dict(zip(used, model.tokenizer.labels(used)))  # each token shown once, not once per window
    values, windows, acts = found.values.tolist(), found.windows.tolist(), found.window_acts.tolist()
    for row, i in enumerate(chosen):
        shown = []
        for k, value in enumerate(values[row]):
            if value <= 0:
                continue
            inside = [w for w, token in enumerate(windows[row][k]) if token >= 0]
            shown.append({"tokens": [text_of[windows[row][k][w]] for w in inside], "acts": [acts[row][k][w] for w in inside],
                          "peak": BEFORE - sum(1 for w in range(BEFORE) if windows[row][k][w] < 0)})
        node_id = graph.nodes[i].id
        details.contexts[node_id] = shown
        details.labels[node_id] = feature_label(shown, details.promoted.get(node_id, []))
    details.scanned, details.seconds = scanned, seconds
    return details


def context_tokens(paths, tokenizer, max_tokens: int) -> np.ndarray:
    """[at most max_tokens] ids of the UTF-8 files `paths`, in order: each read a few kilobytes at a time
    (anatomy.text.text_pieces) and tokenized piece by piece until max_tokens are had, so that a corpus of
    gigabytes costs what its first max_tokens cost. InputError naming a file that is not UTF-8."""
    from ..text import text_pieces
    from . import checks

    checks.count("max_tokens", max_tokens)
    ids: list[int] = []
    for path in paths:
        for piece in text_pieces(path):
            ids += tokenizer.encode(piece, add_special_tokens=False)
            if len(ids) >= max_tokens:
                return np.asarray(ids[:max_tokens], dtype=np.int64)
    return np.asarray(ids, dtype=np.int64)


def feature_label(contexts: list[dict], promoted: list[tuple[str, float]]) -> str:
    """A short label, a heuristic that says so: "auto: " + the tokens a feature fires on (the peak token of
    its top contexts, the most frequent first, at most two) + " → " + the token it promotes most, e.g.
    'auto: ␣Dallas, ␣Texas → ␣Austin' ('auto: → ␣Austin' without contexts); "" with nothing to say."""
    peaks = Counter(context["tokens"][context["peak"]] for context in contexts)
    fires_on = ", ".join(token for token, _ in peaks.most_common(2))
    promotes = promoted[0][0] if promoted and promoted[0][1] > 0 else ""
    if not fires_on and not promotes:
        return ""
    return " ".join(part for part in ("auto:", fires_on, "→", promotes) if part)
