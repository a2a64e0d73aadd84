"""What no node carries, and the identity every attribution graph checks about itself.

Shape letters: T positions, E d_model, N nodes, n active features, k logits, R the rows a capped graph holds.

Each target's value (a feature's pre-activation, a demeaned logit) is linear in what the nodes write, plus
what none of them carries: positional embeddings, biases (attention's, the norms', b_dec, b_enc), a skip's
share of them, and everything the first position writes (its features and errors are no nodes, as in
circuit-tracer). That rest is the replacement's forward pass with every node switched off, so that

    whole graph     value_t = sum_s A[t, s] + rest_t
    capped graph    value_t = sum over kept s of A[t, s] + sum over dropped features f of A[t, f] + rest_t

and graph.check states how closely each holds: the largest |difference|, and the largest as a share of the
sum of the |terms| it adds up. A capped graph also names what its dropped features carry: their share of the
partial influence on the outputs (capped.py), and of its targets' input.
"""

from __future__ import annotations

import torch

from .layout import Active
from .replacement import Replacement, release
from .vectors import float32_layer


def demeaned(bias: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor | float:
    """b[ids] - mean(b): the LM head's bias as a demeaned logit sees it (0 without a bias)."""
    return 0.0 if bias is None else bias[ids.to(bias.device)] - bias.mean()


@torch.no_grad()
def unexplained(rep: Replacement, active: Active, logit_ids: torch.Tensor,
                logit_vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([n] for each active feature, [k] for each logit): what no node carries of its value (module docstring),
    the replacement's forward pass with every node switched off, a layer at a time."""
    features = torch.zeros(len(active.layer), device=rep.device)

    def features_read(layer: int):
        def read(x: torch.Tensor) -> None:  # (T, E) what the transcoder reads: its features' pre-activations there
            start, stop = active.span(layer)
            if stop > start:
                sae = float32_layer(rep.transcoders.layers[layer])
                pre = sae.pre_activations(x.to(sae.W_enc.device)).float().to(rep.device)  # (T, F)
                features[start:stop] = pre[active.position[start:stop], active.feature[start:stop]]
        return read

    x = rep.embed_rest  # (T, E)
    for layer in range(rep.n_layers):
        x = rep.block_forward(layer, x, no_node_mlp(rep, layer, features_read(layer)))
    return features, logit_vectors @ rep.final_forward(x) + demeaned(rep.unembed_bias, logit_ids)


def no_node_mlp(rep: Replacement, layer: int, on_read=None):
    """Layer's MLP in the replacement with every node switched off, as block_forward takes it: what the transcoder
    reads [T, E] -> its output: b_dec, a skip's share of what it reads, and the first position's whole output but
    for the part its skip passes on (a linear path, counted by the skip). on_read(read): shown what it reads."""
    def replaced(read: torch.Tensor) -> torch.Tensor:
        if on_read is not None:
            on_read(read)
        bias = rep.transcoders.output_bias(layer).detach().to(rep.device, torch.float32, copy=True)
        release(rep.transcoders, layer)
        out = bias.expand(read.size(0), -1).clone()  # (T, E)
        skip = rep.skips[layer]
        if skip is not None:
            out += read @ skip
        first = rep.outputs[layer][0] - bias
        out[0] += first if skip is None else first - rep.inputs[layer][0] @ skip
        return out
    return replaced


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


def whole_check(adjacency: torch.Tensor, values: torch.Tensor, rest: torch.Tensor) -> tuple[str, float]:
    """(the check line, the largest relative difference) of a whole graph."""
    differences, terms = identity_gaps(adjacency, values, rest)
    error = float((differences / terms.clamp(min=1e-30)).max())
    return (f"every feature's pre-activation and every target logit = its edges + what no node carries: "
            f"max |diff| {float(differences.max()):.2g}, at most {error:.2g} of the terms it sums"), error


def capped_check(adjacency: torch.Tensor, targets: torch.Tensor, values: torch.Tensor, rest: torch.Tensor,
                 totals: torch.Tensor, absolute: torch.Tensor, feature_influence: torch.Tensor, chosen: torch.Tensor,
                 influence: torch.Tensor) -> tuple[str, float, torch.Tensor, torch.Tensor, dict]:
    """(check line, largest relative difference, values [n_kept], unexplained [n_kept], what the dropped features
    carry: {dropped_features, dropped_influence, dropped_input}) of a capped graph.

    targets [R]: the kept node of each row held; values, rest, totals (its sum over every source), absolute
    (its sum of |A|): [R] each. The graph's unexplained part of a target is rest + what its dropped features
    carry, so that values = adjacency.sum(1) + unexplained holds on it as on a whole graph."""
    kept, kept_absolute = torch.empty_like(totals), torch.empty_like(totals)  # each target's sums over its kept edges
    for start in range(0, len(targets), 1024):
        rows = adjacency[targets[start:start + 1024]]  # (b, n_kept)
        kept[start:start + 1024], kept_absolute[start:start + 1024] = rows.sum(1), rows.abs().sum(1)
    dropped = totals - kept
    differences = (values.double() - totals.double() - rest.double()).abs()
    terms = absolute.double() + rest.abs().double()
    error = float((differences / terms.clamp(min=1e-30)).max())
    n_kept = adjacency.size(0)
    all_values = torch.full((n_kept,), float("nan"), device=adjacency.device)
    all_rest = torch.zeros(n_kept, device=adjacency.device)
    all_values[targets], all_rest[targets] = values, rest + dropped
    dropped_influence = float(feature_influence[~chosen].sum() / influence.sum().clamp(min=1e-30))
    dropped_input = float((absolute - kept_absolute).sum() / absolute.sum().clamp(min=1e-30))
    n, m = len(chosen), int(chosen.sum())
    check = (f"every target held ({m:,} of the {n:,} active features, chosen by influence, and the logits) = its "
             f"edges + the dropped features' + what no node carries: max |diff| {float(differences.max()):.2g}, at "
             f"most {error:.2g} of the terms it sums; the {n - m:,} features dropped hold {dropped_influence:.1%} of "
             f"the partial influence on the outputs and {dropped_input:.1%} of the held targets' input")
    carried = {"dropped_features": n - m, "dropped_influence": dropped_influence, "dropped_input": dropped_input}
    return check, error, all_values, all_rest, carried
