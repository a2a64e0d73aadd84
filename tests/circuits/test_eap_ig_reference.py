"""EAP-IG as Hanna et al. (2024, "Have Faith in Faithfulness", section 3) define it, written here from the
paper in float64 on a tiny model, against anatomy's default (path="inputs").

The paper: the score of an edge (u, v) is

    (z'_u - z_u) . 1/m sum_{k=1..m} d L(z' + k/m (z - z')) / d (input of v)

with z, z' the clean and corrupted activations, the path running through the input embeddings from the
corrupted to the clean ones, and the gradient taken at v's own input. anatomy scores the metric lost,
(z_u - z'_u) . d m / d in_v, the same quantity with L = -m (its sign is auto-circuit's).

Nothing of anatomy's discovery code is used here: the model's forward pass is written out by hand from
its weights (a pre-norm decoder: LayerNorm, causal multi-head attention with grouped keys and values,
GELU MLP, final LayerNorm, tied unembedding), every destination reads the residual stream through a zero
tensor of its own, resid + delta_v, so that the gradient at delta_v is the gradient at v's input, and
every source's output is recorded where it is written.
"""

from __future__ import annotations

import math

import pytest
import torch

import anatomy
from anatomy.circuits.discovery import Task, attribute_edges

LAYERS, HEADS, KV, WIDTH, PAIRS, LENGTH = 2, 4, 2, 16, 5, 6


def tiny_model():
    config = anatomy.ModelConfig(arch="decoder", vocab_size=40, d_model=WIDTH, n_heads=HEADS, n_kv_heads=KV,
                                 n_layers=LAYERS, d_ff=32, max_seq_len=32, pos_encoding="learned", norm="layernorm",
                                 activation="gelu")
    model = anatomy.build_model(config, seed=3).double().eval()
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():  # larger than the initialisation, so that every edge matters
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64) * 0.3)
    return model


def pairs() -> Task:
    generator = torch.Generator().manual_seed(5)
    clean = torch.randint(0, 40, (PAIRS, LENGTH), generator=generator)
    corrupt = clean.clone()
    corrupt[:, 1:3] = torch.randint(0, 40, (PAIRS, 2), generator=generator)
    lengths = torch.tensor([6, 5, 6, 4, 6])  # right padding: the last real token differs per pair
    return Task("reference", clean, corrupt, lengths, torch.randint(0, 40, (PAIRS, 1), generator=generator),
                torch.randint(0, 40, (PAIRS, 1), generator=generator))


def layer_norm(x, weight, bias):
    centred = x - x.mean(-1, keepdim=True)
    return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5) * weight + bias


def forward(w: dict, embeddings: torch.Tensor, last: torch.Tensor, deltas: dict | None = None):
    """(last-position logits [B, vocab], sources {name: [B, T, E]}): the model by hand. Destination v reads
    resid + deltas[v] (zero tensors, leaves of the gradient), named as anatomy names them."""
    d = WIDTH // HEADS
    group = HEADS // KV
    length = embeddings.size(1)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    resid = embeddings
    sources = {"embed": embeddings}

    def read(name):
        return resid if deltas is None else resid + deltas[name]

    for l in range(LAYERS):
        p = f"blocks.{l}."

        def project(name, which, rows):
            x = layer_norm(read(name), w[p + "attn_norm.weight"], w[p + "attn_norm.bias"])
            return x @ w[p + f"attn.{which}_proj.weight"][rows].T + w[p + f"attn.{which}_proj.bias"][rows]

        keys = [project(f"L{l}KV{j}.k", "k", slice(j * d, (j + 1) * d)) for j in range(KV)]
        values = [project(f"L{l}KV{j}.v", "v", slice(j * d, (j + 1) * d)) for j in range(KV)]
        written = 0
        for h in range(HEADS):
            q = project(f"L{l}H{h}.q", "q", slice(h * d, (h + 1) * d))  # (B, T, d)
            scores = q @ keys[h // group].transpose(1, 2) / math.sqrt(d)  # (B, T, S)
            pattern = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
            z = pattern @ values[h // group]  # (B, T, d)
            out = z @ w[p + "attn.o_proj.weight"][:, h * d:(h + 1) * d].T  # head h's share of the output
            sources[f"L{l}H{h}"] = out
            written = written + out
        resid = resid + written + w[p + "attn.o_proj.bias"]
        x = layer_norm(read(f"L{l} MLP.in"), w[p + "mlp_norm.weight"], w[p + "mlp_norm.bias"])
        hidden = torch.nn.functional.gelu(x @ w[p + "mlp.fc_in.weight"].T + w[p + "mlp.fc_in.bias"])
        out = hidden @ w[p + "mlp.fc_out.weight"].T + w[p + "mlp.fc_out.bias"]
        sources[f"L{l} MLP"] = out
        resid = resid + out
    final = layer_norm(read("logits"), w["final_norm.weight"], w["final_norm.bias"])
    rows = final[torch.arange(final.size(0)), last]  # (B, E)
    return rows @ w["token_embedding.weight"].T, sources


def destinations() -> list[str]:
    names = []
    for l in range(LAYERS):
        names += [f"L{l}H{h}.q" for h in range(HEADS)]
        names += [f"L{l}KV{j}.{which}" for which in ("k", "v") for j in range(KV)]
        names.append(f"L{l} MLP.in")
    return names + ["logits"]


def layer_of(name: str) -> int:
    return -1 if name == "embed" else LAYERS if name == "logits" else int(name[1:].split("H")[0].split("K")[0].split(" ")[0])


def reference_scores(model, task: Task, steps: int) -> dict[str, float]:
    """{"source → destination": score}: Hanna et al.'s formula, sign flipped to the metric lost."""
    w = {name: value.detach() for name, value in model.named_parameters()}
    lengths = task.lengths
    last = lengths - 1
    positions = torch.arange(LENGTH)

    def embed(ids):
        return w["token_embedding.weight"][ids] + w["position_embedding.weight"][positions]

    clean_embed, corrupt_embed = embed(task.clean), embed(task.corrupt)
    with torch.no_grad():
        _, clean = forward(w, clean_embed, last)
        _, corrupt = forward(w, corrupt_embed, last)
    gradients = {name: torch.zeros(PAIRS, LENGTH, WIDTH, dtype=torch.float64) for name in destinations()}
    for k in range(1, steps + 1):
        deltas = {name: torch.zeros(PAIRS, LENGTH, WIDTH, dtype=torch.float64, requires_grad=True)
                  for name in destinations()}
        logits, _ = forward(w, corrupt_embed + k / steps * (clean_embed - corrupt_embed), last, deltas)
        metric = logits.gather(1, task.answers)[:, 0] - logits.gather(1, task.wrongs)[:, 0]  # logit difference
        grads = torch.autograd.grad(metric.sum(), list(deltas.values()))
        for name, grad in zip(deltas, grads):
            gradients[name] += grad / steps
    real = (positions[None, :] < lengths[:, None]).double()[:, :, None]  # a pad position is no part of a pair
    scores = {}
    for source in clean:
        for destination in destinations():
            if layer_of(source) < layer_of(destination) or (layer_of(source) == layer_of(destination)
                                                             and "H" in source and destination.endswith("MLP.in")):
                difference = (clean[source] - corrupt[source]) * real
                scores[f"{source} → {destination}"] = float((difference * gradients[destination]).sum() / PAIRS)
    return scores


@pytest.mark.parametrize("method, steps", [("eap", 1), ("eap-ig", 1), ("eap-ig", 3)])
def test_eap_ig_inputs_is_hanna_et_al_s_formula(method, steps):
    """EAP is the formula at one step (the gradient at the clean input: Syed et al.'s attribution patching)."""
    model, task = tiny_model(), pairs()
    expected = reference_scores(model, task, steps)
    result = attribute_edges(model, task, method=method, steps=steps, path="inputs")
    graph = result.extra["graph"]
    ours = {graph.edge_name(u, v): float(result.values[u, v]) for u, v in graph.allowed.nonzero().tolist()}
    assert set(ours) == set(expected)
    worst = max(abs(ours[name] - value) for name, value in expected.items())
    largest = max(abs(value) for value in expected.values())
    assert largest > 0.1 and worst <= 1e-10 * largest, (worst, largest)


def test_the_hand_written_model_is_the_model():
    """The reference's forward pass is anatomy's model (so the formula above is evaluated on the same function)."""
    model, task = tiny_model(), pairs()
    w = {name: value.detach() for name, value in model.named_parameters()}
    embeddings = w["token_embedding.weight"][task.clean] + w["position_embedding.weight"][torch.arange(LENGTH)]
    with torch.no_grad():
        ours, _ = forward(w, embeddings, task.lengths - 1)
        clean, _ = task.inputs(range(PAIRS))
        theirs = clean.last_logits(model)[:, 0]
    assert (ours - theirs).abs().max() < 1e-12
