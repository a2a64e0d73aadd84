"""The attribution graph's edges are the direct effects of the local replacement model: checked against the
model itself, frozen by interventions, one source at a time; and bad input is refused before computing.

The reference runs anatomy's own model in float64 with every attention pattern, every norm's scale and every
MLP's output held at the prompt's values (trace interventions), so that it is exactly affine in what the
nodes write. Adding one source's vector where it writes and subtracting the unchanged pass gives that
source's column of direct effects on every feature's pre-activation and every demeaned target logit:
no transpose, no autograd, nothing shared with the sweep under test.
"""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.circuits.attribute import attribution_graph
from anatomy.circuits.graph import Node
from anatomy.sae import SAE, TranscoderSet

PROMPT = [3, 17, 5, 29, 11, 8, 40]


def tiny(*, norm="rmsnorm", pos="rotary", bias=False, kind="jumprelu", skip=False, cross_layer=False,
         input_point="blocks.L.mlp_norm.out", n_layers=3, d_model=24, features=20, plus_one=False, seed=0):
    config = anatomy.ModelConfig(arch="decoder", vocab_size=61, d_model=d_model, n_heads=4, n_kv_heads=2,
                                 n_layers=n_layers, d_ff=48, max_seq_len=32, pos_encoding=pos, norm=norm,
                                 activation="gelu" if norm == "layernorm" else "swiglu", attn_bias=bias,
                                 attn_out_bias=bias, mlp_bias=bias, norm_plus_one=plus_one)
    model = anatomy.build_model(config, seed=seed).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # larger than the init's 0.02: patterns that vary
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * (0.3 if parameter.dim() > 1 else 0.2)
                            + (1.0 if name.endswith("norm.weight") and not plus_one else 0.0))
    layers = []
    for layer in range(n_layers):
        d_out = (n_layers - layer) * d_model if cross_layer else d_model
        sae = SAE(d_model, features, kind=kind, d_out=d_out, transcoder=True, skip=skip, seed=None)
        with torch.no_grad():
            for name, parameter in sae.named_parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
            if kind == "jumprelu":
                sae.threshold.copy_(torch.rand(features, generator=generator) * 0.3)
            if cross_layer:  # a CLT's bias and skip write its own layer only
                sae.b_dec[d_model:] = 0
                if skip:
                    sae.W_skip[d_model:] = 0
        layers.append(sae)
    return model, TranscoderSet(layers, cross_layer=cross_layer, input_point=input_point).eval()


@torch.no_grad()
def frozen_reference(model, transcoders, graph) -> torch.Tensor:
    """[N, N] direct effects by perturbation of the frozen model, in float64 (module docstring)."""
    model = model.double()
    transcoders = transcoders.double()
    ids = torch.tensor([graph.meta["prompt_ids"]])
    L, T = model.config.n_layers, ids.size(1)
    names = (["embed"] + [f"blocks.{l}.{p}" for l in range(L) for p in ("resid_pre", "resid_mid", "attn.pattern", "mlp.out")]
             + [f"blocks.{L - 1}.resid_post"])
    with torch.no_grad(), anatomy.trace(model, names) as clean:
        model(ids)

    def frozen_norm(norm, recorded):
        def scale(x):
            x = x.double()
            if hasattr(norm, "bias"):
                return torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
            return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
        s = scale(recorded)

        def apply(x):
            gain = (1 + norm.weight) if getattr(norm, "plus_one", False) else norm.weight
            centred = x - x.mean(-1, keepdim=True) if hasattr(norm, "bias") else x
            return centred * s * gain + (norm.bias if hasattr(norm, "bias") else 0)
        return apply

    def run(extra_out: dict, extra_embed: torch.Tensor | None):
        """Targets' values with extra[(layer)] [T, E] added to MLP outputs and extra_embed to the embeddings."""
        seen = {}
        interventions = {}
        if extra_embed is not None:
            interventions["embed"] = lambda x: x + extra_embed
        for l in range(L):
            block = model.blocks[l]
            interventions[f"blocks.{l}.attn.pattern"] = lambda x, l=l: clean[f"blocks.{l}.attn.pattern"]

            def keep(name):
                def fn(x):
                    seen[name] = x
                return fn
            interventions[f"blocks.{l}.resid_pre"] = keep(f"pre{l}")
            interventions[f"blocks.{l}.resid_mid"] = keep(f"mid{l}")
            attn_norm = frozen_norm(block.attn_norm, clean[f"blocks.{l}.resid_pre"])
            mlp_norm = frozen_norm(block.mlp_norm, clean[f"blocks.{l}.resid_mid"])
            interventions[f"blocks.{l}.attn_norm.out"] = lambda x, l=l, f=attn_norm: f(seen[f"pre{l}"])
            interventions[f"blocks.{l}.mlp_norm.out"] = lambda x, l=l, f=mlp_norm: f(seen[f"mid{l}"])

            def mlp_out(x, l=l, f=mlp_norm):
                out = clean[f"blocks.{l}.mlp.out"].clone()
                skip = transcoders.skip(l)
                if skip is not None:  # the skip path stays linear: it follows its input
                    reads = transcoders.input_point(l).endswith("mlp_norm.out")
                    now = f(seen[f"mid{l}"]) if reads else seen[f"mid{l}"]
                    was = f(clean[f"blocks.{l}.resid_mid"]) if reads else clean[f"blocks.{l}.resid_mid"]
                    out = out + (now - was) @ skip
                return out + extra_out.get(l, 0)
            interventions[f"blocks.{l}.mlp.out"] = mlp_out
        final = frozen_norm(model.final_norm, clean[f"blocks.{L - 1}.resid_post"])
        interventions[f"blocks.{L - 1}.resid_post"] = keep("last")
        interventions["final_norm.out"] = lambda x: final(seen["last"])
        inputs = {}

        def read_input(x, l, old):
            replaced = old(x) if old else None
            inputs[l] = x if replaced is None else replaced
            return inputs[l]
        for l in range(L):
            point = transcoders.input_point(l)
            interventions[point] = lambda x, l=l, old=interventions.get(point): read_input(x, l, old)
        with torch.no_grad(), anatomy.trace(model, [], interventions=interventions):
            logits = model(ids).logits[0, -1]
        values = torch.zeros(len(graph))
        for i, node in enumerate(graph.nodes):
            if node.kind == "feature":
                values[i] = transcoders.pre_activations(node.layer, inputs[node.layer][0, node.column])[node.index]
            elif node.kind == "logit":
                values[i] = logits[node.index] - logits.mean()
        return values

    base = run({}, None)
    reference = torch.zeros(len(graph), len(graph), dtype=torch.float64)
    E = model.config.d_model
    for s, node in enumerate(graph.nodes):
        if node.kind == "token":
            extra = torch.zeros(1, T, E, dtype=torch.float64)
            extra[0, node.column] = clean["embed"][0, node.column]
            column = run({}, extra) - base
        elif node.kind == "feature":
            vectors = transcoders.decoder_vectors(node.layer)[node.index]  # (O, E)
            extra = {}
            for j in range(vectors.size(0)):
                add = torch.zeros(1, T, E, dtype=torch.float64)
                add[0, node.column] = node.value * vectors[j]
                extra[node.layer + j] = add
            column = run(extra, None) - base
        elif node.kind == "error":
            if node.column == 0:
                continue
            # the error: the MLP's output minus the set's reconstruction (recomputed here, in float64)
            error = error_vector(model, transcoders, clean, graph, node)
            add = torch.zeros(1, T, E, dtype=torch.float64)
            add[0, node.column] = error
            column = run({node.layer: add}, None) - base
        else:
            continue
        reference[:, s] = column
    model.float(), transcoders.float()
    return reference


def error_vector(model, transcoders, clean, graph, node) -> torch.Tensor:
    T = len(graph.meta["prompt_ids"])
    features = []
    for layer in range(model.config.n_layers):
        f = torch.zeros(T, transcoders.d_transcoder, dtype=torch.float64)
        for other in graph.nodes:
            if other.kind == "feature" and other.layer == layer:
                f[other.column, other.index] = other.value
        features.append(f)
    with torch.no_grad(), anatomy.trace(model, [transcoders.input_point(l) for l in range(model.config.n_layers)]) as t:
        model(torch.tensor([graph.meta["prompt_ids"]]))
    inputs = [t[transcoders.input_point(l)][0] for l in range(model.config.n_layers)]
    recon = transcoders.reconstruct(node.layer, features, inputs)
    return clean[f"blocks.{node.layer}.mlp.out"][0, node.column] - recon[node.column]


CASES = {
    "llama-like": {},
    "gpt2-like: LayerNorm, biases, learned positions": dict(norm="layernorm", pos="learned", bias=True),
    "gemma-like gain (1 + w)": dict(plus_one=True),
    "relu with a skip": dict(kind="relu", skip=True),
    "skip reading resid_mid": dict(kind="relu", skip=True, input_point="blocks.L.resid_mid"),
    "cross-layer": dict(cross_layer=True),
    "cross-layer with LayerNorm and a skip": dict(cross_layer=True, norm="layernorm", bias=True, skip=True, kind="relu"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_edge_is_the_frozen_models_direct_effect(case):
    model, transcoders = tiny(**CASES[case])
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders)
    assert graph.error < 1e-5, graph.check
    assert sum(node.kind == "feature" for node in graph.nodes) > 20
    reference = frozen_reference(model, transcoders, graph)
    scale = float(reference.abs().max())
    assert scale > 0.1
    assert (graph.adjacency.double() - reference).abs().max() < 1e-5 * max(1.0, scale), case


def test_the_identity_holds_target_by_target():
    model, transcoders = tiny(norm="layernorm", pos="learned", bias=True, skip=True, kind="relu")
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders)
    targets = ~graph.values.isnan()
    total = graph.adjacency[targets].double().sum(1) + graph.unexplained[targets].double()
    assert torch.allclose(total, graph.values[targets].double(), rtol=1e-5, atol=1e-4)
    # and the unexplained part is not the whole of it: the nodes carry most of each value
    assert (graph.adjacency[targets].abs().sum(1) > graph.unexplained[targets].abs()).float().mean() > 0.5


def test_nodes_are_the_prompts_tokens_active_features_errors_and_top_logits():
    model, transcoders = tiny()
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders, max_logits=3, logit_probability=0.999)
    T, L = len(PROMPT), model.config.n_layers
    assert [node.index for node in graph.nodes if node.kind == "token"] == PROMPT
    assert sum(node.kind == "error" for node in graph.nodes) == T * L
    logits = [node for node in graph.nodes if node.kind == "logit"]
    assert len(logits) == 3
    with torch.no_grad():
        probabilities = model(torch.tensor([PROMPT])).logits[0, -1].softmax(-1)
    assert [node.index for node in logits] == probabilities.topk(3).indices.tolist()
    features = [node for node in graph.nodes if node.kind == "feature"]
    assert all(node.column > 0 for node in features)  # the first position is no node
    with torch.no_grad(), anatomy.trace(model, ["blocks.1.mlp_norm.out"]) as t:
        model(torch.tensor([PROMPT]))
    fired = transcoders.encode(1, t["blocks.1.mlp_norm.out"][0])
    expected = {(1, q, f) for q, f in fired[1:].nonzero().tolist()}
    assert {(n.layer, n.column - 1, n.index) for n in features if n.layer == 1} == {(1, q, f) for _, q, f in expected}


def test_logits_until_the_probability_is_reached():
    model, transcoders = tiny()
    with torch.no_grad():
        probabilities = model(torch.tensor([PROMPT])).logits[0, -1].softmax(-1).sort(descending=True).values
    target = float(probabilities[:2].sum()) - 1e-4  # the first two hold it
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders, logit_probability=target)
    assert sum(node.kind == "logit" for node in graph.nodes) == 2


def test_error_ids_never_collide_with_layer_zero_features():
    model, transcoders = tiny()
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders)
    ids = [node.id for node in graph.nodes]
    assert len(set(ids)) == len(ids)
    assert Node("error", 2, 3).id not in {node.id for node in graph.nodes if node.kind == "feature"}


@pytest.mark.parametrize("prompt, words", [("", "empty"), ("   ", "empty"), (list(range(40)), "at most 32"),
                                          ([5], "at least one token"), ([5, 99], "token ids")])
def test_bad_prompts_are_refused_in_one_line(prompt, words):
    model, transcoders = tiny()
    with pytest.raises(ValueError, match=words) as error:
        attribution_graph(model, prompt if isinstance(prompt, str) else torch.tensor(prompt), transcoders)
    assert "\n" not in str(error.value)


def test_a_set_that_does_not_fit_is_refused_before_anything_runs():
    model, _ = tiny(n_layers=3)
    _, other = tiny(n_layers=2)
    with pytest.raises(ValueError, match="n_layers=2"):
        attribution_graph(model, torch.tensor(PROMPT), other)
    _, narrow = tiny(d_model=16)
    with pytest.raises(ValueError, match="d_model"):
        attribution_graph(model, torch.tensor(PROMPT), narrow)


@pytest.mark.parametrize("change, words", [(dict(norm_position="post"), "norm_position='post'"),
                                           (dict(parallel_residual=True), "parallel_residual"),
                                           (dict(final_logit_softcap=30.0), "final_logit_softcap")])
def test_models_the_replacement_cannot_freeze_are_refused(change, words):
    config = anatomy.ModelConfig(arch="decoder", vocab_size=61, d_model=24, n_heads=4, n_layers=3, d_ff=48,
                                 max_seq_len=32, **change)
    model = anatomy.build_model(config, seed=0).eval()
    _, transcoders = tiny()
    with pytest.raises(ValueError, match=words):
        attribution_graph(model, torch.tensor(PROMPT), transcoders)


@pytest.mark.parametrize("option, value", [("max_logits", 0), ("logit_probability", 1.5), ("max_feature_nodes", -3)])
def test_bad_options_are_refused(option, value):
    model, transcoders = tiny()
    with pytest.raises(ValueError, match=option):
        attribution_graph(model, torch.tensor(PROMPT), transcoders, **{option: value})


def test_a_graph_too_large_for_the_memory_is_refused_before_it_is_made():
    model, transcoders = tiny()
    with pytest.raises(ValueError, match="needs .* GiB, and .* GiB is the budget"):
        attribution_graph(model, torch.tensor(PROMPT), transcoders, max_bytes=10_000)
