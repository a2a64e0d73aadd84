"""`anatomy circuits TEXT --model --transcoders --out ...` on the fixture Llama: the three outputs, interventions,
what it prints in 80 columns, `discover` handed on, and mistakes refused in one line before the model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anatomy.circuits import load_graph
from anatomy.cli import main
from cli_status import status

FIXTURES = Path(__file__).parent / "fixtures" / "graphs"
PROMPT = json.loads((FIXTURES / "README.json").read_text())["prompt"]
BASE = ["circuits", PROMPT, "--model", str(FIXTURES / "llama"), "--transcoders", str(FIXTURES / "plt_jumprelu"),
        "--threads", "1"]



def test_one_graph_written_to_several_files(tmp_path, capsys):
    assert main(BASE + ["--out", str(tmp_path / "a.html"), str(tmp_path / "a.json"), str(tmp_path / "a.safetensors")]) == 0
    printed = capsys.readouterr().out
    assert all((tmp_path / name).is_file() for name in ("a.html", "a.json", "a.safetensors"))
    assert sum(line.startswith("  written") for line in printed.splitlines()) == 3


def test_the_three_outputs(tmp_path, capsys):
    assert main(BASE + ["--out", str(tmp_path / "g.safetensors"), "--quiet"]) == 0
    graph = load_graph(tmp_path / "g.safetensors")
    assert graph.error < 1e-5 and len(graph) == 197  # every node, unpruned
    assert main(BASE + ["--out", str(tmp_path / "g.json"), "--quiet"]) == 0
    data = json.loads((tmp_path / "g.json").read_text())
    assert data["metadata"]["slug"] == "g" and len(data["nodes"]) < len(graph)
    assert main(BASE + ["--out", str(tmp_path / "g.html")]) == 0
    printed = capsys.readouterr().out
    assert all(len(line) <= 80 for line in printed.splitlines())
    assert "check" in printed and "replacement" in printed and "pruned" in printed
    assert "<script>" in (tmp_path / "g.html").read_text()


def test_interventions_print_the_model_beside_the_graph(tmp_path, capsys):
    graph_path = tmp_path / "g.safetensors"
    assert main(BASE + ["--out", str(graph_path), "--quiet"]) == 0
    graph = load_graph(graph_path)
    feature = max((n for n in graph.nodes if n.kind == "feature"), key=lambda n: n.value)
    assert main(BASE + ["--out", str(tmp_path / "g.html"), "--freeze", "all",
                        "--ablate", f"{feature.layer}:{feature.index}@{feature.column}"]) == 0
    printed = capsys.readouterr().out
    assert f"L{feature.layer} #{feature.index} @{feature.column} = 0" in printed
    rows = [line.split() for line in printed.splitlines()[-10:]]
    for row in rows:  # frozen, the model's change is the graph's direct prediction
        assert row[-3] == row[-2]
    assert all(len(line) <= 80 for line in printed.splitlines())


def test_a_soft_capped_models_summary_says_what_the_rows_explain(tmp_path, capsys):
    """Gemma 2's graph, its circuit-tracer set read at hook_mlp_out (the MLP's own norm's output in this model)."""
    assert main(["circuits", PROMPT, "--model", str(FIXTURES / "gemma2"), "--transcoders", str(FIXTURES / "gemma2_plt"),
                 "--threads", "1", "--out", str(tmp_path / "g.safetensors")]) == 0
    printed = capsys.readouterr().out
    assert all(len(line) <= 80 for line in printed.splitlines())
    assert "logits      the logit rows explain the logits before the final soft-cap" in printed
    assert load_graph(tmp_path / "g.safetensors").meta["logit_softcap"] == 5.0


@pytest.mark.parametrize("arguments, words", [
    (["circuits", "", "--transcoders", "x", "--out", "g.html"], "empty"),
    (BASE + ["--out", "g.png"], "--out"),
    (BASE + ["--out", "g.html", "--node-threshold", "2"], "--node-threshold"),
    (BASE + ["--out", "g.html", "--clamp", "1:2"], "LAYER:FEATURE[@POSITION]=VALUE"),
    (BASE + ["--out", "g.html", "--freeze", "some"], "--freeze"),
])
def test_mistakes_are_one_line_before_loading(arguments, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert status(arguments) == 2
    error = capsys.readouterr().err
    assert words in error and len(error.strip().splitlines()) == 1


def test_a_set_that_does_not_fit_the_model_is_one_line(tmp_path, capsys):
    from anatomy.sae import TranscoderSet, load_transcoders, save_transcoders

    three = load_transcoders(FIXTURES / "plt_jumprelu")
    save_transcoders(TranscoderSet(list(three.layers)[:2]), tmp_path / "two")  # a set for a 2-layer model
    assert status(BASE[:4] + ["--transcoders", str(tmp_path / "two"), "--out", str(tmp_path / "g.html")]) == 2
    error = capsys.readouterr().err
    assert "n_layers=2 does not fit" in error and len(error.strip().splitlines()) == 1


def test_a_model_the_replacement_cannot_freeze_is_one_line(tmp_path, capsys):
    assert status(["circuits", "Hello World", "--model", "toy-encoder", "--transcoders", str(FIXTURES / "plt_jumprelu"),
                   "--out", str(tmp_path / "g.html")]) == 2
    error = capsys.readouterr().err
    assert "need a decoder-only language model" in error and len(error.strip().splitlines()) == 1


def test_a_missing_transcoder_folder_is_one_line(tmp_path, capsys):
    assert status(BASE[:4] + ["--transcoders", str(tmp_path / "none"), "--out", str(tmp_path / "g.html")]) == 2
    assert "no transcoder set" in capsys.readouterr().err


def test_discover_is_handed_on_before_parsing(capsys):
    code = status(["circuits", "discover", "--help"])
    printed = capsys.readouterr()
    try:
        import anatomy.circuits.discovery.cli  # noqa: F401
    except ModuleNotFoundError:
        assert code == 2 and "anatomy circuits discover: unavailable" in printed.err
    else:
        assert code == 0 and "anatomy circuits discover" in printed.out
