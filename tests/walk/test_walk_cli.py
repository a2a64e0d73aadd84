"""`anatomy walk` for each family and format, its errors, and what its HTML may not contain."""

import re
import shutil
import subprocess
import sys

import pytest

from anatomy.cli import main

FAMILIES = ["toy", "toy-encoder", "toy-seq2seq"]
FORMATS = ["terminal", "markdown", "html"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("model", FAMILIES)
def test_walk_runs_for_each_family_and_format(model, fmt, tmp_path):
    out = tmp_path / f"walk.{fmt}"
    assert main(["walk", "--model", model, "--format", fmt, "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "Alejandro!" in text and "checks passed" in text
    if fmt == "markdown":
        assert "$$" in text and r"\begin{bmatrix}" in text
    if fmt == "html":
        assert text.startswith("<!DOCTYPE html>") and "<style>" in text
        assert "<script" not in text and not re.search(r"https?://", text)  # self-contained
    if model == "toy-seq2seq":
        assert "Cross-attention" in text


def test_no_arguments_runs_the_default_walk(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "Step 1" in out and "<SOS>" in out and "Hello" in out
    assert "All 17 checks passed" in out


def test_the_console_entry_point_runs_the_default_walk():
    entry = shutil.which("anatomy")
    command = [entry] if entry else [sys.executable, "-m", "anatomy.cli"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120,
                            env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"} if entry else None)
    assert result.returncode == 0, result.stderr
    assert "Next-token probabilities" in result.stdout


def test_html_is_self_contained_and_escapes_tokens(tmp_path):
    out = tmp_path / "walk.html"
    text = "<script>alert(1)</script> [bold]x[/bold] <img src=https://example.com/x.png>"
    assert main(["walk", text, "--format", "html", "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "<script" not in page.lower()
    assert "&lt;script&gt;" in page  # shown, as text
    assert "<img" not in page  # the token is shown as text ...
    assert not re.search(r"<[^>]*\b(src|href)\s*=", page)  # ... and no element fetches anything
    assert "url(" not in page and "@import" not in page
    markdown = tmp_path / "walk.md"
    assert main(["walk", text, "--format", "markdown", "--out", str(markdown)]) == 0
    assert "<script" not in markdown.read_text(encoding="utf-8")


def test_tokens_that_look_like_markup_are_shown_as_text(capsys):
    assert main(["walk", "[bold]x[/bold] [CLS]", "--layer", "1", "--head", "1"]) == 0
    out = capsys.readouterr().out
    assert "[bold]x[/bold]" in out and "[CLS]" in out


def test_an_unknown_model_lists_the_choices(capsys):
    assert main(["walk", "--model", "gpt-17"]) == 2
    err = capsys.readouterr().err
    assert "unknown --model 'gpt-17'" in err and "toy, toy-encoder, toy-seq2seq, minilm" in err


def test_a_layer_out_of_range_names_the_range(capsys):
    assert main(["walk", "--layer", "5"]) == 2
    assert "--layer 5 is out of range: this model has 2 layers, choose 0 … 1" in capsys.readouterr().err
    assert main(["walk", "--head", "2"]) == 2
    assert "choose 0 … 1" in capsys.readouterr().err


def test_pre_norm_from_the_command_line(tmp_path):
    out = tmp_path / "walk.md"
    assert main(["walk", "--norm-position", "pre", "--format", "markdown", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "LayerNorm before the attention" in text and "Final LayerNorm" in text
