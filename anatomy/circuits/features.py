"""What a graph's feature nodes mean: the tokens they promote, and where they fire hardest on a corpus.

Shape letters: F the graph's features, E d_model, V vocabulary, C contexts, T tokens per context, W the
window shown around a context's strongest token.

For each feature node of a graph (anatomy sae features' numbers, for the few features a graph shows):

    promoted, suppressed   the tokens whose logits its decoder direction raises and lowers most,
                           W_U (g * sum_j d_j), g the final norm's gain (a cross-layer feature's rows to
                           every layer it writes summed), the norm's scale left out
    contexts               its strongest contexts on a corpus: one pass over it records every layer's
                           transcoder input at once (sae.store.harvest), each feature's activation is read
                           from it, and the window around its strongest token is kept (sae.features' sizes)
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..sae.features import AFTER, BEFORE, direct_logits
from ..sae.store import harvest
from .graph import Graph
from .page import FeatureDetails
from .replacement import norm_parts


def feature_nodes(graph: Graph) -> list[int]:
    """The indices of the graph's feature nodes."""
    return [i for i, node in enumerate(graph.nodes) if node.kind == "feature"]


@torch.no_grad()
def promoted_tokens(model: nn.Module, transcoders, graph: Graph, k: int = 6) -> FeatureDetails:
    """Each feature node's k most promoted and suppressed tokens, with their direct logits."""
    details = FeatureDetails()
    chosen = feature_nodes(graph)
    if not chosen:
        return details
    gain = norm_parts(model.final_norm)[0] if getattr(model, "final_norm", None) is not None else 1.0
    device = model.lm_head.proj.weight.device
    directions = torch.stack([transcoders.decoder_vectors(graph.nodes[i].layer)[graph.nodes[i].index].detach().float().sum(0)
                              for i in chosen]).to(device) * gain  # (F, E)
    up, up_logits, down, down_logits = direct_logits(model, directions, k)
    texts = model.tokenizer.token_texts
    for row, i in enumerate(chosen):
        node_id = graph.nodes[i].id
        details.promoted[node_id] = list(zip(texts(up[row].tolist()), up_logits[row].tolist()))
        details.suppressed[node_id] = list(zip(texts(down[row].tolist()), down_logits[row].tolist()))
    return details


@torch.no_grad()
def top_contexts(model: nn.Module, transcoders, graph: Graph, tokens: np.ndarray, details: FeatureDetails, *,
                 context: int = 64, top: int = 4, batch: int = 8, skip: int = 1, progress=None) -> FeatureDetails:
    """Add to `details` each feature node's `top` strongest contexts in `tokens` (consecutive contexts of
    `context` tokens; the first `skip` positions of each left out, as the SAE pages leave them).
    progress(done, total) after each batch of contexts. Raises ValueError when the text makes no context."""
    chosen = feature_nodes(graph)
    n_contexts = len(tokens) // context
    if n_contexts == 0:
        raise ValueError(f"{len(tokens)} tokens make no context of {context}: give more text")
    if not chosen:
        return details
    layers = sorted({graph.nodes[i].layer for i in chosen})
    points = [transcoders.input_point(layer) for layer in layers]
    width = BEFORE + 1 + AFTER
    cpu, device = torch.device("cpu"), next(model.parameters()).device  # the model runs there; the tables stay here
    offsets = torch.arange(-BEFORE, AFTER + 1, device=cpu)  # (W,)
    best = torch.full((len(chosen), top), -1.0, device=cpu)  # (F, top): the strongest activations so far
    windows = torch.full((len(chosen), top, width), -1, dtype=torch.long, device=cpu)  # (F, top, W) token ids (-1: outside)
    window_acts = torch.zeros(len(chosen), top, width, device=cpu)  # (F, top, W)
    for start in range(0, n_contexts, batch):
        stop = min(n_contexts, start + batch)
        ids = torch.from_numpy(np.asarray(tokens[start * context:stop * context], dtype=np.int64).reshape(-1, context))
        values = harvest(model, ids.to(device), points)  # each layer's input: (n, T, E)
        features = {layer: transcoders.encode(layer, x) for layer, x in zip(layers, values)}  # (n, T, d_transcoder)
        for row, i in enumerate(chosen):
            node = graph.nodes[i]
            acts = features[node.layer][..., node.index].to(cpu, torch.float32, copy=True)  # (n, T)
            acts[:, :skip] = 0
            peak, position = acts.max(dim=1)  # (n,): each context's strongest token for this feature
            around = position[:, None] + offsets  # (n, W)
            inside = (around >= 0) & (around < context)
            around = around.clamp(0, context - 1)
            contexts = torch.arange(len(ids), device=cpu)[:, None].expand_as(around)
            merged = torch.cat([best[row], peak])
            merged_windows = torch.cat([windows[row], torch.where(inside, ids[contexts, around], -1)])
            merged_acts = torch.cat([window_acts[row], torch.where(inside, acts[contexts, around], 0.0)])
            order = merged.topk(top).indices
            best[row], windows[row], window_acts[row] = merged[order], merged_windows[order], merged_acts[order]
        if progress is not None:
            progress(stop, n_contexts)
    texts = model.tokenizer.token_texts
    for row, i in enumerate(chosen):
        shown = []
        for k in range(top):
            if best[row, k] <= 0:
                continue
            inside = windows[row, k] >= 0
            shown.append({"tokens": texts(windows[row, k][inside].tolist()), "acts": window_acts[row, k][inside].tolist()})
        details.contexts[graph.nodes[i].id] = shown
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
