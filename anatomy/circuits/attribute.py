"""The attribution graph of one prompt: every direct effect between its nodes, in one backward sweep.

Shape letters: T positions, E d_model, F transcoder features, V vocabulary, N nodes, R rows (targets)
at one position, P = p + 1 the positions a row at position p reaches.

Ameisen et al. 2025 ("Circuit Tracing", section 2.3): in the local replacement model (replacement.py)
the residual stream is linear in what the nodes write, so the direct effect of a source s on a target t,
through every path that passes no other node (attention with its patterns frozen, the residual, a
transcoder's skip), is

    A[t, s] = a_s (w_s . J_{t <- s})          J: the gradient of t's reading at s's writing point
                                              w_s: s's output vector (a decoder row; an error; an embedding)
    t's reading = enc_t . x_in  (a feature's pre-activation), or (u_tok - mean_v u_v) . h (a logit, demeaned)

The rows are computed in one sweep down the layers (sweep.py).

The first position is left out as circuit-tracer leaves it out (its features and errors are not nodes):
what it writes, with the biases and the positional embeddings, is what no node carries, computed by the
replacement's forward pass with every node switched off. The result checks itself:

    every feature's pre-activation and every target logit = sum of its row + what no node carries
"""

from __future__ import annotations

import torch
from torch import nn

from . import checks
from .graph import Graph, Node
from .layout import Active, Layout, layout
from .replacement import Replacement, transcoder_points, unsupported
from .sweep import Sources, errors_of, sweep


def prompt_ids(model: nn.Module, prompt) -> torch.Tensor:
    """[T] ids: a text tokenized without the template's special tokens, with a BOS in front as circuit-tracer
    puts one (the first special id among bos, pad, eos) unless it starts with a special token already;
    ids as given. Raises ValueError for an empty prompt or one past the model's context."""
    tokenizer = getattr(model, "tokenizer", None)
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is empty: give a text to explain")
        if tokenizer is None:
            raise ValueError("this model has no tokenizer: give the prompt as token ids")
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        specials = [i for i in (tokenizer.bos_id, tokenizer.pad_id, tokenizer.eos_id) if i is not None]
        if not ids or ids[0] not in specials:
            if not specials:
                raise ValueError("the tokenizer has no BOS, pad or EOS token to put before the prompt")
            ids = [specials[0]] + ids
    else:
        ids = checks.token_ids(prompt)
    if len(ids) < 2:
        raise ValueError("the prompt needs at least one token after the first (the first position is no node)")
    limit = model.config.max_seq_len if model.config.pos_encoding in ("learned", "sinusoidal", "rotary") else None
    if limit is not None and len(ids) > limit:
        raise ValueError(f"the prompt has {len(ids)} tokens; this model reads at most {limit} (max_seq_len)")
    if any(not 0 <= i < model.config.vocab_size for i in ids):
        raise ValueError(f"token ids must be in [0, {model.config.vocab_size})")
    return torch.tensor(ids)


def check_fits(model: nn.Module, transcoders) -> None:
    """Raise ValueError, in one line, when the model or the transcoder set cannot make a graph together."""
    checks.model_and_transcoders(model, transcoders)
    why = unsupported(model)
    if why:
        raise ValueError(why)
    transcoders.check_fits(model)
    reads, writes = transcoder_points(model.config)
    for field, point, allowed in (("input point", transcoders.input_point(0), reads),
                                  ("output point", transcoders.output_point(0), writes)):
        inside = point.split(".", 2)[2]
        if inside not in allowed:
            raise ValueError(f"an attribution graph of this model reads transcoders at blocks.L.{{{', '.join(reads)}}} "
                             f"and writes them at blocks.L.{{{', '.join(writes)}}}; this set's {field} is {point!r}")


def active_features(rep: Replacement) -> Active:
    """Encode every layer's input; the features that fire, position 0 zeroed as circuit-tracer zeroes it."""
    layers, positions, features, values, pres = [], [], [], [], []
    for layer in range(rep.n_layers):
        pre = rep.transcoders.pre_activations(layer, rep.inputs[layer]).float()  # (T, F)
        acts = rep.transcoders.activate(layer, pre)
        acts[0] = 0
        position, feature = acts.nonzero(as_tuple=True)
        layers.append(torch.full_like(position, layer))
        positions.append(position), features.append(feature), values.append(acts[position, feature]), pres.append(pre)
    return Active(torch.cat(layers), torch.cat(positions), torch.cat(features), torch.cat(values), pres)


def logit_targets(logits: torch.Tensor, max_logits: int, probability: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, probabilities) of the most likely next tokens until their cumulative probability reaches
    `probability`, at most max_logits of them (circuit-tracer's salient logits)."""
    probs = torch.softmax(logits, dim=-1)
    top, ids = probs.topk(min(max_logits, probs.numel()))
    cutoff = int(torch.searchsorted(top.cumsum(0), torch.tensor(probability))) + 1
    return ids[:cutoff], top[:cutoff]


def build_nodes(rep: Replacement, active: Active, where: Layout, logit_ids: torch.Tensor, probs: torch.Tensor,
                labels: list[str], logit_labels: list[str]) -> list[Node]:
    """Nodes in graph order (Layout): every one named by what it is."""
    nodes = [Node("token", -1, q, int(rep.ids[q]), label=labels[q]) for q in range(where.n_tokens)]
    positions, features, values = active.position.tolist(), active.feature.tolist(), active.activation.tolist()
    for layer in range(rep.n_layers):
        chosen = range(where.active_start[layer], where.active_start[layer] + int(where.feature_offsets[layer][-1]))
        nodes += [Node("feature", layer, positions[i], features[i], value=values[i]) for i in chosen]
        nodes += [Node("error", layer, q) for q in range(where.n_tokens)]
    last = where.n_tokens - 1
    nodes += [Node("logit", rep.n_layers, last, int(i), label=text, value=float(p))
              for i, text, p in zip(logit_ids.tolist(), logit_labels, probs.tolist())]
    return nodes


def unexplained(rep: Replacement, active: Active, where: Layout, logit_ids: torch.Tensor,
                logit_vectors: torch.Tensor) -> torch.Tensor:
    """[N]: what no node carries of each target, the replacement's forward pass with every node switched off:
    positional embeddings, biases (attention's, the norms', b_dec, the encoders' b_enc), a skip's share of
    them, and everything the first position writes."""
    result = torch.zeros(where.total)

    def mlp(layer: int):
        def replaced(read: torch.Tensor) -> torch.Tensor:  # (T, E) what the transcoder reads -> its output
            chosen = (active.layer == layer).nonzero().flatten()
            if len(chosen):
                pre = rep.transcoders.pre_activations(layer, read).float()  # (T, F)
                start = where.feature_start[layer]
                result[start:start + len(chosen)] = pre[active.position[chosen], active.feature[chosen]]
            bias = rep.transcoders.output_bias(layer).detach().float()
            out = bias.expand(read.size(0), -1).clone()  # (T, E)
            skip = rep.skips[layer]
            if skip is not None:
                out += read @ skip
            # the first position's whole output, but for the part its skip passes on (a linear path, counted above)
            first = rep.outputs[layer][0] - bias
            out[0] += first if skip is None else first - rep.inputs[layer][0] @ skip
            return out
        return replaced

    x = rep.embed_rest  # (T, E)
    for layer in range(rep.n_layers):
        x = rep.block_forward(layer, x, mlp(layer))
    result[where.logit_start:] = logit_vectors @ rep.final_forward(x) + demeaned(rep.unembed_bias, logit_ids)
    return result


def logit_note(model: nn.Module) -> dict:
    """{"logits": what the logit rows explain, in words} for a model whose logits are soft-capped, else {}."""
    cap = model.lm_head.softcap
    if cap is None:
        return {}
    return {"logit_softcap": cap,
            "logits": f"the logit rows explain the logits before the final soft-cap c tanh(z / c), c = {cap:g} (the cap is "
                      f"not linear; it keeps their order); the target tokens and their probabilities are the capped logits'"}


def identity_gaps(adjacency: torch.Tensor, values: torch.Tensor, rest: torch.Tensor,
                  block: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """(|value - row sum - rest|, sum of the |terms| added up) for every target (values not NaN), a block of
    rows at a time (torch's float32 sums are cascaded: about 1e-7 of the terms, far below the check's 1e-4)."""
    differences, terms = [], []
    for start in range(0, adjacency.size(0), block):
        rows = adjacency[start:start + block]  # (b, N)
        value, other = values[start:start + block].double(), rest[start:start + block].double()
        differences.append((value - rows.sum(1).double() - other).abs())
        terms.append(rows.abs().sum(1).double() + other.abs())
    targets = ~values.isnan()
    return torch.cat(differences)[targets], torch.cat(terms)[targets]


def demeaned(bias: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor | float:
    """b[ids] - mean(b): the LM head's bias as a demeaned logit sees it (0 without a bias)."""
    return 0.0 if bias is None else bias[ids] - bias.mean()


def graph_bytes(where: Layout, d_model: int) -> int:
    """What a graph of this layout holds at its peak: the adjacency [N, N] and the rows' gradients."""
    rows_at = [int(where.feature_offsets[layer].diff().sum()) for layer in range(len(where.feature_offsets))]
    gradients = sum(rows_at) * where.n_tokens * d_model * 4 // 2 + (where.total - where.logit_start) * where.n_tokens * d_model * 4
    return where.total * where.total * 4 + gradients


def check_room(where: Layout, d_model: int, max_bytes: int | None) -> None:
    """ValueError, in words, when the graph would not fit in the memory available (or in max_bytes)."""
    from ..checkpoints.memory import available_memory

    needed = graph_bytes(where, d_model)
    room = available_memory() if max_bytes is None else min(max_bytes, available_memory())
    if needed > room:
        raise ValueError(f"this prompt makes a graph of {where.total:,} nodes ({where.total - where.n_tokens:,} features "
                         f"and errors on {where.n_tokens} positions): it needs {needed / 2**30:.1f} GiB, and "
                         f"{room / 2**30:.1f} GiB {'are' if max_bytes is None else 'is the budget'} available; a "
                         f"shorter prompt has fewer (the nodes grow with the positions, the memory with their square)")


@torch.no_grad()
def attribution_graph(model: nn.Module, prompt, transcoders, *, max_logits: int = 10, logit_probability: float = 0.95,
                      max_feature_nodes: int | None = None, batch_size: int = 512, update_interval: int = 4,
                      max_bytes: int | None = None, progress=None) -> Graph:
    """The attribution graph of `prompt` (a text, or ids) through `model` with `transcoders` (a TranscoderSet).

    Targets: the most likely next tokens until their probability reaches logit_probability (at most
    max_logits), and every active feature. max_feature_nodes keeps only that many features, chosen as
    circuit-tracer chooses them (by partial influence, in batches of batch_size, re-ranked every
    update_interval batches; prune.capped_features). progress(done, total) after each layer. The graph
    checks its identity (graph.check, graph.error). Raises ValueError, before any computation, for an
    empty prompt, one past the context, ids that are not integers, an argument out of its range (a count
    that is not a positive integer, a probability outside (0, 1]), a model the replacement cannot be built
    for, or a transcoder set that does not fit the model (CheckpointError, a ValueError, for a weight of it
    that is not finite, when its layer is first read); and, after one forward pass and before anything large is allocated, for a
    graph that needs more memory than is available (or than max_bytes)."""
    from .prune import capped_features

    for name, value in (("max_logits", max_logits), ("batch_size", batch_size), ("update_interval", update_interval)):
        checks.count(name, value)
    checks.count("max_feature_nodes", max_feature_nodes, none=True), checks.count("max_bytes", max_bytes, none=True)
    checks.number("logit_probability", logit_probability, low=0.0, high=1.0, open_low=True)
    checks.function("progress", progress)
    check_fits(model, transcoders)
    ids = prompt_ids(model, prompt)
    rep = Replacement(model, transcoders, ids)
    active = active_features(rep)
    T = len(ids)
    logit_ids, probs = logit_targets(rep.logits, max_logits, logit_probability)
    logit_vectors = rep.unembed[logit_ids] - rep.unembed.mean(dim=0)  # (k, E): demeaned, as circuit-tracer's
    where = layout(active, rep.n_layers, T, len(logit_ids))
    check_room(where, rep.embed.size(1), max_bytes)
    tokenizer = getattr(model, "tokenizer", None)
    labels = tokenizer.labels(ids.tolist()) if tokenizer else [str(i) for i in ids.tolist()]
    logit_labels = tokenizer.labels(logit_ids.tolist()) if tokenizer else [str(i) for i in logit_ids.tolist()]
    nodes = build_nodes(rep, active, where, logit_ids, probs, labels, logit_labels)

    adjacency = torch.zeros(where.total, where.total)
    sources = Sources(rep, active, where, errors_of(rep, active, T))
    sweep(rep, active, where, sources, logit_vectors, adjacency, progress)

    values = torch.full((where.total,), float("nan"))
    for layer in range(rep.n_layers):
        chosen = (active.layer == layer).nonzero().flatten()
        start = where.feature_start[layer]
        values[start:start + len(chosen)] = active.pre[layer][active.position[chosen], active.feature[chosen]]
    values[where.logit_start:] = rep.explained_logits[logit_ids] - rep.explained_logits.mean()
    rest = unexplained(rep, active, where, logit_ids, logit_vectors)
    rest[values.isnan()] = 0.0
    differences, terms = identity_gaps(adjacency, values, rest)
    error = float((differences / terms.clamp(min=1e-30)).max())
    weights = torch.zeros(where.total)
    weights[where.logit_start:] = probs
    text = prompt if isinstance(prompt, str) else (tokenizer.decode(ids.tolist()) if tokenizer else "")
    graph = Graph(
        nodes, adjacency, labels, rep.n_layers, output_weights=weights, kind="attribution graph",
        about=f"the next token after {text!r}",
        meta={"prompt": text, "prompt_ids": ids.tolist(), "model": "",
              "prompt_texts": tokenizer.token_texts(ids.tolist()) if tokenizer else labels, "transcoders": dict(getattr(transcoders, "metadata", {})),
              "cross_layer": bool(transcoders.cross_layer), "max_logits": max_logits,
              "logit_probability": logit_probability, "features_active": len(active.layer),
              **logit_note(model)},
        check=(f"every feature's pre-activation and every target logit = its edges + what no node carries: "
               f"max |diff| {float(differences.max()):.2g}, at most {error:.2g} of the terms it sums"),
        error=error, values=values, unexplained=rest,
    )
    if progress is not None:
        progress(rep.n_layers + 1, rep.n_layers + 1)
    if max_feature_nodes is not None and max_feature_nodes < len(active.layer):
        keep = capped_features(graph, max_feature_nodes, batch_size, update_interval)
        graph = graph.subgraph(keep, meta=dict(graph.meta, max_feature_nodes=max_feature_nodes))
    return graph
