"""A capped graph computes only the rows it keeps, chosen as circuit-tracer chooses them, and checks itself; a
pruned graph states its own check; the memory is said before anything large is made; nothing is made off the
model's device.

The whole graph (every row, tested against the frozen model in test_attribute.py) is the reference: a capped
graph's rows must be its rows on the kept nodes, and its choice the one circuit-tracer's rule makes when it is
replayed on the whole graph's rows (written out below, from circuit-tracer 0.5's `attribute`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from device_check import off_the_models_device
from test_attribute import tiny

import anatomy
from anatomy.circuits.attention_edges import explain_attention
from anatomy.circuits.attribute import attribution_graph
from anatomy.circuits.cli import memory_size
from anatomy.circuits.features import promoted_tokens, top_contexts
from anatomy.circuits.footprint import plan
from anatomy.circuits.graph import OUTPUT_KINDS
from anatomy.circuits.heads import split_by_head
from anatomy.circuits.interventions import FeatureChange, intervene
from anatomy.circuits.prune import prune, pruned
from anatomy.circuits.rows import RowStore
from anatomy.sae import load_transcoders

LONG = [3, 17, 5, 29, 11, 8, 40, 2, 33, 21, 9, 14, 50, 7, 19, 26, 44, 1, 38, 12, 30, 6]  # 22 positions
FIXTURES = Path(__file__).parent / "fixtures" / "graphs"


def circuit_tracers_choice(graph, cap: int, batch_size: int, update_interval: int) -> set[str]:
    """The features circuit-tracer 0.5's attribute(max_feature_nodes=cap) keeps, replayed on every row of the
    whole graph: the logits' rows first; then, every update_interval batches, the features not yet taken ranked
    by their influence through the rows taken so far (its compute_partial_influences), taken in that order."""
    features = graph.mask("feature").nonzero().flatten()
    logits = graph.mask(*OUTPUT_KINDS).nonzero().flatten()
    taken = torch.zeros(len(features), dtype=torch.bool)
    order: list[torch.Tensor] = []
    while int(taken.sum()) < cap:
        rows = torch.cat([logits] + order)
        shares = graph.adjacency[rows].abs()
        shares /= shares.sum(dim=1, keepdim=True).clamp(min=1e-8)
        prod = torch.zeros(len(graph))
        prod[logits] = graph.output_weights[logits]
        influence = torch.zeros(len(graph))
        for _ in range(128):
            prod = prod[rows] @ shares
            if not prod.any():
                break
            influence += prod
        rank = torch.argsort(influence[features], descending=True, stable=True)
        queue = rank[~taken[rank]][:min(update_interval * batch_size, cap - int(taken.sum()))]
        for batch in queue.split(batch_size):
            order.append(features[batch])
            taken[batch] = True
    return {graph.nodes[i].id for i in features[taken].tolist()}


CASES = {"llama-like": {}, "cross-layer with a skip": dict(cross_layer=True, skip=True, kind="relu"),
         "LayerNorm and learned positions": dict(norm="layernorm", pos="learned", bias=True)}


@pytest.mark.parametrize("case", list(CASES))
def test_a_capped_graph_is_the_whole_graphs_rows_on_the_features_circuit_tracer_keeps(case):
    model, transcoders = tiny(**CASES[case], features=24)
    ids = torch.tensor(LONG)
    whole = attribution_graph(model, ids, transcoders)
    n_features = int(whole.mask("feature").sum())
    cap = n_features // 3
    capped = attribution_graph(model, ids, transcoders, max_feature_nodes=cap, batch_size=7, update_interval=2)
    assert cap > 2 * 7 * 2  # three rankings at least, each after update_interval batches of batch_size
    kept = {node.id for node in capped.nodes if node.kind == "feature"}
    assert kept == circuit_tracers_choice(whole, cap, 7, 2)
    order = torch.tensor([whole.index(node.id) for node in capped.nodes])
    assert (capped.adjacency - whole.adjacency[order][:, order]).abs().max() < 1e-5
    assert capped.error < 1e-5, capped.check


def test_a_capped_graph_checks_its_identity_on_the_rows_it_holds_and_names_what_it_dropped():
    model, transcoders = tiny(features=24)
    graph = attribution_graph(model, torch.tensor(LONG), transcoders, max_feature_nodes=40, batch_size=8)
    targets = ~graph.values.isnan()
    assert int(targets.sum()) == 40 + sum(node.kind == "logit" for node in graph.nodes)
    total = graph.adjacency[targets].double().sum(1) + graph.unexplained[targets].double()
    assert (total - graph.values[targets].double()).abs().max() < 1e-4
    dropped = graph.meta["features_active"] - 40
    assert f"the {dropped:,} features dropped hold " in graph.check
    held, dropped_share = (float(x.rstrip("%")) for x in
                           (graph.check.split("dropped hold ")[1].split(" ")[0], graph.check.split(" and ")[-1].split("%")[0]))
    assert 0 < held < 100 and 0 < dropped_share < 100
    assert graph.meta["dropped_features"] == dropped and round(100 * graph.meta["dropped_influence"], 1) == held
    assert pruned(graph).meta["dropped_features"] == dropped  # the page of the pruned graph can say it too
    # without what the dropped features carry, the kept edges alone would not add up
    whole = attribution_graph(model, torch.tensor(LONG), transcoders)
    rest = whole.unexplained[[whole.index(node.id) for node in graph.nodes]][targets].double()
    assert (graph.adjacency[targets].double().sum(1) + rest - graph.values[targets].double()).abs().max() > 1e-2


def test_rows_past_the_memory_budget_go_to_a_file_and_make_the_same_graph():
    model, transcoders = tiny(features=24)
    ids = torch.tensor(LONG)
    in_memory = attribution_graph(model, ids, transcoders, max_feature_nodes=40, batch_size=8)
    assert in_memory.meta["rows_on_file_bytes"] == 0
    needs = plan_of(model, transcoders, ids, 40)
    budget = needs.ranking + needs.working + needs.sources + needs.rows // 3  # at most a third of the rows in memory
    spilled = attribution_graph(model, ids, transcoders, max_feature_nodes=40, batch_size=8, max_bytes=budget)
    assert spilled.meta["rows_on_file_bytes"] > 0 and "in a temporary file" in spilled.meta["memory"]
    assert torch.equal(spilled.adjacency, in_memory.adjacency) and spilled.check == in_memory.check


@pytest.mark.parametrize("sweeps", ["as planned", "none"])
def test_a_capped_plan_gives_the_rows_what_fits_both_its_phases(sweeps, monkeypatch):
    """Making the rows (the sweeps' memory and the sources beside them) and assembling the matrix (beside them, once
    `freed` and the sources are let go): the rows in memory are the most that fit both, and nothing past the room.
    A toy's sweeps take more than its matrix; without them (a long prompt's case) the assembly is the larger."""
    from anatomy.circuits import footprint

    if sweeps == "none":
        monkeypatch.setattr(footprint, "working_bytes", lambda *args: 0)
        monkeypatch.setattr(footprint, "sources_bytes", lambda *args: 0)
    model, transcoders = tiny(features=24)
    where = needs_layout(model, transcoders, torch.tensor(LONG))
    whole = plan(where, model.config.d_model, 40, 32, 2**40)
    for room in range(whole.ranking + whole.working + whole.sources, whole.in_memory + whole.adjacency, 2_011):
        for freed in (0, whole.adjacency // 2, whole.adjacency + whole.sources):
            made = plan(where, model.config.d_model, 40, 32, room, freed=freed)
            held = min(made.rows, made.rows_in_memory)
            making = made.ranking + made.working + made.sources + held
            assembling = made.adjacency + made.ranking + held - freed
            assert made.in_memory == max(making, assembling)
            if held == 0 and made.in_memory > room:  # not even without rows: check_room refuses it
                continue
            assert made.in_memory <= room  # within the room in both phases
            assert held == made.rows or making + 1 > room or assembling + 1 > room  # one more byte would not be
            assert made.on_file == made.rows - held


def needs_layout(model, transcoders, ids):
    from anatomy.circuits.layout import layout
    from anatomy.circuits.replacement import Replacement
    from anatomy.circuits.vectors import read_features

    rep = Replacement(model, transcoders, ids)
    active, _ = read_features(rep)
    return layout(active, rep.n_layers, len(ids), 10)


def plan_of(model, transcoders, ids, cap):
    from anatomy.circuits.layout import layout
    from anatomy.circuits.replacement import Replacement
    from anatomy.circuits.vectors import read_features

    rep = Replacement(model, transcoders, ids)
    active, _ = read_features(rep)
    return plan(layout(active, rep.n_layers, len(ids), 10), model.config.d_model, cap, 8 * 4, 2**40)  # 4 batches a ranking


def test_the_memory_is_said_and_a_graph_past_it_refused_before_it_is_made():
    model, transcoders = tiny(features=24)
    ids = torch.tensor(LONG)
    graph = attribution_graph(model, ids, transcoders)
    targets = int((~graph.values.isnan()).sum())  # the rows written: the others' pages are never touched
    assert f"the adjacency {4 * targets * len(graph) / 2**20:.3g} MiB" in graph.meta["memory"]
    with pytest.raises(ValueError, match=r"capped at 40 features, 22 positions\) needs .* is the budget"):
        attribution_graph(model, ids, transcoders, max_feature_nodes=40, max_bytes=10_000)
    assert memory_size("8G") == 8 * 2**30 and memory_size("1.5GiB") == 3 * 2**29 and memory_size("512m") == 2**29


def test_the_row_store_gives_back_what_it_was_given_from_memory_and_file():
    rows = torch.randn(7, 30, generator=torch.Generator().manual_seed(0))
    widths = [30, 30, 5, 30, 1, 18, 18]  # runs of one width are kept as one chunk
    store = RowStore(memory_bytes=4 * 65)  # the first three rows in memory, the rest on file
    store.add(rows[:3], widths[:3])
    store.add(rows[3:], widths[3:])
    assert store.file_bytes == 4 * (30 + 1 + 18 + 18)
    expected = torch.stack([torch.cat([row[:w], torch.zeros(30 - w)]) for row, w in zip(rows, widths)])
    seen = torch.zeros(7, 30)
    for start, block in store.blocks():
        seen[start:start + len(block), :block.size(1)] = block
    assert torch.equal(seen, expected)
    widest = torch.zeros(7, 30)
    widths_seen = []
    for start, block in store.blocks(widest_first=True):
        widest[start:start + len(block), :block.size(1)] = block
        widths_seen.append(block.size(1))
    assert torch.equal(widest, expected) and widths_seen == [30, 30, 18, 5, 1]  # chunks: [30 30] [5] | [30] [1] [18 18]
    assert (store.total() - expected.sum(1)).abs().max() < 1e-5
    assert (store.absolute_total() - expected.abs().sum(1)).abs().max() < 1e-5
    store.close()


def test_the_rows_file_is_planned_between_its_bounds_and_a_full_disk_is_named(monkeypatch, tmp_path):
    import errno
    import shutil

    from anatomy.circuits import footprint
    from anatomy.circuits.layout import layout
    from anatomy.circuits.replacement import Replacement
    from anatomy.circuits.vectors import read_features

    model, transcoders = tiny(features=24)
    ids = torch.tensor(LONG)
    rep = Replacement(model, transcoders, ids)
    active, _ = read_features(rep)
    where = layout(active, rep.n_layers, len(ids), 10)
    widths = sorted(where.feature_start[layer] for layer in active.layer.tolist())  # each feature's row, by hand
    assert footprint.narrowest(where, 40) == sum(widths[:40]) and footprint.narrowest(where, 1) == len(ids)
    needs = plan(where, model.config.d_model, 40, 32, 2**40)
    assert needs.rows_least == 4 * (10 * where.logit_start + sum(widths[:40])) < needs.rows == 4 * 50 * where.logit_start
    fixed = needs.ranking + needs.working + needs.sources  # no room for a row in memory
    free = {"bytes": 0}
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: shutil._ntuple_diskusage(0, 0, free["bytes"]))
    free["bytes"] = needs.rows_least  # room for the least the rows write (none of them in memory), not the most
    made = footprint.check_room(where, model.config.d_model, 40, 32, fixed, torch.device("cpu"), folder=str(tmp_path))
    assert made.on_file_least == needs.rows_least and made.on_file > free["bytes"] and "up to " in made.describe()
    free["bytes"] = needs.rows_least - 1
    with pytest.raises(ValueError, match=f"need at least {footprint.size(needs.rows_least)} in a temporary file .* {tmp_path} has"):
        footprint.check_room(where, model.config.d_model, 40, 32, fixed, torch.device("cpu"), folder=str(tmp_path))

    class Full:  # a file on a disk that has filled
        def tell(self):
            return 2**30

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    store = RowStore(memory_bytes=0, folder=str(tmp_path))
    store.file = Full()
    with pytest.raises(OSError, match=f"filled {tmp_path} after 1.0 GiB written .No space left on device.") as raised:
        store.add(torch.ones(2, 5), [5, 5])
    assert raised.value.errno == errno.ENOSPC


def test_a_capped_graph_lets_go_of_the_frozen_pass_and_the_sources_before_its_assembly(monkeypatch):
    """Of a long prompt they are gigabytes, and the assembly's matrix comes on top of what is held then."""
    import gc

    import anatomy.circuits.attribute as attribute
    from anatomy.circuits.replacement import Replacement
    from anatomy.circuits.sweep import Sources

    model, transcoders = tiny(features=24)
    held = {}

    def assemble(*args):
        gc.collect()
        held["alive"] = [type(o).__name__ for o in gc.get_objects() if type(o) in (Replacement, Sources)]
        return original(*args)

    original = attribute.assemble
    monkeypatch.setattr(attribute, "assemble", assemble)
    graph = attribution_graph(model, torch.tensor(LONG), transcoders, max_feature_nodes=40, batch_size=8)
    assert held == {"alive": []} and graph.error < 1e-5


def test_a_pruned_graph_states_its_own_check():
    model, transcoders = tiny(features=24)
    graph = attribution_graph(model, torch.tensor(LONG), transcoders)
    decision = prune(graph, 0.6, 0.9)
    small = pruned(graph, 0.6, 0.9, decision=decision)
    assert small.check.startswith(f"pruned to {len(small):,} of {len(graph):,} nodes") and graph.check not in small.check
    kept_share = float(decision.influence[decision.node_mask].sum() / decision.influence.sum())
    assert f"holding {kept_share:.1%} of the influence" in small.check and kept_share < 0.99
    targets = ~small.values.isnan()
    total = small.adjacency[targets].double().sum(1) + small.unexplained[targets].double()
    assert (total - small.values[targets].double()).abs().max() < 1e-4 and small.error < 1e-5


def test_transcoders_held_in_bfloat16_are_read_in_float32():
    model, transcoders = tiny(features=24)
    rounded = transcoders.to(torch.bfloat16).float()  # the same values, held in float32
    held = transcoders.to(torch.bfloat16)
    ids = torch.tensor(LONG)
    reference, graph = attribution_graph(model, ids, rounded), attribution_graph(model, ids, held, max_feature_nodes=30)
    order = torch.tensor([reference.index(node.id) for node in graph.nodes])
    assert (graph.adjacency - reference.adjacency[order][:, order]).abs().max() < 1e-5
    assert graph.error < 1e-5, graph.check


def test_nothing_is_made_off_the_models_device():
    """The default device is set to meta while the model and the transcoders are on the CPU: a tensor made
    without the model's device is a meta tensor, and the first operation where it meets the model's raises (as a
    CPU tensor would meet a CUDA model's). What the command runs on the model's device runs here."""
    model = anatomy.from_pretrained(str(FIXTURES / "llama")).eval()
    transcoders = load_transcoders(FIXTURES / "clt_jumprelu")
    prompt = json.loads((FIXTURES / "README.json").read_text())["prompt"]
    with off_the_models_device():
        whole = attribution_graph(model, prompt, transcoders)
        capped = attribution_graph(model, prompt, transcoders, max_feature_nodes=20, batch_size=4)
    assert whole.adjacency.device.type == "cpu" and capped.adjacency.device.type == "cpu"
    small, shown = pruned(whole), pruned(capped)
    feature = next(node for node in small.nodes if node.kind == "feature")
    logit = next(node for node in small.nodes if node.kind == "logit")
    tokens = np.asarray(model.tokenizer.encode(prompt * 40, add_special_tokens=False), dtype=np.int64)
    with off_the_models_device():
        result = intervene(model, prompt, transcoders, [FeatureChange(feature.layer, feature.index, feature.column, value=0.0)],
                           freeze="all", graph=whole)
        split = split_by_head(model, transcoders, whole, logit, feature)
        details = top_contexts(model, transcoders, small, tokens, promoted_tokens(model, transcoders, small), context=16)
        explained = explain_attention(model, transcoders, shown, n=4)  # why a capped graph's attention attends
    assert abs(result.rows()[0]["direct"] - result.rows()[0]["change"]) < 1e-4 and split.error < 1e-5
    assert explained and all(edge.split.error < 1e-5 for edge in explained) and shown.meta["attention"]["qk"]
    assert details.promoted and details.contexts


def test_attentions_transpose_skips_only_the_keys_a_block_of_queries_cannot_see(monkeypatch):
    """Each block of keys is mixed from the queries at or after its first key (the causal mask): blocks of 4 keys
    give the graph one product over every key gives (a block that skipped a query that sees it would not)."""
    from anatomy.circuits import frozen

    model, transcoders = tiny(features=24)
    ids = torch.tensor(LONG)
    whole = attribution_graph(model, ids, transcoders)  # 22 positions: one block of KEY_BLOCK = 64 keys
    monkeypatch.setattr(frozen, "KEY_BLOCK", 4)
    blocked = attribution_graph(model, ids, transcoders)
    assert blocked.adjacency.abs().max() > 0.1
    assert (blocked.adjacency - whole.adjacency).abs().max() < 1e-5


def test_the_partial_influence_in_one_pass_is_circuit_tracers_series():
    """Rows over the nodes below their own (each row's node at or past its width), taken widest first in one pass:
    the influence circuit-tracer's power iteration sums (compute_partial_influences, written out here)."""
    from anatomy.circuits.capped import partial_influence

    generator = torch.Generator().manual_seed(3)
    N = 40
    nodes = torch.tensor([36, 37, 30, 31, 20, 33, 12, 25, 21, 8])  # two logits, then features in the order chosen
    widths = [36, 36, 20, 20, 12, 30, 5, 20, 12, 5]  # each row reaches the nodes below its layer
    weights = torch.tensor([0.7, 0.3] + [0.0] * 8)
    rows = torch.randn(10, N, generator=generator)
    for row, width in zip(rows, widths):
        row[width:] = 0
    store = RowStore(memory_bytes=4 * 100)  # part in memory, part on file
    for i in range(10):
        store.add(rows[i:i + 1], widths[i:i + 1])
    shares = rows.abs() / rows.abs().sum(1, keepdim=True).clamp(min=1e-8)
    prod, expected = torch.zeros(N), torch.zeros(N)
    prod[nodes] = weights
    for _ in range(128):
        prod = prod[nodes] @ shares
        if not prod.any():
            break
        expected += prod
    influence = partial_influence(store, nodes, weights, N)
    assert expected[nodes[2:]].min() > 0 and (influence - expected).abs().max() < 1e-6
    store.close()
