"""Circuit discovery on every decoder family anatomy opens, and on a BERT-style classifier: the identities that
make its numbers mean what they say.

- What the sources write makes up the residual stream (a head through a sandwich or post-sublayer norm
  frozen at the run's scale, an MLP of experts as one node, a parallel block's two sublayers reading one
  stream); an edge run with nothing ablated is the clean run, with everything ablated the corrupted one.
- EAP is the first-order term of patching one edge (a central difference of the exact path patching, scaled
  down, in float64): the gradients at each reader's own input (q, k, v through the attention's norm or none;
  the MLP's own copy of the stream) are right.
- AtP is the first-order term of patching one node, on every family and on an encoder classifier whose metric
  reads its label logits; AtP* runs; what cannot be done is refused in one line (a post-norm model's edges, an
  expert layer's neurons).
"""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.checkpoints.registry import ARCHITECTURES
from anatomy.circuits.discovery.edges import attribute_edges, top_edges
from anatomy.circuits.discovery.nodes import attribute_nodes
from anatomy.circuits.discovery.paths import run_ablated
from anatomy.circuits.discovery.residual import ResidualGraph
from anatomy.circuits.discovery.tasks import Task, make_task
from anatomy.circuits.discovery.verify import verify_nodes
from anatomy.trace import trace
from family_models import FAMILIES, VOCAB, family_model
from test_discovery import metric_with_head_moved, nothing_and_everything_ablated

EDGE_FAMILIES = [family for family in FAMILIES if family != "opt-post"]


def task_for(vocab: int, n: int = 4, length: int = 7, seed: int = 0, labels: bool = False) -> Task:
    """n random clean prompts, each corrupted at positions 1..3; answers and wrongs random tokens (or labels 1, 0)."""
    generator = torch.Generator().manual_seed(seed)
    clean = torch.randint(3, vocab, (n, length), generator=generator)
    corrupt = clean.clone()
    corrupt[:, 1:4] = torch.randint(3, vocab, (n, 3), generator=generator)
    lengths = torch.tensor([length, length - 1, length, length - 2][:n])
    if labels:
        return Task("labels", clean, corrupt, lengths, torch.ones(n, 1, dtype=torch.long), torch.zeros(n, 1, dtype=torch.long))
    return Task("toy", clean, corrupt, lengths, torch.randint(3, vocab, (n, 1), generator=generator),
                torch.randint(3, vocab, (n, 1), generator=generator))


def metric_of(model, task: Task, logits: torch.Tensor) -> float:
    return task.score(logits, range(len(task))).double().mean().item()


@pytest.mark.parametrize("family", EDGE_FAMILIES)
def test_edge_runs_nothing_ablated_is_clean_everything_is_corrupt(family):
    model, task = family_model(family).double(), task_for(VOCAB)
    (nothing, everything), clean_logits, corrupt_logits = nothing_and_everything_ablated(model, task)
    scale = float(corrupt_logits.abs().max())
    assert (clean_logits - corrupt_logits).abs().max() > 0.1 * scale  # the two runs differ
    assert (nothing - clean_logits).abs().max() < 1e-10 * scale
    assert (everything - corrupt_logits).abs().max() < 1e-10 * scale


@pytest.mark.parametrize("family", EDGE_FAMILIES)
def test_what_the_sources_write_differs_between_runs_as_the_residual_stream_does(family):
    """sum_u (out_u(clean) - out_u(corrupt)) = resid(clean) - resid(corrupt) at the last block's output: the
    sources are what the stream is made of (the biases, the same in both runs, cancel). A head's write through
    a sandwich or post-sublayer norm counts the norm's frozen scale; its output alone would not add up."""
    model, task = family_model(family).double(), task_for(VOCAB)
    graph = ResidualGraph(model)
    clean, corrupt = task.inputs(range(len(task)))
    last = f"blocks.{model.config.n_layers - 1}.resid_post"
    residuals = []
    for batch in (clean, corrupt):
        with torch.no_grad(), trace(model, [last]) as t:
            batch.last_logits(model)
        residuals.append(t[last])
    written = graph.source_values(model, clean).sum(0) - graph.source_values(model, corrupt).sum(0)  # (B, T, E)
    difference = residuals[0] - residuals[1]
    assert difference.abs().max() > 0.1
    assert (written - difference).abs().max() < 1e-10 * difference.abs().max()


@pytest.mark.parametrize("family", EDGE_FAMILIES)
def test_eap_is_the_first_order_term_of_patching_an_edge(family):
    """score(u -> v) = -d/de m(clean | in_v += e (a_u - cur_u)) at e = 0, for the strongest edges and one edge
    into an MLP's own input and one into a query (central difference in float64: its error is O(e^2))."""
    model, task = family_model(family).double(), task_for(VOCAB)
    result = attribute_edges(model, task, method="eap")
    graph = result.extra["graph"]
    clean, corrupt = task.inputs(range(len(task)))
    clean_out, corrupt_out = graph.source_values(model, clean), graph.source_values(model, corrupt)
    chosen = [(u, v) for u, v, _ in top_edges(result, 3)]
    for kind in ("mlp", "q"):
        v = next(i for i, node in enumerate(graph.destinations) if node.kind == kind and node.layer == 1)
        chosen.append((int(result.values[:, v].abs().argmax()), v))
    epsilon = 1e-5
    for u, v in chosen:
        ablated = torch.zeros(1, *graph.allowed.shape, dtype=torch.bool)
        ablated[0, u, v] = True
        moved = [metric_of(model, task, run_ablated(model, graph, clean, clean_out + e * (corrupt_out - clean_out), ablated))
                 for e in (epsilon, -epsilon)]
        slope = (moved[0] - moved[1]) / (2 * epsilon)
        score = float(result.values[u, v])
        assert abs(score + slope) <= 1e-7 * max(1.0, abs(slope)), (graph.edge_name(u, v), score, -slope)


def assert_atp_is_first_order(model, task):
    atp = attribute_nodes(model, task, kind="heads", method="atp").values
    epsilon = 1e-5
    for layer, head in [(0, 1), (1, 2), (model.config.n_layers - 1, 0)]:
        slope = (metric_with_head_moved(model, task, layer, head, epsilon)
                 - metric_with_head_moved(model, task, layer, head, -epsilon)) / (2 * epsilon)
        assert abs(atp[layer, head].item() + slope) <= 1e-7 * max(1.0, abs(slope)), (layer, head)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_node_attribution_on_every_family(family):
    model, task = family_model(family).double(), task_for(VOCAB)
    assert_atp_is_first_order(model, task)
    for kind in ("q", "mlp"):
        star = attribute_nodes(model, task, kind=kind, method="atp*").values
        assert torch.isfinite(star).all() and (star >= 0).all() and star.abs().max() > 0


def test_an_expert_layer_is_one_node_and_its_neurons_are_refused():
    model, task = family_model("mixtral"), task_for(VOCAB)
    assert attribute_nodes(model, task, kind="mlp").values.shape == (3,)
    with pytest.raises(ValueError, match="an expert layer is one node, kind='mlp'"):
        attribute_nodes(model, task, kind="neurons")


def test_a_post_norm_models_edges_are_refused_in_words_and_its_nodes_are_not():
    model = family_model("opt-post")
    with pytest.raises(ValueError, match=r"post-norm block \(norm_position='post'\) renormalises it"):
        ResidualGraph(model)


# ---- a BERT-style classifier: the metric on its label logits ------------------------------------------

def classifier(seed: int = 0):
    """A tiny random BertForSequenceClassification (2 layers, hidden 32, 2 labels), as anatomy reads its config."""
    hf = dict(model_type="bert", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=37, max_position_embeddings=32, type_vocab_size=2, num_labels=2)
    config = ARCHITECTURES["bert"].to_config(hf, "BertForSequenceClassification", set())
    model = anatomy.build_model(config, seed=seed).double().eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(1 + 0.2 * noise if name.endswith("norm.weight") else 0.3 * noise)
    return model


def test_a_classifiers_nodes_are_attributed_on_its_label_logits_and_verified_exactly():
    model, task = classifier(), task_for(VOCAB, labels=True)
    with torch.no_grad():
        clean, _ = task.inputs(range(len(task)))
        labels = model(clean.target.ids, padding_mask=clean.target.padding_mask).logits  # (B, 2)
    assert torch.allclose(task.score(clean.last_logits(model)[:, 0], range(len(task))), labels[:, 1] - labels[:, 0])
    assert_atp_is_first_order(model, task)
    mlp = attribute_nodes(model, task, kind="mlp", method="atp")
    check = verify_nodes(model, task, mlp, k=2)
    assert check.values.shape == (2, 2) and torch.isfinite(check.values).all()
    star = attribute_nodes(model, task, kind="k", method="atp*")  # the QK fix: an encoder attends both ways
    assert torch.isfinite(star.values).all()
    with pytest.raises(ValueError, match="edge attribution needs a decoder with an LM head"):
        ResidualGraph(model)


def test_a_classifiers_task_from_texts_takes_labels_as_answers():
    toy = anatomy.from_pretrained("toy-encoder")
    model = anatomy.build_model(toy.config.replace(head="sequence-classification", num_labels=2), seed=0).eval()
    model.tokenizer = toy.tokenizer
    pairs = [{"clean": "Hello World, this", "corrupt": "Hello World, is", "answer": "LABEL_1", "wrong": 0}]
    task = make_task(model, "sentiment", pairs)
    assert task.clean[0].tolist() == toy.tokenizer.encode("Hello World, this")  # the whole template
    assert (task.answers[0, 0], task.wrongs[0, 0]) == (1, 0)
    with pytest.raises(ValueError, match=r"pair 0: answer 'positive' is not a label of this classifier; allowed: 0 to 1"):
        make_task(model, "sentiment", [dict(pairs[0], answer="positive")])
