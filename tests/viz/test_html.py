"""The HTML files themselves: self-contained, data that no token can break out of, compact weights."""

from __future__ import annotations

import base64
import json
import os
import re
import zlib

import numpy as np
import pytest
import torch

from anatomy.viz import AttentionMap, head_view, model_view, neuron_view
from anatomy.viz.html import page, quantise, write_atomically
from viz_samples import HOSTILE, synthetic_attention


def embedded_data(document: str) -> dict:
    match = re.search(r'<script type="application/json" id="anatomy-data">(.*?)</script>', document, re.S)
    return json.loads(match.group(1))


def test_hostile_tokens_stay_inside_the_json_block(pair_map):
    document = head_view(pair_map).html
    data_block = document.split('id="anatomy-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data_block  # so neither "</script" nor "<!--" can appear in it
    assert embedded_data(document)["maps"][0]["keys"] == pair_map.keys
    for token in HOSTILE:
        assert token not in document.split("<script>", 1)[0]  # nothing of them in the markup before the code


def test_titles_are_escaped():
    weights, _, _ = synthetic_attention(1, 1, 2)
    document = model_view(weights, ["a", "b"], title="<b>bold</b> & co").html
    assert "<b>bold</b>" not in document
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; co" in document


def test_the_file_refers_to_nothing_outside_itself(pair_map):
    for view in (head_view(pair_map), model_view(pair_map), neuron_view(pair_map)):
        before, rest = view.html.split('id="anatomy-data">', 1)
        code = before + rest.split("</script>", 1)[1]  # the page without its data (tokens may say anything)
        assert not re.search(r"https?://|\bsrc=|\bhref=|@import|url\(|fetch\(|XMLHttpRequest", code), view.view


def test_weights_are_bytes_per_layer_that_round_trip(pair_map):
    data = embedded_data(head_view(pair_map).html)["maps"][0]
    assert len(data["weights"]) == pair_map.n_layers
    layer = np.frombuffer(zlib.decompress(base64.b64decode(data["weights"][1])), np.uint8)
    expected = quantise(pair_map.weights[1])
    np.testing.assert_array_equal(layer.reshape(expected.shape), expected)
    assert np.abs(expected / 255 - pair_map.weights[1]).max() <= 0.5 / 255 + 1e-7


def test_jupyter_shows_the_view_in_a_sandboxed_iframe(pair_map):
    shown = head_view(pair_map)._repr_html_()
    # scripts run, but with no access to the notebook's page (no allow-same-origin)
    assert shown.startswith('<iframe sandbox="allow-scripts" srcdoc=')
    assert "<script" not in shown  # the document is an escaped attribute value


def test_every_page_has_a_content_security_policy_that_forbids_fetching(pair_map):
    pages = [head_view(pair_map).html, page("t", "<p>x</p>"), page("t", "<p>x</p>", script="1")]
    for document in pages:
        policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', document)
        assert policy, document[:300]
        rules = dict(rule.strip().split(" ", 1) for rule in policy[1].split(";"))
        assert rules["default-src"] == "'none'" and "connect-src" not in rules and "http" not in policy[1]
    assert "script-src" not in pages[1] and "script-src 'unsafe-inline'" in pages[2]
    assert page("<b>", "").count("<title>&lt;b&gt;</title>") == 1


def test_the_encoder_decoder_subtitle_counts_each_side(seq2seq_maps):
    document = head_view(seq2seq_maps).html
    assert "encoder: 5 tokens, 2 layers, 2 heads · decoder: 4 tokens, 2 layers, 2 heads · 3 attention maps" in document


def test_a_failed_write_leaves_the_previous_file_whole(tmp_path, pair_map):
    path = tmp_path / "view.html"
    umask = os.umask(0o022)
    try:
        head_view(pair_map).save(path)
    finally:
        os.umask(umask)
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)  # what open() gives a new file: readable by everyone
    before = path.read_text()
    with pytest.raises(UnicodeEncodeError):
        write_atomically(path, "text with a lone surrogate \udcff")
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["view.html"]


def test_bertviz_style_per_layer_tensors():
    weights, _, _ = synthetic_attention(2, 3, 4)
    per_layer = tuple(torch.from_numpy(layer)[None] for layer in weights)  # HF outputs.attentions
    data = embedded_data(head_view(per_layer, list("abcd"), sentence_b_start=2).html)["maps"][0]
    assert (data["nLayers"], data["nHeads"], data["sentenceBStart"]) == (2, 3, 2)


def test_errors_name_the_allowed_values(pair_map):
    with pytest.raises(IndexError, match=r"layers 0\.\.2"):
        head_view(pair_map, layer=3)
    with pytest.raises(IndexError, match=r"heads 0\.\.3"):
        model_view(pair_map, head=4)
    with pytest.raises(ValueError, match="2 query tokens"):
        AttentionMap("x", np.zeros((1, 1, 3, 3)), ["a", "b"], ["a", "b", "c"])
    with pytest.raises(ValueError, match="q= and k="):
        neuron_view(AttentionMap("x", np.zeros((1, 1, 2, 2)), ["a", "b"], ["a", "b"]))
