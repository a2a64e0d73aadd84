"""Testing a graph on the model: ablate, clamp or steer features in the real model, and set what it does beside
what the graph predicts.

Shape letters: T positions, E d_model, F transcoder features, V vocabulary, N graph nodes.

A change sets a feature's activation (ablate: 0; clamp: a value) or adds to it (steer), at one position or at
every one. The model runs as it is, its real MLPs included; where a changed feature's layer writes, the
change's decoder vectors are added (circuit-tracer's `feature_intervention`):

    y_l  <-  y_l + sum over changes c that write to l of  delta_c W_dec[c, l]       delta_c = new - current

and `freeze` says what else is held at the prompt's values:

    "none"        nothing: the change spreads through attention, norms and later features
    "attention"   the attention patterns (circuit-tracer's default)
    "all"         patterns, norm scales and every MLP's output but the change (and a skip, which stays
                  linear): the local replacement model itself, so only direct effects remain

The graph predicts the change of each target logit (demeaned, as its rows are) from its edges, A[t, s] per
unit of s's activation being A[t, s] / a_s:

    direct        sum_c A[t, c] / a_c delta_c                          (exact when freeze="all")
    through it    the same after the change has flowed through the graph's features, each active one
                  passing on its input change (slope 1 above its threshold)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..trace import trace
from ..checkpoints.files import shorten
from . import checks
from .attribute import check_fits, prompt_ids
from .graph import Graph
from .frozen import norms_frozen
from .replacement import Replacement

FREEZES = ("none", "attention", "all")


@dataclass(frozen=True)
class FeatureChange:
    """Feature `feature` of layer `layer` at `position` (None: every position but the first): set to `value`
    (0 ablates it; any other value clamps it), or with `add` added to it (steering). One of the two."""

    layer: int
    feature: int
    position: int | None = None
    value: float | None = None
    add: float | None = None

    def __post_init__(self) -> None:
        if (self.value is None) == (self.add is None):
            raise ValueError("a feature change sets a value (ablate: 0, clamp) or adds one (steer): give one of the two")
        checks.count("a feature change's layer", self.layer, minimum=0)
        checks.count("a feature change's feature", self.feature, minimum=0)
        checks.count("a feature change's position", self.position, minimum=0, none=True)
        for name in ("value", "add"):
            checks.number(f"a feature change's {name}", getattr(self, name), low=-checks.MAX_CHANGE,
                          high=checks.MAX_CHANGE, none=True)

    def __str__(self) -> str:
        """'L3 #12 @4 = 0' (ablated there), 'L3 #12 += 2.5' (steered at every position)."""
        where = f"L{self.layer} #{self.feature}" + ("" if self.position is None else f" @{self.position}")
        return f"{where} += {self.add:g}" if self.add is not None else f"{where} = {self.value:g}"


@dataclass
class InterventionResult:
    """The next-token distribution before and after, and, for the graph's target logits, the change of each
    (demeaned) logit in the model beside the graph's two predictions."""

    changes: list[FeatureChange]
    freeze: str
    tokens: list[int]  # the graph's target tokens (or the model's top tokens when no graph is given)
    labels: list[str]
    before: torch.Tensor  # [V] probabilities
    after: torch.Tensor  # [V]
    change: torch.Tensor  # [k] the model's change of each token's demeaned logit (before a final soft-cap)
    direct: torch.Tensor | None = None  # [k] the graph's direct prediction
    through: torch.Tensor | None = None  # [k] its prediction through its features
    unseen: list[FeatureChange] = field(default_factory=list)  # changes to features that are no node of the graph

    def rows(self) -> list[dict]:
        """One dict per target token: its probability before and after, its logit's change and the predictions."""
        out = []
        for k, (token, label) in enumerate(zip(self.tokens, self.labels)):
            row = {"token": label, "before": float(self.before[token]), "after": float(self.after[token]),
                   "change": float(self.change[k])}
            if self.direct is not None:
                row.update(direct=float(self.direct[k]), through=float(self.through[k]))
            out.append(row)
        return out


@torch.no_grad()
def intervene(model: nn.Module, prompt, transcoders, changes: list[FeatureChange], *, freeze: str = "attention",
              graph: Graph | None = None) -> InterventionResult:
    """Run `prompt` through `model` with `changes` made to `transcoders`' features (module docstring), holding
    what `freeze` says; with a graph of the same prompt, its predictions for its target logits. Raises ValueError
    for an unknown freeze, a layer, feature or position out of range, or a graph of another prompt; and, after
    the pass, for changes so large that the logits are no longer finite."""
    if not isinstance(freeze, str) or freeze not in FREEZES:
        raise ValueError(f"freeze={shorten(repr(freeze), 80)}; allowed: {', '.join(map(repr, FREEZES))}")
    if not isinstance(changes, (list, tuple)) or not all(isinstance(c, FeatureChange) for c in changes):
        raise ValueError("changes must be a list of FeatureChange (layer, feature, position, value= or add=)")
    if graph is not None and not isinstance(graph, Graph):
        raise ValueError(f"graph must be a Graph of the same prompt, or None; got {type(graph).__name__}")
    check_fits(model, transcoders)
    ids = prompt_ids(model, prompt)
    if graph is not None and graph.meta.get("prompt_ids") != ids.tolist():
        raise ValueError("the graph was made on another prompt than this one")
    T = len(ids)
    for change in changes:
        if not 0 <= change.layer < transcoders.n_layers:
            raise ValueError(f"layer {change.layer} is not in [0, {transcoders.n_layers})")
        if not 0 <= change.feature < transcoders.d_transcoder:
            raise ValueError(f"feature {change.feature} is not in [0, {transcoders.d_transcoder})")
        if change.position is not None and not 1 <= change.position < T:
            raise ValueError(f"position {change.position} is not in [1, {T}) (the first position is no feature's)")
    rep = Replacement(model, transcoders, ids)
    logits, explained = model_with_changes(model, rep, changes, freeze)
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(f"the model's logits are not finite after {', '.join(map(str, changes))[:200]}: the changes "
                         "are too large for its arithmetic")
    before = torch.softmax(rep.logits, dim=-1)
    after = torch.softmax(logits, dim=-1)
    if graph is not None:
        tokens = [node.index for node in graph.nodes if node.kind == "logit"]
        labels = [node.label for node in graph.nodes if node.kind == "logit"]
    else:
        tokens = before.topk(10).indices.tolist()
        labels = model.tokenizer.labels(tokens) if getattr(model, "tokenizer", None) else [str(t) for t in tokens]
    demeaned = lambda x: x[tokens] - x.mean()  # noqa: E731 - the graph's logit rows are demeaned
    result = InterventionResult(list(changes), freeze, tokens, labels, before, after,
                                demeaned(explained) - demeaned(rep.explained_logits))
    if graph is not None:
        result.direct, result.through, result.unseen = predictions(graph, rep, changes)
    return result


def activation_changes(rep: Replacement, changes: list[FeatureChange], current: dict[int, torch.Tensor]
                       ) -> dict[int, torch.Tensor]:
    """{layer: [T, F] delta}: each change's new activation minus the current one (current[layer] [T, F]),
    or its added amount, at its positions."""
    T = len(rep.ids)
    deltas: dict[int, torch.Tensor] = {}
    for change in changes:
        delta = deltas.setdefault(change.layer, torch.zeros(T, rep.transcoders.d_transcoder, device=rep.device))
        positions = list(range(1, T)) if change.position is None else [change.position]
        for p in positions:
            now = current[change.layer][p, change.feature]
            delta[p, change.feature] += change.add if change.add is not None else change.value - now
    return deltas


def model_with_changes(model: nn.Module, rep: Replacement, changes: list[FeatureChange], freeze: str
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """([V] the last position's logits of the model with the changes made, [V] the same before a final soft-cap,
    as the graph explains them), holding what `freeze` says: with
    "all", every norm of the residual stream runs with its scale frozen (frozen.norms_frozen) and each MLP's
    output point holds the prompt's value, but for the changes and a skip's linear path."""
    transcoders, L = rep.transcoders, rep.n_layers
    clean = rep.trace
    seen: dict[int, torch.Tensor] = {}
    deltas: dict[int, torch.Tensor] = {}
    clean_features = {c.layer: transcoders.encode(c.layer, rep.inputs[c.layer]).float() for c in changes}
    if freeze == "all":  # the change is measured against the prompt's own activations, as the graph's edges are
        deltas = activation_changes(rep, changes, clean_features)

    def read_input(layer):
        def fn(x):
            seen[layer] = x
            if freeze != "all" and any(c.layer == layer for c in changes):
                now = {layer: transcoders.encode(layer, x[0]).float()}
                deltas.update(activation_changes(rep, [c for c in changes if c.layer == layer], now))
        return fn

    def write_output(layer):
        def fn(y):
            out = clean[rep.output_points[layer]][0].clone() if freeze == "all" else y[0].float()
            if freeze == "all" and rep.skips[layer] is not None:  # the skip follows its input, linearly
                out = out + (seen[layer][0].float() - rep.inputs[layer]) @ rep.skips[layer]
            for source in transcoders.writers(layer):
                if source in deltas:
                    out = out + deltas[source] @ transcoders.decoder_vectors(source)[:, layer - source].detach().float()
            return out.to(y.dtype).view_as(y)
        return fn

    interventions = {}
    for layer in range(L):
        if freeze in ("attention", "all"):
            interventions[f"blocks.{layer}.attn.pattern"] = lambda x, layer=layer: clean[f"blocks.{layer}.attn.pattern"]
        interventions[rep.input_points[layer]] = read_input(layer)
        interventions[rep.output_points[layer]] = write_output(layer)
    with norms_frozen(rep.norms if freeze == "all" else {}), trace(model, [], interventions=interventions):
        output = model(rep.ids[None])
    head = model.lm_head
    explained = head.proj(head.transform(output.last_hidden_state[0, -1])) if head.softcap is not None else output.logits[0, -1]
    return output.logits[0, -1].float(), explained.float()


def predictions(graph: Graph, rep: Replacement, changes: list[FeatureChange]
                ) -> tuple[torch.Tensor, torch.Tensor, list[FeatureChange]]:
    """(direct [k], through the graph [k], the changes to features that are no node) for the graph's logits.

    With r_s = delta_s / a_s (the change per unit of each feature's activation), a target moves by A[t] . r;
    through the graph, each feature that was not changed moves by its own A[i] . r first, in node order (its
    inputs all come earlier), and passes that on."""
    features = {(node.layer, node.column, node.index): i for i, node in enumerate(graph.nodes) if node.kind == "feature"}
    device = graph.adjacency.device  # the graph's data, wherever the model ran
    activations = torch.tensor([node.value if node.kind == "feature" else 0.0 for node in graph.nodes], device=device)
    delta = torch.zeros(len(graph), device=device)
    unseen = []
    for change in changes:
        positions = list(range(1, len(rep.ids))) if change.position is None else [change.position]
        for p in positions:
            i = features.get((change.layer, p, change.feature))
            if i is None:
                if change.add is not None or change.value != 0:  # ablating a silent feature changes nothing
                    unseen.append(change)
                continue
            delta[i] += change.add if change.add is not None else change.value - activations[i]
    per_unit = torch.where(activations > 0, delta / activations.clamp(min=1e-30), 0.0)  # (N,)
    logits = graph.mask("logit")
    direct = graph.adjacency[logits] @ per_unit
    fixed = delta != 0
    for i in graph.mask("feature").nonzero().flatten().tolist():
        if not fixed[i]:
            per_unit[i] = (graph.adjacency[i] @ per_unit) / activations[i]
    through = graph.adjacency[logits] @ per_unit
    return direct, through, sorted(set(unseen), key=unseen.index)
