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

The rows are computed by sweeps down the layers (sweep.py): every row for the whole graph, or, with
max_feature_nodes, the logits' and the features' that circuit-tracer's ranking chooses (capped.py), so that a
cap bounds the work and the memory (footprint.py says how much, before anything large is allocated).

The first position is left out as circuit-tracer leaves it out (its features and errors are not nodes):
what it writes, with the biases and the positional embeddings, is what no node carries, computed by the
replacement's forward pass with every node switched off. The result checks itself:

    every feature's pre-activation and every target logit = sum of its row + what no node carries

and a capped graph's rows add the edges of the features it dropped (identity.py).
"""

from __future__ import annotations

import torch
from torch import nn

from . import checks
from .capped import assemble, capped_rows, feature_nodes, kept_layout, partial_influence
from .footprint import Plan, check_room, lazy_zeros, resident_bytes
from .graph import Graph, Node
from .identity import capped_check, unexplained, whole_check
from .layout import Active, Layout, layout
from .replacement import Replacement, transcoder_points, unsupported
from .rows import RowStore
from .sweep import Rows, Sources, buckets, feature_rows, sweep, width
from .vectors import errors_of, read_features


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
    return torch.tensor(ids, device="cpu")


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


def logit_note(model: nn.Module) -> dict:
    """{"logits": what the logit rows explain, in words} for a model whose logits are soft-capped, else {}."""
    cap = model.lm_head.softcap
    if cap is None:
        return {}
    return {"logit_softcap": cap,
            "logits": f"the logit rows explain the logits before the final soft-cap c tanh(z / c), c = {cap:g} (the cap is "
                      f"not linear; it keeps their order); the target tokens and their probabilities are the capped logits'"}


def logit_targets(logits: torch.Tensor, max_logits: int, probability: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, probabilities) of the most likely next tokens until their cumulative probability reaches
    `probability`, at most max_logits of them (circuit-tracer's salient logits)."""
    probs = torch.softmax(logits, dim=-1)
    top, ids = probs.topk(min(max_logits, probs.numel()))
    cutoff = int(torch.searchsorted(top.cumsum(0), torch.tensor(probability, device=top.device))) + 1
    return ids[:cutoff], top[:cutoff]


def build_nodes(ids: torch.Tensor, n_layers: int, active: Active, where: Layout, logit_ids: torch.Tensor,
                probs: torch.Tensor, labels: list[str], logit_labels: list[str]) -> list[Node]:
    """Nodes in graph order (Layout): every one named by what it is."""
    nodes = [Node("token", -1, q, int(ids[q]), label=labels[q]) for q in range(where.n_tokens)]
    positions, features, values = active.position.tolist(), active.feature.tolist(), active.activation.tolist()
    for layer in range(n_layers):
        start, stop = active.span(layer)
        nodes += [Node("feature", layer, positions[i], features[i], value=values[i]) for i in range(start, stop)]
        nodes += [Node("error", layer, q) for q in range(where.n_tokens)]
    last = where.n_tokens - 1
    nodes += [Node("logit", n_layers, last, int(i), label=text, value=float(p))
              for i, text, p in zip(logit_ids.tolist(), logit_labels, probs.tolist())]
    return nodes


def whole_adjacency(rep: Replacement, sources: Sources, active: Active, where: Layout, logit_rows: Rows,
                    progress=None) -> torch.Tensor:
    """[N, N]: every row of the graph (the logits' and every feature's), each position's rows swept together."""
    rows = feature_rows(active, sources.vectors, torch.arange(len(active.layer), device=rep.device))
    rows = Rows(torch.cat([logit_rows.layer, rows.layer]), torch.cat([logit_rows.position, rows.position]),
                torch.cat([logit_rows.reading, rows.reading]))
    nodes = torch.cat([torch.arange(where.logit_start, where.total, device=rep.device), feature_nodes(active, where)])
    adjacency = lazy_zeros(where.total, where.total, rep.device)
    for bucket in buckets(rows.position, rows.layer, rep.embed.size(1), row_bytes=4 * where.total):
        part = rows[bucket]
        out = lazy_zeros(len(part), width(where, part, rep.n_layers), rep.device)
        sweep(rep, sources, part, out)
        adjacency[nodes[bucket], :out.size(1)] = out
        if progress is not None:
            progress(len(part))
    return adjacency


@torch.no_grad()
def attribution_graph(model: nn.Module, prompt, transcoders, *, max_logits: int = 10, logit_probability: float = 0.95,
                      max_feature_nodes: int | None = None, batch_size: int = 512, update_interval: int = 4,
                      max_bytes: int | None = None, attention_products: str = "float32", progress=None) -> Graph:
    """The attribution graph of `prompt` (a text, or ids) through `model` with `transcoders` (a TranscoderSet).

    Targets: the most likely next tokens until their probability reaches logit_probability (at most
    max_logits), and every active feature; or, with max_feature_nodes, only that many features, chosen as
    circuit-tracer chooses them (by partial influence, in batches of batch_size, re-ranked every
    update_interval batches; capped.py), and only their rows computed. progress(done, total): rows. The graph
    checks its identity (graph.check, graph.error; a capped graph's names what its dropped features carry).
    max_bytes: what the graph itself may take in memory (beyond what the process held when called: the model
    and the transcoders; its frozen forward pass counted in), said in graph.meta["memory"]; a capped graph
    keeps the rows past it in a temporary file (footprint.py). attention_products: "float32", or "bfloat16" for
    the products that carry rows back through attention (frozen.FrozenSublayer: those products about 3x as fast on
    CPUs with bfloat16 instructions, SmolLM2's 256- and 1,024-token graphs 15% and 12% faster; each attention's
    share of a row within about 0.5%; the check says what it costs), in
    graph.meta["attention_products"]. Raises ValueError, before any computation, for
    an empty prompt, one past the context, ids that are not integers, an argument out of its range (a count
    that is not a positive integer, a probability outside (0, 1]), a model the replacement cannot be built
    for, or a transcoder set that does not fit the model (CheckpointError, a ValueError, for a weight of it
    that is not finite, when its layer is first read); and, after one forward pass and before anything large
    is allocated, for a graph that needs more memory than is available (or than max_bytes)."""
    for name, value in (("max_logits", max_logits), ("batch_size", batch_size), ("update_interval", update_interval)):
        checks.count(name, value)
    checks.count("max_feature_nodes", max_feature_nodes, none=True), checks.count("max_bytes", max_bytes, none=True)
    checks.number("logit_probability", logit_probability, low=0.0, high=1.0, open_low=True)
    checks.function("progress", progress)
    checks.choice("attention_products", attention_products, checks.ATTENTION_PRODUCTS)
    check_fits(model, transcoders)
    ids = prompt_ids(model, prompt)
    resident = resident_bytes()
    rep = Replacement(model, transcoders, ids, attention_products=getattr(torch, attention_products))
    active, vectors = read_features(rep)
    T, L = len(ids), rep.n_layers
    logit_ids, probs = logit_targets(rep.logits, max_logits, logit_probability)
    where = layout(active, L, T, len(logit_ids))
    capped = max_feature_nodes is not None and max_feature_nodes < len(active.layer)
    needs = check_room(where, rep.embed.size(1), max_feature_nodes if capped else None, batch_size * update_interval,
                       max_bytes, rep.device, spent=resident_bytes() - resident)  # a ranking's batches are swept together
    logit_vectors = rep.logit_vectors(logit_ids)  # (k, E'): as the LM head's matrix reads them
    logit_rows = Rows(torch.full_like(logit_ids, L), torch.full_like(logit_ids, T - 1), rep.logit_transpose(logit_vectors))
    sources = Sources(rep, active, where, vectors, errors_of(rep, active, vectors), keep_bytes=needs.sources)
    feature_rest, logit_rest = unexplained(rep, active, logit_ids, logit_vectors)
    done, total = 0, len(logit_ids) + (max_feature_nodes if capped else len(active.layer))

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    # every target's value and what no node carries of it, by node of the whole graph
    values = torch.full((where.total,), float("nan"), device=rep.device)
    rest = torch.zeros(where.total, device=rep.device)
    nodes = feature_nodes(active, where)
    values[nodes], rest[nodes] = active.pre_activation, feature_rest
    values[where.logit_start:] = rep.explained_logits[logit_ids.to(rep.device)] - rep.explained_logits.mean()
    rest[where.logit_start:] = logit_rest
    if capped:
        store = RowStore(needs.rows_in_memory)
        try:
            rows = capped_rows(rep, sources, active, where, logit_rows, probs, max_feature_nodes, batch_size,
                               update_interval, store, advance)
            influence = partial_influence(store, rows.row_nodes, rows.weights, where.total)
            # the rows are made: the frozen pass and the sources (a long prompt's gigabytes) give their memory to the
            # assembly's matrix
            del sources, vectors, rep
            active_kept, where_kept = kept_layout(active, rows.chosen, L, T, len(logit_ids))
            adjacency, targets = assemble(rows, active, where, where_kept)
            check, error, values, rest, dropped = capped_check(adjacency, targets, values[rows.row_nodes], rest[rows.row_nodes],
                                                      store.total(), store.absolute_total(), influence[nodes],
                                                      rows.chosen, influence)
            file_bytes = store.file_bytes
        finally:
            store.close()
        active, where = active_kept, where_kept
    else:
        adjacency = whole_adjacency(rep, sources, active, where, logit_rows, advance)
        check, error = whole_check(adjacency, values, rest)
        file_bytes, dropped = 0, {}
    return finish(ids, L, model, prompt, transcoders, active, where, logit_ids, probs, adjacency, values, rest,
                  check + checks.products_note(attention_products), error, needs, file_bytes, max_logits=max_logits,
                  logit_probability=logit_probability, features_active=len(nodes), attention_products=attention_products,
                  **({"max_feature_nodes": max_feature_nodes} if capped else {}), **dropped, **logit_note(model))


def finish(ids: torch.Tensor, n_layers: int, model: nn.Module, prompt, transcoders, active: Active, where: Layout,
           logit_ids: torch.Tensor, probs: torch.Tensor, adjacency: torch.Tensor, values: torch.Tensor, rest: torch.Tensor,
           check: str, error: float, needs: Plan, file_bytes: int, **meta) -> Graph:
    """The Graph of the prompt `ids` through n_layers, on the CPU (a graph is data; it was computed where the model
    is): its nodes named, its labels, what it explains, and what it took."""
    ids = ids.cpu()
    tokenizer = getattr(model, "tokenizer", None)
    labels = tokenizer.labels(ids.tolist()) if tokenizer else [str(i) for i in ids.tolist()]
    logit_labels = tokenizer.labels(logit_ids.tolist()) if tokenizer else [str(i) for i in logit_ids.tolist()]
    nodes = build_nodes(ids, n_layers, active, where, logit_ids, probs, labels, logit_labels)
    cpu = torch.device("cpu")
    adjacency, values, rest = adjacency.to(cpu), values.to(cpu), rest.to(cpu)
    weights = torch.zeros(where.total, device=cpu)
    weights[where.logit_start:] = probs.to(cpu)
    text = prompt if isinstance(prompt, str) else (tokenizer.decode(ids.tolist()) if tokenizer else "")
    return Graph(
        nodes, adjacency, labels, n_layers, output_weights=weights, kind="attribution graph",
        about=f"the next token after {text!r}",
        meta={"prompt": text, "prompt_ids": ids.tolist(), "model": "",
              "prompt_texts": tokenizer.token_texts(ids.tolist()) if tokenizer else labels,
              "transcoders": dict(getattr(transcoders, "metadata", {})), "cross_layer": bool(transcoders.cross_layer),
              "memory": needs.describe(), "rows_on_file_bytes": file_bytes, **meta},
        check=check, error=error, values=values, unexplained=rest,
    )
