"""The residual stream as a graph of components: who writes it, who reads it, and the edges between.

Shape letters: U sources, V destinations, B batch, T positions, E model width (d_model),
H query heads, K key/value heads, D head width, L layers.

In a pre-norm block every sublayer reads the residual stream, and the stream is the sum of what
was written before (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"):

    sources       the embeddings (block 0's input), each head's output, each MLP's output
    destinations  each head's query, key and value input (k and v per key/value head), each MLP's
                  input, the logits (the final residual, before the final norm)

    in_v = sum_{u before v} out_u + b_v                 (b_v: the output biases, constant)

so an edge u -> v is the term out_u inside in_v: it can be scored by the gradient at in_v, and
patched by changing in_v alone (TransformerLens's split q/k/v inputs and hook_mlp_in; auto-circuit;
Hanna et al.).

The other layouts anatomy opens keep the stream a sum once a sublayer's output norm is frozen:

    sandwich, post-sublayer (Gemma 2/3, OLMo 2)   x + Norm'(Attn(...)): head h writes Norm'(head_out_h) with
                                                  the norm's scale frozen at the run's own (the heads' writes
                                                  and the norm of the output bias sum to the sublayer's);
                                                  the MLP writes its norm's output
    parallel (GPT-NeoX, GPT-J's shared norm)       both sublayers read resid_pre; the MLP reads its own copy
    mixture of experts (Mixtral)                   the experts and the router are one MLP: one node

A post-norm block renormalises the whole stream after every sublayer: no reader's input is a sum of
the components' outputs, and edges are refused (nodes are not: nodes.py, verify_nodes).
A head's query input differs from its neighbour's only in a patched run: in the model's own pass
every reader of a layer sees the same residual, so a gradient at a head's own input is the
gradient through that head's projection, computed here by one vector-Jacobian product per head.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ...analysis.decompose import head_writes, mlp_write_point
from ...analysis.inputs import Batch
from ...trace import trace
from .choices import edge_refusal

SOURCE_KINDS = ("embed", "head", "mlp")
DESTINATION_KINDS = ("q", "k", "v", "mlp", "logits")


@dataclass(frozen=True)
class Node:
    """One source or destination: `layer` is -1 for the embeddings and L for the logits; `index` is the
    head (or key/value head) inside its layer, 0 for the rest."""

    name: str
    kind: str
    layer: int
    index: int = 0


class ResidualGraph:
    """The sources, destinations and possible edges of a decoder whose residual stream is a sum (module docstring).

    allowed [U, V] bool: source u is upstream of destination v (an earlier layer, or, in a sequential
    block, a head of the same layer feeding that layer's MLP). Raises ValueError (edge_refusal) for a
    post-norm model or one that is no decoder with an LM head.
    """

    def __init__(self, model: nn.Module):
        config = model.config
        why = edge_refusal(config)
        if why:
            raise ValueError(why)
        self.model = model
        self.n_layers, self.n_heads, self.n_kv = config.n_layers, config.n_heads, config.n_kv_heads
        self.parallel = config.parallel_residual
        sources = [Node("embed", "embed", -1)]
        destinations = []
        for layer in range(self.n_layers):
            sources += [Node(f"L{layer}H{h}", "head", layer, h) for h in range(self.n_heads)]
            sources.append(Node(f"L{layer} MLP", "mlp", layer))
            destinations += [Node(f"L{layer}H{h}.q", "q", layer, h) for h in range(self.n_heads)]
            kv = "H" if self.n_kv == self.n_heads else "KV"
            destinations += [Node(f"L{layer}{kv}{j}.{which}", which, layer, j)
                             for which in ("k", "v") for j in range(self.n_kv)]
            destinations.append(Node(f"L{layer} MLP.in", "mlp", layer))
        destinations.append(Node("logits", "logits", self.n_layers))
        self.sources, self.destinations = sources, destinations
        self.allowed = torch.tensor([[self._reaches(u, v) for v in destinations] for u in sources], device="cpu")  # (U, V)

    def _reaches(self, u: Node, v: Node) -> bool:
        if u.layer < v.layer:
            return True
        return u.layer == v.layer and u.kind == "head" and v.kind == "mlp" and not self.parallel

    @property
    def edge_count(self) -> int:
        return int(self.allowed.sum())

    def edge_name(self, u: int, v: int) -> str:
        return f"{self.sources[u].name} → {self.destinations[v].name}"

    def layer_destinations(self, layer: int) -> list[int]:
        """The indices of the destinations in `layer` (L: the logits)."""
        return [i for i, node in enumerate(self.destinations) if node.layer == layer]

    # ---- trace points ---------------------------------------------------------------------------

    def reader_input_point(self, layer: int, kind: str) -> str:
        """The point whose value is the residual a reader of `kind` in `layer` reads (before its norm)."""
        if kind == "logits":
            return f"blocks.{self.n_layers - 1}.resid_post"
        if kind == "mlp" and not self.parallel:
            return f"blocks.{layer}.resid_mid"
        return f"blocks.{layer}.resid_pre"

    def mlp_write_point(self, layer: int) -> str:
        """The point whose value the block adds to the stream for its MLP (analysis.decompose.mlp_write_point)."""
        return mlp_write_point(self.model.blocks[layer], f"blocks.{layer}.")

    def source_values(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """[U, B, T, E]: every source's output in one pass (no gradient)."""
        return self.source_run(model, batch)[0]

    def source_run(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(every source's output [U, B, T, E], the last position's logits [B, vocab]) of one pass, no gradient."""
        outputs, logits, _ = self.recorded_run(model, batch, [])
        return outputs, logits

    def recorded_run(self, model: nn.Module, batch: Batch, points: list[str]
                     ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """source_run's (outputs [U, B, T, E], logits [B, vocab]) and {point: value} of `points`, from the same
        pass."""
        names = ["blocks.0.resid_pre"] + [name for l in range(self.n_layers)
                                          for name in (f"blocks.{l}.attn.head_out", self.mlp_write_point(l))]
        with torch.no_grad(), trace(model, sorted(set(names + points))) as t:
            logits = batch.last_logits(model)[:, 0]  # (B, vocab)
        outputs = [t["blocks.0.resid_pre"][None]]
        for layer, block in enumerate(self.model.blocks):
            writes = head_writes(block, t[f"blocks.{layer}.attn.head_out"])  # (B, T, H, E)
            outputs.append(writes.permute(2, 0, 1, 3))  # (B, T, H, E) -> (H, B, T, E)
            outputs.append(t[self.mlp_write_point(layer)][None])
        return torch.cat(outputs), logits, {point: t[point] for point in points}  # (U, B, T, E), (B, vocab)

    # ---- gradients at every destination's own input -----------------------------------------------

    def reader_gradients(
        self, model: nn.Module, batch: Batch, score: Callable[[torch.Tensor], torch.Tensor],
        embed: torch.Tensor | None = None, mix: tuple[torch.Tensor, float] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(score [B], G [V, B, T, E], sources [U, B, T, E] or None): G[v] = d score / d in_v, the gradient
        at destination v's own input.

        score(last logits [B, V_vocab]) -> [B]; each row's gradient is its own score's. `embed` [B, T, E]
        replaces block 0's input (integrated gradients' interpolated inputs). mix = (ablation [U, B, T, E],
        alpha): every edge is moved alpha of the way to its ablated value, in_v = resid_v + alpha sum_{u
        before v} (a_u - cur_u) (auto-circuit's edge masks, all at alpha); the sources' outputs in that run
        are returned too.
        """
        blocks = self.model.blocks
        names = []
        for layer in range(self.n_layers):
            names += [f"blocks.{layer}.{p}" for p in ("resid_pre", "attn.q", "attn.k", "attn.v", "mlp_in")]
            if not self.parallel:
                names.append(f"blocks.{layer}.resid_mid")
        final = self.reader_input_point(self.n_layers, "logits")
        names.append(final)

        def input_with_grad(x: torch.Tensor) -> torch.Tensor:
            value = x if embed is None else embed
            return value.detach().requires_grad_(True)  # gradients exist even if the weights are frozen

        interventions, state = {"blocks.0.resid_pre": input_with_grad}, {}
        for layer in range(self.n_layers):  # the MLP's own copy of the stream: a gradient of the MLP's path alone
            interventions[f"blocks.{layer}.mlp_in"] = lambda x: x.view_as(x)
        if mix is not None:
            interventions = _mixing(self, mix, interventions, state)
        with torch.enable_grad(), trace(model, sorted(set(names)), interventions, grad=True) as t:
            values = score(batch.last_logits(model)[:, 0])  # (B,)
            wanted = [t[f"blocks.{l}.{p}"] for l in range(self.n_layers) for p in ("attn.q", "attn.k", "attn.v", "mlp_in")]
            grads = torch.autograd.grad(values.sum(), wanted + [t[final]], allow_unused=True)
            inputs = {name: t[name].detach() for name in names}
        inputs.update({name: value.detach() for name, value in state.items() if name.startswith("in ")})
        grads = [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wanted + [t[final]])]
        per_layer = []
        for layer in range(self.n_layers):
            block, (g_q, g_k, g_v, g_mlp) = blocks[layer], grads[4 * layer:4 * layer + 4]
            x_attn = inputs.get(f"in attn {layer}", inputs[f"blocks.{layer}.resid_pre"])
            per_layer += [_reader_gradient(block, which, x_attn, g) for which, g in (("q", g_q), ("k", g_k), ("v", g_v))]
            per_layer.append(g_mlp[None])  # (1, B, T, E): at the MLP's own input, before its norm
        per_layer.append(grads[-1][None])
        sources = None if mix is None else torch.stack([state["sources"][u].detach() for u in range(len(self.sources))])
        return values.detach(), torch.cat(per_layer).detach(), sources  # G in the order of self.destinations


def _mixing(graph: ResidualGraph, mix: tuple[torch.Tensor, float], interventions: dict, state: dict) -> dict:
    """The interventions of a run where every reader's input is resid + alpha * sum_{u before it} (a_u - cur_u),
    kept in the autograd graph; state gets the sources' outputs and each reader's input ("in attn L")."""
    ablation, alpha = mix
    state.update(sources={}, running=None)
    first = interventions["blocks.0.resid_pre"]

    def embed(x: torch.Tensor) -> torch.Tensor:
        x = first(x)
        state["sources"][0], state["running"] = x, ablation[0] - x
        state["resid"] = x
        return x

    def sources(layer: int, kind: str):
        start = next(i for i, node in enumerate(graph.sources) if node.layer == layer and node.kind == kind)
        block = graph.model.blocks[layer]

        def fn(x: torch.Tensor) -> None:
            for offset, value in enumerate(head_writes(block, x).unbind(2) if kind == "head" else (x,)):
                state["sources"][start + offset] = value
                state["running"] = state["running"] + (ablation[start + offset] - value)

        return fn

    def keep(x: torch.Tensor) -> None:
        state["resid"] = x

    def mixed() -> torch.Tensor:
        return state["resid"] + alpha * state["running"]

    def attention_reader(layer: int, which: str):
        block = graph.model.blocks[layer]

        def fn(x: torch.Tensor) -> torch.Tensor:
            state[f"in attn {layer}"] = inputs = mixed()
            return block.attn.project(attention_norm(block)(inputs), which)

        return fn

    def mlp_reader(layer: int):
        def fn(x: torch.Tensor) -> torch.Tensor:
            state[f"in mlp {layer}"] = inputs = mixed()
            return inputs

        return fn

    interventions = {"blocks.0.resid_pre": embed}
    for layer in range(graph.n_layers):
        if layer:
            interventions[f"blocks.{layer}.resid_pre"] = keep
        if not graph.parallel:
            interventions[f"blocks.{layer}.resid_mid"] = keep
        interventions[f"blocks.{layer}.attn.head_out"] = sources(layer, "head")
        interventions[graph.mlp_write_point(layer)] = sources(layer, "mlp")
        for which in ("q", "k", "v"):
            interventions[f"blocks.{layer}.attn.{which}"] = attention_reader(layer, which)
        interventions[f"blocks.{layer}.mlp_in"] = mlp_reader(layer)
    interventions[graph.reader_input_point(graph.n_layers, "logits")] = lambda x: x + alpha * state["running"]
    return interventions


def attention_norm(block: nn.Module):
    """The norm the block's attention reads the stream through (the identity where it has none: OLMo 2)."""
    return getattr(block, "attn_norm", None) or (lambda x: x)


def _reader_gradient(block: nn.Module, which: str, x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """[heads, B, T, E]: the gradient at each head's own q (k, v) input x [B, T, E] (before the attention's norm,
    if it has one), given the gradient at the point attn.q (k, v) [B, heads, T, D].

    Without q/k norms a head's projection is linear, y_h = norm(x) W_h^T + b_h, so the gradient through
    head h alone is J_norm(x)^T (g_h W_h): one product per head as cheap as the projection itself, then
    the norm's vector-Jacobian product, batched over the heads. With q/k norms, through the module."""
    attn, norm = block.attn, attention_norm(block)
    if attn.qk_norm != "none":
        return _per_head(lambda inputs: attn.project(norm(inputs), which), x, grad)
    proj = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj}[which]
    heads = grad.size(1)
    weight = proj.weight.view(heads, -1, proj.weight.size(1))  # (heads, D, E): W_h, the rows of head h
    through_head = torch.einsum("bhtd,hde->hbte", grad, weight.to(grad.dtype))  # (heads, B, T, E) at norm(x)
    _, pullback = torch.func.vjp(norm, x)
    return torch.func.vmap(pullback)(through_head)[0]  # (heads, B, T, E)


def _per_head(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """[heads, B, T, E]: the gradient reaching x [B, T, E] through each head of fn(x) [B, heads, T, D] alone,
    given the gradient at fn(x): one vector-Jacobian product per head, batched by vmap."""
    _, pullback = torch.func.vjp(fn, x)
    heads = grad.size(1)
    one_head = torch.eye(heads, dtype=grad.dtype, device=grad.device)[:, None, :, None, None]  # (heads, 1, heads, 1, 1)
    return torch.func.vmap(pullback)(grad[None] * one_head)[0]  # (heads, B, T, E)
