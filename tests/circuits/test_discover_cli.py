"""`anatomy circuits discover`: a circuit from a file of pairs on a pre-norm toy, written as the graph
page and as the Graph; every mistake is one line on stderr, exit status 2, before the model loads."""

from __future__ import annotations

import json
import re

import pytest

from anatomy.circuits import load_graph
from anatomy.cli import main
from cli_status import status

PAIRS = [{"clean": "Hello World, this is", "corrupt": "Hello World, is this", "answer": " Alejandro!", "wrong": " is"},
         {"clean": "Hello World, this", "corrupt": "Hello World, is", "answer": " is", "wrong": " this"}]



@pytest.fixture
def pairs_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(pair) for pair in PAIRS) + "\n", encoding="utf-8")
    return str(path)


def test_discover_writes_the_circuit(prenorm, pairs_file, tmp_path, capsys):
    html, graph = tmp_path / "circuit.html", tmp_path / "circuit.safetensors"
    assert main(["circuits", "discover", "--task", pairs_file, "--model", prenorm, "--steps", "2", "--verify", "5",
                 "--out", str(html)]) == 0
    out = capsys.readouterr().out
    assert "2 pairs kept" in out and "Spearman" in out and "curve" in out
    # redirected, each stage is said as it starts, before the summary: a log shows where a long run is
    stages = [line.split("] ", 1)[1] for line in out.splitlines() if line.startswith("[")]
    assert stages == ["loading the model …", "the task …", "scoring the edges …", "the faithfulness curve …",
                      "verifying …", "writing …"]
    assert out.index("writing …") < out.index("anatomy circuits discover ->")
    # every line in 80 columns but the title, which names the output file, whatever its length
    assert all(len(line) <= 80 for line in out.splitlines() if not line.startswith("anatomy circuits discover ->"))
    assert "view-graph" in html.read_text(encoding="utf-8")
    assert main(["circuits", "discover", "--task", pairs_file, "--model", prenorm, "--method", "eap", "--edges", "3",
                 "--out", str(graph), "--quiet"]) == 0
    circuit = load_graph(graph)
    assert circuit.kind == "circuit" and sum(1 for _ in circuit.edges()) == 3


@pytest.mark.parametrize("arguments, words", [
    (["--task", "poetry"], "'poetry' is not a task (allowed values: ioi"),
    (["--task", "ioi", "--steps", "0"], "0 is not a positive integer"),
    (["--task", "ioi", "--pairs", "1000000"], "1000000 pairs is more than 100000"),
    (["--task", "ioi", "--method", "acdc"], "--method acdc needs --threshold TAU"),
    (["--task", "ioi", "--method", "acdc", "--threshold", "0.1", "--verify", "5"], "acdc tests every edge exactly"),
    (["--task", "ioi", "--method", "acdc", "--threshold", "-1"], "-1 is negative"),
    (["--task", "ioi", "--method", "eap", "--threshold", "0.1"], "--threshold is for --method acdc, not eap"),
    (["--task", "ioi", "--method", "eap", "--outside", "3"], "--outside N samples edges outside the top K"),
    (["--task", "ioi", "--model", "toy"], "a post-norm block (norm_position='post') renormalises it"),
])
def test_mistakes_are_one_line(arguments, words, capsys):
    assert status(["circuits", "discover", *arguments]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


def test_a_pair_of_unequal_length_is_one_line(prenorm, tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({**PAIRS[0], "corrupt": "Hello World, this"}) + "\n", encoding="utf-8")
    assert main(["circuits", "discover", "--task", str(path), "--model", prenorm]) == 2
    err = capsys.readouterr().err
    assert "pair 0: the clean prompt has 5 tokens, the corrupted 4" in err and len(err.strip().splitlines()) == 1


def test_k_larger_than_the_edges_is_one_line(prenorm, pairs_file, capsys):
    assert main(["circuits", "discover", "--task", pairs_file, "--model", prenorm, "--verify", "100000"]) == 2
    assert "--verify 100000: choose 1 to" in capsys.readouterr().err


def test_the_methods_offered_are_the_librarys():
    from anatomy.circuits.discovery import acdc, choices, edges, generators, nodes

    assert (edges.METHODS, nodes.METHODS) == (choices.EDGE_METHODS, choices.NODE_METHODS)
    assert choices.CIRCUIT_METHODS == ("acdc",) and callable(acdc.acdc)
    assert set(nodes.KINDS) == set(choices.NODE_KINDS) and set(generators.TASKS) == set(choices.TASKS)


@pytest.mark.parametrize("method", ["eap", "eap-ig", "atp", "atp*", "ig"])
def test_every_method_of_the_library_runs_from_the_command_line(method, prenorm, pairs_file, tmp_path, capsys):
    from anatomy.circuits.discovery import edges, nodes

    assert method in edges.METHODS + nodes.METHODS
    out = tmp_path / ("circuit.html" if method.startswith("eap") else "nodes.html")
    assert main(["circuits", "discover", "--task", pairs_file, "--model", prenorm, "--method", method, "--verify", "2",
                 "--roles", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Spearman" in printed and out.stat().st_size > 1000
    roles = next(line for line in printed.splitlines() if line.startswith("  roles"))
    assert len(re.findall(r"L\dH\d", roles)) == 2  # the two strongest heads, each named by its roles or (none)
    if method.startswith("eap"):
        assert "curve" in printed
    else:
        assert "4 heads scored by " + method in printed and "strongest" in printed


@pytest.mark.parametrize("kind", ["q", "k", "v", "mlp", "neurons"])
def test_every_kind_of_node_is_scored(kind, prenorm, pairs_file, capsys):
    assert main(["circuits", "discover", "--task", pairs_file, "--model", prenorm, "--method", "atp", "--nodes", kind]) == 0
    strongest = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  strongest"))
    assert re.search(r"[+-]\d", strongest)


@pytest.mark.parametrize("arguments, words", [
    (["--method", "eap", "--steps", "3"], "--steps is for --method eap-ig and ig, not eap"),
    (["--method", "atp", "--edges", "3"], "--edges is for --method eap and eap-ig, not atp"),
    (["--method", "eap-ig", "--nodes", "mlp"], "--nodes is for --method atp and atp* and ig, not eap-ig"),
    (["--method", "atp", "--out", "x.safetensors"], "--method atp writes .html, .htm, .png, .svg"),
    (["--method", "atp", "--nodes", "mlp", "--roles", "3"], "--roles names heads"),
])
def test_an_option_of_another_method_is_refused_not_ignored(arguments, words, capsys):
    assert status(["circuits", "discover", "--task", "ioi", *arguments]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err


def test_acdc_from_the_command_line(prenorm, pairs_file, tmp_path, capsys):
    """ACDC prunes every edge and writes the circuit it keeps; its faithfulness is measured; the verified
    edges of EAP-IG include a sample outside the top K."""
    out = tmp_path / "acdc.safetensors"
    assert main(["circuits", "discover", "--task", pairs_file, "--model", prenorm, "--method", "acdc", "--threshold",
                 "0.001", "--distance", "task", "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # the summary's wrapped lines, joined
    kept = int(re.search(r"(\d+) edges recover", printed).group(1))
    assert "reverse topological order" in printed and f"{kept} of 46 edges kept" in printed
    assert sum(1 for _ in load_graph(out).edges()) == kept
    assert main(["circuits", "discover", "--task", pairs_file, "--model", prenorm, "--method", "eap", "--verify", "3",
                 "--outside", "4"]) == 0
    assert "outside the top 3, 4 sampled edges" in " ".join(capsys.readouterr().out.split())
