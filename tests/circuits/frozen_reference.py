"""The reference for an attribution graph's edges: the model itself, frozen, in float64, one source at a time.

Every norm module (before or on a sublayer, after a residual sum, after the embeddings, the final one; the q/k
norms too, which the frozen patterns make moot) runs with its scale held at the clean pass's, every attention
pattern is the clean pass's, every transcoder output point holds its clean value (plus a skip's linear change,
which follows its input), and the logits are read before a final soft-cap. The frozen model is then exactly
affine in what the nodes write: adding one source's vector where it writes and subtracting the unchanged pass
gives that source's column of direct effects on every feature's pre-activation and every demeaned logit. No
code of the replacement model (anatomy/circuits) is used: the model's own modules, its trace points, and the
norms written out here.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

import anatomy
from anatomy.layers import LayerNorm, RMSNorm


def norms_of(model) -> list:
    return [module for module in model.modules() if isinstance(module, (LayerNorm, RMSNorm))]


def clean_scales(model, ids) -> dict:
    """{norm module: 1 / sqrt(mean(centre(x)^2) + eps) [..., 1]} of each norm's input in the clean pass."""
    scales = {}

    def keep(module, args):
        x = args[0].double()
        x = x - x.mean(-1, keepdim=True) if isinstance(module, LayerNorm) else x
        scales[module] = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.eps)

    handles = [norm.register_forward_pre_hook(keep) for norm in norms_of(model)]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return scales


@contextmanager
def frozen_norms(model, scales: dict):
    """Every norm computes centre(x) s g + beta with s its clean scale, through its own trace points."""
    def frozen(norm, scale):
        def forward(x):
            centred = x - x.mean(-1, keepdim=True) if isinstance(norm, LayerNorm) else x
            normalized = norm.normalized(centred * scale)
            if isinstance(norm, LayerNorm):
                return norm.out(normalized * norm.weight + norm.bias)
            return norm.out(normalized * ((1 + norm.weight) if norm.plus_one else norm.weight))
        return forward

    for norm in norms_of(model):
        norm.forward = frozen(norm, scales[norm])
    try:
        yield
    finally:
        for norm in norms_of(model):
            del norm.forward


def frozen_interventions(transcoders, clean, inputs: dict, extra_out: dict, extra_embed: torch.Tensor | None) -> dict:
    """{trace point: intervention} that freeze a pass at `clean` (a trace of the patterns and the transcoders' points):
    every pattern the clean one, every transcoder output point its clean value plus a skip's linear change (which
    follows its input, recorded into `inputs` by layer), plus extra_out[layer] [1, T, E]; extra_embed [1, T, E']
    added to the embeddings."""
    interventions = {}
    if extra_embed is not None:
        interventions["embed"] = lambda x: x + extra_embed
    for l in range(transcoders.n_layers):
        point_in, point_out = transcoders.input_point(l), transcoders.output_point(l)
        interventions[f"blocks.{l}.attn.pattern"] = lambda x, l=l: clean[f"blocks.{l}.attn.pattern"]

        def read(x, l=l):
            inputs[l] = x

        def write(x, l=l, point_in=point_in, point_out=point_out):
            out = clean[point_out].clone()
            skip = transcoders.skip(l)
            if skip is not None:  # the skip path stays linear: it follows its input
                out = out + (inputs[l] - clean[point_in]) @ skip
            return out + extra_out.get(l, 0)
        interventions[point_in] = read
        interventions[point_out] = write
    return interventions


@torch.no_grad()
def frozen_reference(model, transcoders, graph) -> torch.Tensor:
    """[N, N] direct effects by perturbation of the frozen model, in float64 (module docstring)."""
    model, transcoders = model.double(), transcoders.double()
    try:
        return _reference(model, transcoders, graph)
    finally:
        model.float(), transcoders.float()


def _reference(model, transcoders, graph) -> torch.Tensor:
    ids = torch.tensor([graph.meta["prompt_ids"]])
    L, T = model.config.n_layers, ids.size(1)
    ins = [transcoders.input_point(l) for l in range(L)]
    outs = [transcoders.output_point(l) for l in range(L)]
    with anatomy.trace(model, ["embed"] + [f"blocks.{l}.attn.pattern" for l in range(L)] + ins + outs) as clean:
        model(ids)
    scales = clean_scales(model, ids)

    def run(extra_out: dict, extra_embed: torch.Tensor | None) -> torch.Tensor:
        """Targets' values with extra_out[layer] [1, T, E] added at the output points, extra_embed at the embeddings."""
        inputs: dict = {}
        interventions = frozen_interventions(transcoders, clean, inputs, extra_out, extra_embed)
        softcap, model.lm_head.softcap = model.lm_head.softcap, None  # the logits before a final soft-cap
        try:
            with frozen_norms(model, scales), anatomy.trace(model, [], interventions=interventions):
                logits = model(ids).logits[0, -1]
        finally:
            model.lm_head.softcap = softcap
        values = torch.zeros(len(graph), dtype=torch.float64)
        for i, node in enumerate(graph.nodes):
            if node.kind == "feature":
                values[i] = transcoders.pre_activations(node.layer, inputs[node.layer][0, node.column])[node.index]
            elif node.kind == "logit":
                values[i] = logits[node.index] - logits.mean()
        return values

    def at(column: int, vector: torch.Tensor) -> torch.Tensor:
        add = torch.zeros(1, T, vector.size(-1), dtype=torch.float64)
        add[0, column] = vector
        return add

    base = run({}, None)
    reference = torch.zeros(len(graph), len(graph), dtype=torch.float64)
    for s, node in enumerate(graph.nodes):
        if node.kind == "token":
            column = run({}, at(node.column, clean["embed"][0, node.column]))
        elif node.kind == "feature":
            vectors = transcoders.decoder_vectors(node.layer)[node.index]  # (O, E)
            column = run({node.layer + j: at(node.column, node.value * vectors[j]) for j in range(len(vectors))}, None)
        elif node.kind == "error" and node.column > 0:
            column = run({node.layer: at(node.column, error_vector(transcoders, clean, graph, node))}, None)
        else:
            continue
        reference[:, s] = column - base
    return reference


def error_vector(transcoders, clean, graph, node) -> torch.Tensor:
    """[E] what the MLP wrote at the node's output point beyond the transcoders' reconstruction, in float64."""
    T, L = len(graph.meta["prompt_ids"]), transcoders.n_layers
    features = [torch.zeros(T, transcoders.d_transcoder, dtype=torch.float64) for _ in range(L)]
    for other in graph.nodes:
        if other.kind == "feature":
            features[other.layer][other.column, other.index] = other.value
    inputs = [clean[transcoders.input_point(l)][0] for l in range(L)]
    recon = transcoders.reconstruct(node.layer, features, inputs)
    return clean[transcoders.output_point(node.layer)][0, node.column] - recon[node.column]
