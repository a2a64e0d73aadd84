"""`anatomy analyze`: prints the identity check, writes the view, and turns every mistake into one
line and exit status 2."""

from __future__ import annotations

import pytest

from anatomy.cli import main

SENTENCE = "Hello World, this is Alejandro!"


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ["lens", SENTENCE],
    ["heads", "--kind", "previous_token"],
    ["patch", "--clean", SENTENCE, "--corrupt", "Hello World, this is this!", "--by", "layer"],
    ["ig", SENTENCE, "--target", "World,", "--steps", "8"],
    ["rollout", SENTENCE, "--model", "toy-seq2seq", "--target-text", "Hola Mundo,"],
])
def test_each_analysis_prints_its_check_and_writes_its_view(argv, tmp_path, capsys):
    out = tmp_path / "view.html"
    assert main(["analyze", *argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "check: " in printed and f"wrote {out}" in printed
    assert out.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("argv, message", [
    (["dla", SENTENCE], "pre-norm"),
    (["ig", SENTENCE, "--target", "Hello World,"], "2 tokens"),
    (["patch", "--clean", SENTENCE], "--corrupt"),
    (["lens"], "TEXT"),
    (["rollout", SENTENCE, "--model", "toy-seq2seq"], "--target-text"),
    (["lens", SENTENCE, "--out", "lens.pdf"], ".html, .png or .svg"),
    (["heads", "--kind", "copying"], "invalid choice"),
])
def test_mistakes_are_one_line_and_status_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        status = main(["analyze", *argv])
    except SystemExit as exit_:  # argparse's own mistakes end in SystemExit(2)
        status = exit_.code
    assert status == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1 and "Traceback" not in error
