"""Circuit discovery's identities: AtP is the first-order term of patching and equals it where patching
is linear; EAP-IG at one step is EAP; an edge run with nothing ablated is the clean run and with
everything ablated the corrupted one; a circuit of every edge recovers the whole gap; bad input is
refused in one line before any computation."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.circuits.discovery.edges import attribute_edges, top_edges
from anatomy.circuits.discovery.faithfulness import faithfulness
from anatomy.circuits.discovery.nodes import attribute_nodes
from anatomy.circuits.discovery.paths import run_ablated
from anatomy.circuits.discovery.residual import ResidualGraph
from anatomy.circuits.discovery.tasks import Task, make_task
from anatomy.circuits.discovery.verify import spearman, verify_edges, verify_nodes
from anatomy.trace import trace


def tiny(final_norm: bool = True, n_layers: int = 2, parallel: bool = False, seed: int = 0, qk_norm: str = "none"):
    """A small Llama-shaped decoder in float64 (LayerNorm: RMSNorm computes in float32 whatever the dtype)."""
    config = anatomy.ModelConfig(
        arch="decoder", vocab_size=40, d_model=16, n_heads=4, n_kv_heads=2, n_layers=n_layers, d_ff=32,
        max_seq_len=32, pos_encoding="rotary", norm="layernorm", activation="swiglu", final_norm=final_norm,
        parallel_residual=parallel, qk_norm=qk_norm)
    return anatomy.build_model(config, seed=seed).double().eval()


def toy_task(n: int = 6, seed: int = 0) -> Task:
    generator = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, 40, (n, 7), generator=generator)
    corrupt = clean.clone()
    corrupt[:, 1:4] = torch.randint(0, 40, (n, 3), generator=generator)
    lengths = torch.tensor([7, 6, 7, 5, 7, 7][:n])
    return Task("toy", clean, corrupt, lengths, torch.randint(0, 40, (n, 1), generator=generator),
                torch.randint(0, 40, (n, 1), generator=generator))


def metric_with_head_moved(model, task: Task, layer: int, head: int, epsilon: float) -> float:
    """mean m(clean | z_head := z_clean + epsilon (z_corrupt - z_clean))."""
    clean, corrupt = task.inputs(range(len(task)))
    point = f"blocks.{layer}.attn.z"
    with torch.no_grad(), trace(model, [point]) as t:
        corrupt.last_logits(model)
    corrupt_z = t[point]

    def move(z):
        z = z.clone()
        z[:, :, head] += epsilon * (corrupt_z[:, :, head] - z[:, :, head])
        return z

    with torch.no_grad(), trace(model, [], interventions={point: move}):
        return task.score(clean.last_logits(model)[:, 0], range(len(task))).mean().item()


def test_atp_is_the_first_order_term_of_patching():
    """AtP(n) = -d/de m(clean | n := clean + e (corrupt - clean)) at e = 0, against a central difference
    in float64 (its error is O(e^2)): a wrong sign, run or gradient point fails it."""
    model, task = tiny(), toy_task()
    atp = attribute_nodes(model, task, kind="heads", method="atp").values
    epsilon = 1e-5
    for layer, head in [(0, 1), (1, 2), (1, 0)]:
        slope = (metric_with_head_moved(model, task, layer, head, epsilon)
                 - metric_with_head_moved(model, task, layer, head, -epsilon)) / (2 * epsilon)
        assert abs(atp[layer, head].item() + slope) <= 1e-6 * max(1.0, abs(slope))


def test_atp_equals_exact_patching_where_patching_is_linear():
    """With no final norm, the last MLP's output reaches the logit difference linearly, and so do the last
    layer's heads once that MLP writes nothing: AtP is exact there. The same comparison with the final
    norm on misses, so the test can fail."""
    task = toy_task()
    for kind in ("heads", "mlp"):
        linear = tiny(final_norm=False, n_layers=1)
        if kind == "heads":
            torch.nn.init.zeros_(linear.blocks[0].mlp.fc_out.weight)  # the heads' only path is then linear
        result = attribute_nodes(linear, task, kind=kind, method="atp")
        check = verify_nodes(linear, task, result, k=result.values.numel())
        approx, exact = check.values
        assert (approx - exact).abs().max() <= 1e-9 * exact.abs().max()
    normed = tiny(final_norm=True, n_layers=1)
    torch.nn.init.zeros_(normed.blocks[0].mlp.fc_out.weight)
    result = attribute_nodes(normed, task, kind="heads", method="atp")
    approx, exact = verify_nodes(normed, task, result, k=4).values
    assert (approx - exact).abs().max() > 1e-4 * exact.abs().max()


def test_eap_on_edges_into_the_logits_is_exact_where_linear():
    model, task = tiny(final_norm=False, n_layers=1), toy_task()
    result = attribute_edges(model, task, method="eap")
    checked = verify_edges(model, task, result, k=result.extra["graph"].edge_count)
    logits_edges = [i for i, name in enumerate(checked.labels["edges"]) if name.endswith("→ logits")]
    approx, exact = checked.values[:, logits_edges]
    assert len(logits_edges) == 6 and (approx - exact).abs().max() <= 1e-7 * exact.abs().max()


def test_eap_ig_converges_to_completeness():
    """(EAP and EAP-IG are each pinned to Hanna et al.'s formula in test_eap_ig_reference.py.)"""
    model, task = tiny(), toy_task()
    misses = []
    for steps in (8, 64):  # the Riemann sum's error shrinks as 1/steps: completeness, approached
        path = attribute_edges(model, task, method="eap-ig", steps=steps)
        misses.append(abs(path.values[0].sum().item() - path.extra["gap"]))  # the embeddings' row: IG of the input
    assert misses[1] < 0.25 * misses[0]


def test_chunking_does_not_change_the_scores():
    model, task = tiny(), toy_task()
    whole = attribute_edges(model, task, method="eap-ig", steps=2)
    chunked = attribute_edges(model, task, method="eap-ig", steps=2, max_bytes=1)
    assert (whole.values - chunked.values).abs().max() <= 1e-12


@pytest.mark.parametrize("parallel, qk_norm", [(False, "none"), (True, "none"), (False, "per_head")])
def test_edge_runs_nothing_ablated_is_clean_everything_is_corrupt(parallel, qk_norm):
    model, task = tiny(parallel=parallel, qk_norm=qk_norm), toy_task()
    (nothing, everything), clean_logits, corrupt_logits = nothing_and_everything_ablated(model, task)
    tolerance = 1e-12 if qk_norm == "none" else 1e-5  # q/k RMSNorms compute in float32
    assert (nothing - clean_logits).abs().max() < tolerance
    assert (everything - corrupt_logits).abs().max() < tolerance


def nothing_and_everything_ablated(model, task: Task):
    """((the last logits with no edge ablated, with every edge ablated), the clean run's, the corrupted run's)."""
    graph = ResidualGraph(model)
    clean, corrupt = task.inputs(range(len(task)))
    ablation = graph.source_values(model, corrupt)
    with torch.no_grad():
        clean_logits, corrupt_logits = clean.last_logits(model)[:, 0], corrupt.last_logits(model)[:, 0]
    shape = (1, *graph.allowed.shape)
    out = run_ablated(model, graph, clean, ablation, torch.cat([torch.zeros(shape, dtype=torch.bool),
                                                                torch.ones(shape, dtype=torch.bool)]))
    return out.split(len(task)), clean_logits, corrupt_logits


def test_edge_runs_agree_whichever_sum_they_take(monkeypatch):
    """The same edges ablated give the same logits summed over the ablated edges or as the running total
    minus the kept ones (each forced in turn)."""
    from anatomy.circuits.discovery import paths

    model, task = tiny(), toy_task()
    graph = ResidualGraph(model)
    clean, corrupt = task.inputs(range(len(task)))
    ablation = graph.source_values(model, corrupt)
    generator = torch.Generator().manual_seed(0)
    ablated = torch.rand(2, *graph.allowed.shape, generator=generator) < torch.tensor([0.2, 0.8])[:, None, None]

    def forced(sign):
        def plan(graph, columns, ablated):
            cut = ablated[:, :, columns]
            chosen = cut if sign > 0 else graph.allowed[:, columns][None] & ~cut
            return [(sign, chosen[c].any(dim=1).nonzero()[:, 0], chosen[c][chosen[c].any(dim=1)].float())
                    for c in range(cut.size(0))]
        return plan

    outputs = []
    for sign in (1.0, -1.0):
        monkeypatch.setattr(paths, "_plan", forced(sign))
        outputs.append(run_ablated(model, graph, clean, ablation, ablated))
    assert (outputs[0] - outputs[1]).abs().max() < 1e-12
    assert (outputs[0][:len(task)] - outputs[0][len(task):]).abs().max() > 1e-6  # the two copies differ


def test_faithfulness_of_every_edge_is_one_and_of_none_is_zero():
    model, task = tiny(), toy_task()
    result = attribute_edges(model, task, method="eap")
    count = result.extra["graph"].edge_count
    curve = faithfulness(model, task, result, sizes=[1, 2, 5, 10, 20, count])
    assert abs(curve.values[-1].item() - 1.0) < 1e-9
    values = curve.values.tolist()
    for target in sorted(set(values))[:-1]:  # the smallest circuit is the first size whose value reaches the target
        smallest = faithfulness(model, task, result, sizes=[1, 2, 5, 10, 20, count], target=target).extra["smallest"]
        assert smallest == [1, 2, 5, 10, 20, count][next(i for i, v in enumerate(values) if v >= target)]
    assert faithfulness(model, task, result, sizes=[1, 2], target=1.0 + 1e-6).extra["smallest"] is None
    mean = faithfulness(model, task, result, sizes=[count], ablation="mean")
    assert abs(mean.values[-1].item() - 1.0) < 1e-9


def test_spearman():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert spearman(a, a * 10) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    assert spearman(torch.tensor([1.0, 2.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])) == pytest.approx(0.9486833)


# ---- bad input: one line, before any computation -----------------------------------------------


@pytest.fixture(scope="module")
def toy():
    return anatomy.from_pretrained("toy")


def test_pairs_of_unequal_length_are_refused(toy):
    with pytest.raises(ValueError, match=r"pair 0: the clean prompt has 5 tokens, the corrupted 4"):
        make_task(toy, "t", [{"clean": "Hello World, this is", "corrupt": "Hello World, this", "answer": " is",
                              "wrong": " World"}])


def test_answers_of_several_tokens_are_refused(toy):
    with pytest.raises(ValueError, match=r"answer 'is this' is 2 tokens .* single tokens"):
        make_task(toy, "t", [{"clean": "Hello World, this", "corrupt": "Hello World, is", "answer": "is this",
                              "wrong": " World"}])


def test_a_metric_that_is_not_one_number_per_pair_is_refused(toy):
    pair = {"clean": "Hello World, this", "corrupt": "Hello World, is", "answer": " is", "wrong": " World"}
    with pytest.raises(ValueError, match=r"one number per pair .* returned \(\)"):
        make_task(toy, "t", [pair], metric=lambda logits, a, w: logits.sum())


def test_k_larger_than_the_count_is_refused():
    model, task = tiny(), toy_task()
    edges = attribute_edges(model, task, method="eap")
    with pytest.raises(ValueError, match=r"k=10000 edges: choose 1 to 82"):
        top_edges(edges, 10000)
    nodes = attribute_nodes(model, task, kind="heads")
    with pytest.raises(ValueError, match=r"k=9 nodes: choose 1 to 8"):
        verify_nodes(model, task, nodes, k=9)


def test_a_post_norm_model_has_no_residual_graph(toy):
    with pytest.raises(ValueError, match="post-norm block"):
        ResidualGraph(toy)


def test_name_mover_scores_sum_with_the_other_components_to_the_logit_difference():
    """Each head's direct effect on the logit difference, from direct logit attribution: the heads, the
    MLPs and the rest add up to m(clean) (the attribution's own identity, read through roles)."""
    from anatomy.analysis.decompose import direct_logit_attribution
    from anatomy.circuits.discovery.roles import head_roles, name_mover_scores

    model, task = tiny(), toy_task()
    movers = name_mover_scores(model, task, batch_size=4)
    clean, _ = task.inputs(range(len(task)))
    last, index = clean.target.last, torch.arange(len(task))
    attribution = direct_logit_attribution(model, clean, task.answers[:, 0])
    names = attribution.labels["component"]
    right = attribution.values[:, index, last]
    wrong = direct_logit_attribution(model, clean, task.wrongs[:, 0]).values[:, index, last]
    total = (right - wrong).sum(0).mean()
    assert abs(total.item() - task.score(clean.last_logits(model)[:, 0].detach(), range(len(task))).mean().item()) < 1e-9
    heads = (right - wrong)[[names.index(f"L{l}H{h}") for l in range(2) for h in range(4)]].mean(1).view(2, 4)
    assert torch.allclose(movers.values, heads)
    attention = movers.extra["attention"]
    assert ((attention >= 0) & (attention <= 1)).all()
    first = name_mover_scores(model, task, batch_size=4, pairs=3)  # the mean over the first 3 pairs only
    assert torch.allclose(first.values, (right - wrong)[[names.index(f"L{l}H{h}") for l in range(2) for h in range(4)]]
                          [:, :3].mean(1).view(2, 4))


def test_a_pair_whose_prompt_lacks_its_answer_gives_no_name_mover_attention():
    """Without the answer's token in the prompt there is nothing to attend to: 0, not the attention to
    position 0 (the sink) that the first-match search would otherwise point at."""
    from anatomy.circuits.discovery.roles import name_mover_scores

    task = toy_task()
    absent = Task("absent", task.clean.clamp(max=38), task.corrupt.clamp(max=38), task.lengths,
                  torch.full_like(task.answers, 39), task.wrongs)  # token 39 is in no prompt
    assert torch.equal(name_mover_scores(tiny(), absent, batch_size=4).extra["attention"],
                       torch.zeros(2, 4, dtype=torch.float64))



def test_each_head_gets_the_roles_its_scores_pass_strongest_first(monkeypatch):
    """Every head of the tiny model, with the threshold at the scores' 85th percentile (so that some pass and some
    do not): a head is named for each detector score that reaches it, and a name mover (negative when its
    direct effect is) when its attention to the answer does, the strongest first."""
    from anatomy.circuits.discovery import roles as roles_module

    model, task = tiny(), toy_task()
    heads = [(layer, head) for layer in range(2) for head in range(4)]
    first = roles_module.head_roles(model, task, heads, batch_size=4)
    everything = torch.cat([first["attention"].flatten()] + [v.flatten() for v in first["scores"].values()]).double()
    threshold = float(everything.quantile(0.85))
    monkeypatch.setattr(roles_module, "ROLE_THRESHOLD", threshold)
    found = roles_module.head_roles(model, task, heads, batch_size=4)
    named = 0
    for layer, head in heads:
        expected = [(float(found["scores"][kind][layer, head]), name) for kind, name in roles_module.DETECTOR_ROLES.items()
                    if float(found["scores"][kind][layer, head]) >= threshold]
        attention = float(found["attention"][layer, head])
        if attention >= threshold:
            mover = "name mover" if float(found["direct"][layer, head]) > 0 else "negative name mover"
            expected.append((attention, mover))
        assert found["roles"][(layer, head)] == [name for _, name in sorted(expected, reverse=True)], (layer, head)
        named += bool(expected)
    assert 0 < named < len(heads)  # some heads named, some not: the rule is exercised both ways


@pytest.mark.parametrize("qk_norm", ["none", "per_head", "across_heads"])
def test_reader_gradients_split_the_residual_gradient_among_the_readers(qk_norm):
    """d m / d resid_pre = the sum over the layer's q, k, v inputs of their own gradients + d m / d resid_mid:
    the per-head gradients (linear path without q/k norms, through the module with them) lose nothing."""
    config = anatomy.ModelConfig(arch="decoder", vocab_size=40, d_model=16, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=32,
                                 max_seq_len=32, pos_encoding="rotary", norm="layernorm", activation="swiglu",
                                 qk_norm=qk_norm)
    model = anatomy.build_model(config, seed=1).double().eval()
    task = toy_task()
    graph = ResidualGraph(model)
    clean, _ = task.inputs(range(len(task)))
    score = lambda logits: task.score(logits, range(len(task)))  # noqa: E731
    _, gradients, _ = graph.reader_gradients(model, clean, score)
    with torch.enable_grad(), trace(model, ["blocks.1.resid_pre", "blocks.1.resid_mid"], grad=True) as t:
        total = score(clean.last_logits(model)[:, 0]).sum()
        pre, mid = torch.autograd.grad(total, [t["blocks.1.resid_pre"], t["blocks.1.resid_mid"]])
    readers = [i for i in graph.layer_destinations(1) if graph.destinations[i].kind in ("q", "k", "v")]
    # the q/k norms are RMSNorms, which compute in float32 whatever the dtype: 1e-6 of the gradient's size
    tolerance = 1e-12 if qk_norm == "none" else 1e-6 * pre.abs().max()
    assert (gradients[readers].sum(0) + mid - pre).abs().max() < tolerance


def test_atp_on_sae_features_is_exact_where_their_path_is_linear():
    """An SAE on the last residual of a model with no final norm: a feature reaches the logits through the
    decoder alone, linearly, so its AtP equals patching it exactly (analysis.patching.patch_cells)."""
    from anatomy.analysis.patching import patch_cells
    from anatomy.sae import SAE

    model, task = tiny(final_norm=False, n_layers=1), toy_task()
    sae = SAE(16, 24, kind="relu", point="blocks.0.resid_post", dtype=torch.float64, seed=2)
    result = attribute_nodes(model, task, kind="features", sae=sae)
    assert result.axes == ("feature",) and result.values.shape == (24,)
    order = result.values.abs().argsort(descending=True)[:5].tolist()
    clean, corrupt = task.inputs(range(len(task)))
    point = "blocks.0.resid_post.sae.features"
    metric = lambda logits: task.score(logits[:, -1], range(len(task)))  # noqa: E731
    with torch.no_grad(), trace(model, [], saes={sae.point: sae}):
        base = metric(clean.last_logits(model)).mean()
    patched = patch_cells(model, corrupt, clean, [(point, 2, f) for f in order], metric, saes={sae.point: sae})
    exact = base - patched
    assert (result.values[order] - exact).abs().max() <= 1e-9 * exact.abs().max()


def test_head_weights_and_the_figure(tmp_path):
    """A head's weight in a circuit is the |score| of the kept edges at it: an edge between two heads counts
    for both; the figure is written."""
    pytest.importorskip("matplotlib")
    from anatomy.circuits.discovery.faithfulness import kept_masks
    from anatomy.circuits.discovery.figures import head_weights, plot_discovery

    model, task = tiny(), toy_task()
    edges = attribute_edges(model, task, method="eap")
    graph = edges.extra["graph"]
    kept = kept_masks(graph, edges, [10])[0]
    weights = head_weights(graph, edges.values, kept)
    at_heads = edges.values.abs() * kept
    sources = [u for u, node in enumerate(graph.sources) if node.kind == "head"]
    inputs = [v for v, node in enumerate(graph.destinations) if node.kind in ("q", "k", "v")]
    assert sum(weights.values()) == pytest.approx(float(at_heads[sources].sum() + at_heads[:, inputs].sum()))
    curve = faithfulness(model, task, edges, sizes=[1, 10, graph.edge_count])
    heads = [(f"L{l}H{h}", w, "induction") for (l, h), w in sorted(weights.items(), key=lambda item: -item[1])]
    assert plot_discovery(curve, heads, "toy", tmp_path / "figure.png").stat().st_size > 10_000


def test_a_task_prints_what_it_holds_not_its_tensors():
    task = toy_task()
    assert repr(task) == "Task('toy', 6 pairs of 5–7 tokens, metric logit_difference)"
    assert "tensor" not in str(task)
