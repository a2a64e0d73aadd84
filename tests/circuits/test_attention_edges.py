"""Attention explained wherever a graph goes: the strongest attention-mediated edges split by head (the parts and
their position pairs add up to the edge), each head's score explained (the identity holds), one record in the
graph's meta that the safetensors file keeps and Neuronpedia's JSON carries as qk_tracing_results, valid against
its schema, every contributor resolving to a node or to qk_only_nodes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
import torch

import anatomy
from anatomy.circuits import load_graph, pruned, save
from anatomy.circuits.attention_edges import attention_mediated, explain_attention
from anatomy.circuits.attribute import attribution_graph
from anatomy.circuits.neuronpedia import neuronpedia_json
from anatomy.sae import load_transcoders

FIXTURES = Path(__file__).parent / "fixtures"
SCHEMA = json.loads((FIXTURES / "neuronpedia" / "graph-schema.json").read_text())
PROMPT = json.loads((FIXTURES / "graphs" / "README.json").read_text())["prompt"]


@pytest.fixture(scope="module")
def explained():
    return explained_graph()


def explained_graph():
    """(model, transcoders, the pruned graph of the fixture Llama through the skip set, its 6 strongest
    attention-mediated edges explained)."""
    model = anatomy.from_pretrained(str(FIXTURES / "graphs" / "llama")).eval()
    transcoders = load_transcoders(FIXTURES / "graphs" / "plt_relu_skip")
    graph = pruned(attribution_graph(model, PROMPT, transcoders))
    edges = explain_attention(model, transcoders, graph, n=6)
    return model, transcoders, graph, edges


def test_the_strongest_edges_across_positions_are_chosen():
    model = anatomy.from_pretrained(str(FIXTURES / "graphs" / "llama")).eval()
    graph = attribution_graph(model, PROMPT, load_transcoders(FIXTURES / "graphs" / "plt_jumprelu"))
    chosen = attention_mediated(graph, 5)
    weights = [abs(float(graph.adjacency[graph.index(t), graph.index(s)])) for t, s in chosen]
    assert all(s.column < t.column for t, s in chosen) and weights == sorted(weights, reverse=True)
    across = [abs(w) for t, s, w in graph.edges() if graph.nodes[s].column < graph.nodes[t].column]
    assert weights[0] == max(across)


def test_a_reader_chooses_the_nodes_whose_edges_are_explained(explained):
    model, transcoders, graph, edges = explained
    target = edges[0].split.target
    copy = dataclasses.replace(graph, meta=dict(graph.meta))  # the fixture's record stays
    again = explain_attention(model, transcoders, copy, n=3, nodes=[target.id])
    assert again and all(target in (e.split.target, e.split.source) for e in again)
    assert again[0].split.parts.keys() == edges[0].split.parts.keys()  # the same edge, the same split
    assert all(v == pytest.approx(edges[0].split.parts[k], rel=1e-5, abs=1e-6) for k, v in again[0].split.parts.items())


def test_every_edge_is_its_heads_and_every_head_its_position_pairs(explained):
    _, _, graph, edges = explained
    assert len(edges) == 6
    for edge in edges:
        split = edge.split
        assert split.error < 1e-5, split.check
        assert abs(sum(split.parts.values()) - split.edge) < 1e-4 * max(1.0, abs(split.edge))
        assert "residual" not in split.parts  # the source sits before the target: only heads move it
        for (layer, head), part in split.heads():
            pairs = split.positions(layer, head)
            assert abs(sum(v for _, v in pairs) - part) < 1e-5 * max(1.0, abs(part))
            assert all(key == split.source.column and key <= query <= split.target.column for (query, key), _ in pairs)
        assert 1 <= len(edge.qk) <= 3
        for (layer, head), qk in edge.qk.items():
            assert qk.error < 1e-5, qk.check
            assert (qk.query, qk.key) == split.positions(layer, head)[0][0]


def test_the_record_survives_the_safetensors_file_and_names_every_contributor(explained, tmp_path):
    _, _, graph, _ = explained
    record = graph.meta["attention"]
    assert record["error"] < 1e-5 and len(record["edges"]) == 6
    for qk in record["qk"]:
        for q, k, _ in qk["pairs"]:
            assert q in record["nodes"] and k in record["nodes"]
        total = qk["pair_total"] + sum(qk["no_node"].values())
        assert abs(total - qk["score"]) < 1e-5 * max(1.0, abs(qk["score"]))
    again = load_graph(save(graph, tmp_path / "g.safetensors"))
    assert again.meta["attention"] == json.loads(json.dumps(record))


def test_neuronpedias_json_carries_qk_tracing_results_valid_against_its_schema(explained):
    _, _, graph, _ = explained
    data = neuronpedia_json(graph, slug="qk")
    jsonschema.validate(data, SCHEMA)
    traced = [node for node in data["nodes"] if "qk_tracing_results" in node]
    targets = {e["target"] for e in graph.meta["attention"]["edges"]}
    assert len(traced) == len(targets)
    known = {node["node_id"] for node in data["nodes"]} | set(data.get("qk_only_nodes", {}))
    for node in traced:
        results = node["qk_tracing_results"]
        assert results["pair_wise_contributors"] and results["top_q_marginal_contributors"]
        for q, k, _ in results["pair_wise_contributors"]:
            assert q in known and k in known
        for i, _ in results["top_q_marginal_contributors"] + results["top_k_marginal_contributors"]:
            assert i in known
    strongest = max(graph.meta["attention"]["edges"], key=lambda e: abs(e["edge"]))
    qk = graph.meta["attention"]["qk"][strongest["heads"][0]["qk"]]
    record = data["nodes"][graph.index(strongest["target"])]  # the records are in the graph's node order
    assert [v for *_, v in record["qk_tracing_results"]["pair_wise_contributors"]] == [v for *_, v in qk["pairs"]]


def test_contributors_pruned_out_are_described_in_qk_only_nodes():
    model = anatomy.from_pretrained(str(FIXTURES / "graphs" / "llama")).eval()
    transcoders = load_transcoders(FIXTURES / "graphs" / "plt_relu_skip")
    graph = pruned(attribution_graph(model, PROMPT, transcoders), 0.8, 0.9)  # with its skips, some contributors are out
    explain_attention(model, transcoders, graph, n=10)
    data = neuronpedia_json(graph, slug="qk-only")
    jsonschema.validate(data, SCHEMA)
    only = data["qk_only_nodes"]
    kinds = {entry["feature_type"] for entry in only.values()}
    assert kinds == {"mlp reconstruction error", "cross layer transcoder"}, kinds
    assert not set(only) & {node["node_id"] for node in data["nodes"]}


def test_bad_requests_are_refused_in_words(explained):
    model, transcoders, graph, _ = explained
    with pytest.raises(ValueError, match="n must be a positive integer"):
        explain_attention(model, transcoders, graph, n=-1)
    with pytest.raises(ValueError, match="heads must be a positive integer"):
        explain_attention(model, transcoders, graph, heads=0)
    token = next(node for node in graph.nodes if node.kind == "token")
    with pytest.raises(ValueError, match="not a token"):
        explain_attention(model, transcoders, graph, edges=[(token, token)])
    with pytest.raises(KeyError):
        explain_attention(model, transcoders, graph, edges=[("feature:0:0:999", token)])


def test_the_command_writes_the_attention_to_every_output(tmp_path, capsys):
    from anatomy.cli import main

    base = ["circuits", PROMPT, "--model", str(FIXTURES / "graphs" / "llama"), "--transcoders",
            str(FIXTURES / "graphs" / "plt_jumprelu"), "--threads", "1"]
    outputs = [str(tmp_path / name) for name in ("g.html", "g.json", "g.safetensors")]
    assert main(base + ["--qk", "4", "--out", *outputs]) == 0
    printed = capsys.readouterr().out
    assert "4 edges across positions split by head" in printed and all(len(line) <= 80 for line in printed.splitlines())
    record = load_graph(tmp_path / "g.safetensors").meta["attention"]
    assert len(record["edges"]) == 4 and record["error"] < 1e-5
    assert any("qk_tracing_results" in node for node in json.loads((tmp_path / "g.json").read_text())["nodes"])
    assert '"attention"' in (tmp_path / "g.html").read_text()
    assert main(base + ["--qk", "0", "--out", str(tmp_path / "none.safetensors"), "--quiet"]) == 0
    assert "attention" not in load_graph(tmp_path / "none.safetensors").meta


def test_a_bad_qk_is_one_line_before_loading(tmp_path, capsys):
    from cli_status import status

    assert status(["circuits", PROMPT, "--transcoders", "x", "--out", str(tmp_path / "g.html"), "--qk", "-2"]) == 2
    error = capsys.readouterr().err
    assert "--qk" in error and len(error.strip().splitlines()) == 1


def test_the_bench_times_the_attention_beyond_the_graph(monkeypatch, tmp_path):
    import contextlib
    import io
    import re

    from anatomy.cli import main

    monkeypatch.delenv("ANATOMY_CIRCUIT_TRACER_PYTHON", raising=False)
    monkeypatch.setenv("ANATOMY_CACHE", str(tmp_path))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "--quick", "--only", "circuits"]) == 0
    row = re.search(r"^\| circuits: why attention attends: the (\d+) strongest .* beyond the graph \| s \| ([0-9.]+) .*"
                    r"goal 10 s; (\d+) heads' scores .* at most ([0-9.e-]+) of the terms' sizes", out.getvalue(), re.M)
    assert row, out.getvalue()
    assert int(row[1]) == 20 and int(row[3]) > 0 and float(row[4]) < 1e-5



def test_a_post_norm_models_edges_are_refused_in_words_its_heads_scores_are_not():
    from family_models import PROMPT as IDS
    from family_models import family_model, family_transcoders

    from anatomy.circuits import qk_attribution

    model = family_model("opt-post")
    transcoders = family_transcoders(model, "resid_mid", "mlp.out")
    graph = attribution_graph(model, torch.tensor(IDS), transcoders)
    with pytest.raises(ValueError, match="post-norm model does not split by heads"):
        explain_attention(model, transcoders, graph)
    assert qk_attribution(model, transcoders, torch.tensor(IDS), 2, 1, 5, 3).error < 1e-5
