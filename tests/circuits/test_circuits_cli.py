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


def test_rows_cross_attention_in_bfloat16_when_asked_and_the_check_says_so(tmp_path, capsys):
    assert main(BASE + ["--out", str(tmp_path / "g.safetensors"), "--attention-products", "bfloat16"]) == 0
    printed = capsys.readouterr().out
    assert "(rows crossed attention in bfloat16)" in " ".join(printed.split())
    assert all(len(line) <= 80 for line in printed.splitlines())
    graph = load_graph(tmp_path / "g.safetensors")
    assert graph.meta["attention_products"] == "bfloat16" and 1e-6 < graph.error < 2e-2


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
    (BASE + ["--out", "g.html", "--attention-products", "float16"], "--attention-products"),
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


@pytest.fixture
def named_set(tmp_path):
    """The fixture's transcoders, naming the fixture's model as the one they were trained on."""
    from anatomy.sae import load_transcoders, save_transcoders

    transcoders = load_transcoders(FIXTURES / "plt_jumprelu")
    transcoders.metadata["model_name"] = str(FIXTURES / "llama")
    return save_transcoders(transcoders, tmp_path / "named")


@pytest.mark.parametrize("given", [["--prompt", "discover"], ["--", "discover"]])
def test_a_prompt_that_is_the_word_discover_is_explained(given, named_set, tmp_path, capsys):
    out = str(tmp_path / "g.json")
    assert main(["circuits", "--transcoders", str(named_set), "--out", out, "--threads", "1", *given]) == 0
    assert "prompt      'discover'" in capsys.readouterr().out
    assert "discover" in json.loads(Path(out).read_text())["metadata"]["prompt"]


def test_the_model_is_the_one_the_transcoders_name(named_set, tmp_path, capsys):
    assert main(["circuits", PROMPT, "--transcoders", str(named_set), "--out", str(tmp_path / "g.json")]) == 0
    assert f"model       {FIXTURES / 'llama'}"[:60] in capsys.readouterr().out
    assert status(["circuits", PROMPT, "--transcoders", str(FIXTURES / "plt_jumprelu"), "--out", str(tmp_path / "g.json")]) == 2
    assert "tiny-llama" in capsys.readouterr().err  # what that set names, not another built-in model


def test_the_transcoders_go_to_the_models_device(tmp_path, monkeypatch):
    """--device puts the model and the transcoders on it (recorded on the CPU: no GPU here)."""
    from torch import nn

    from anatomy.sae.transcoders import TranscoderSet

    moved = []
    to = nn.Module.to

    def recorded(module, *args, **kwargs):
        moved.append((type(module).__name__, str(args[0] if args else kwargs.get("device"))))
        return to(module, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "to", recorded)
    assert main(BASE + ["--out", str(tmp_path / "g.json"), "--quiet", "--device", "cpu"]) == 0
    kinds = {name for name, device in moved if device == "cpu"}
    assert TranscoderSet.__name__ in kinds and any(name != TranscoderSet.__name__ for name in kinds), moved


def test_the_stages_are_said_as_they_start_when_redirected(tmp_path, capsys):
    assert main(BASE + ["--out", str(tmp_path / "g.json")]) == 0
    out = capsys.readouterr().out
    stages = [line.split("] ", 1)[1] for line in out.splitlines() if line.startswith("[")]
    assert stages == ["loading the transcoders …", "loading the model …", "the graph …", "the attention …", "writing …"]
    assert out.index("writing …") < out.index("anatomy circuits\n")
