"""Static images and the `anatomy viz` command."""

from __future__ import annotations

import pytest

from anatomy.cli import main
from anatomy.viz.plots import attention_heatmap, positional_encoding_figure, save_figure
from viz_samples import HOSTILE, synthetic_attention

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_heatmap_png_and_svg(tmp_path):
    tokens = ["a", "$x$", *HOSTILE]
    weights, _, _ = synthetic_attention(1, 1, len(tokens))
    png = save_figure(attention_heatmap(weights[0, 0], tokens, tokens, "layer 0 · head 0"), tmp_path / "a.png")
    svg = save_figure(attention_heatmap(weights[0, 0], tokens, tokens), tmp_path / "a.svg")
    assert png.read_bytes().startswith(PNG_MAGIC) and png.stat().st_size > 5000
    assert b"<svg" in svg.read_bytes()[:1000]
    with pytest.raises(ValueError, match=r"\.png, \.svg"):
        save_figure(attention_heatmap(weights[0, 0], tokens, tokens), tmp_path / "a.jpg")


def test_positional_encoding_figure(tmp_path):
    path = save_figure(positional_encoding_figure(n_positions=100, d_model=512), tmp_path / "positions.png")
    assert path.read_bytes().startswith(PNG_MAGIC) and path.stat().st_size > 5000


@pytest.mark.parametrize("view", ["head", "model", "neuron", "generation"])
def test_cli_writes_each_view_and_image(view, tmp_path, capsys):
    out, png = tmp_path / f"{view}.html", tmp_path / f"{view}.png"
    code = main(["viz", "Hello World, this is Alejandro!", "--view", view, "--out", str(out), "--png", str(png),
                 "--layer", "1", "--head", "1"])
    assert code == 0, capsys.readouterr().err
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_cli_encoder_decoder_pair(tmp_path):
    out = tmp_path / "pair.html"
    assert main(["viz", "Hello World, this is Alejandro!", "Hola Mundo, soy Alejandro!", "--out", str(out)]) == 0
    assert "cross-attention" in out.read_text()


def test_cli_errors_name_the_allowed_values(tmp_path, capsys):
    assert main(["viz", "Hello", "--layer", "7", "--svg", str(tmp_path / "x.svg")]) == 2
    assert "layers 0..1" in capsys.readouterr().err
    assert main(["viz", "Hello"]) == 2
    assert "--out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["viz", "Hello", "--view", "sideways"])
    assert "choose from 'head', 'model', 'neuron', 'generation'" in capsys.readouterr().err
