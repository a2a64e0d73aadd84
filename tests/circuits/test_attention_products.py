"""Rows crossing attention in bfloat16 (attribution_graph(attention_products="bfloat16"), --attention-products):
the edges stay within a stated bound of the frozen model's own (frozen_reference.py, float64), the option is
really taken (the error is a bfloat16 one, not float32's), the graph's check says it, and oneDNN's kernels are
bounded (anatomy/__init__.py, frozen.rows_product)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from anatomy.circuits import frozen
from anatomy.circuits.attribute import attribution_graph
from anatomy.circuits.prune import pruned
from anatomy.circuits.replacement import Replacement
from frozen_reference import frozen_reference
from test_attribute import CASES, PROMPT, tiny

BOUND = 2e-2  # bfloat16's 8 bits of mantissa (2^-8 = 0.4% a rounding), over a few layers, relative to the largest edge


@pytest.mark.parametrize("case", ["llama-like", "gpt2-like: LayerNorm, biases, learned positions"])
def test_bfloat16_edges_are_the_frozen_models_within_the_stated_bound(case):
    model, transcoders = tiny(**CASES[case])
    reference = None
    errors = {}
    for products in ("float32", "bfloat16"):
        graph = attribution_graph(model, torch.tensor(PROMPT), transcoders, attention_products=products)
        assert graph.meta["attention_products"] == products
        reference = frozen_reference(model, transcoders, graph) if reference is None else reference
        scale = float(reference.abs().max())
        errors[products] = float((graph.adjacency.double() - reference).abs().max()) / scale
        if products == "bfloat16":  # the graph's own check carries the rounding, and says so
            assert 1e-5 < graph.error < BOUND, graph.check
    assert errors["float32"] < 1e-6
    assert 1e-4 < errors["bfloat16"] < BOUND, errors  # taken (not float32's error), and within the bound


def test_a_pruned_graph_says_its_rows_crossed_attention_in_bfloat16():
    model, transcoders = tiny()
    for products in ("float32", "bfloat16"):
        graph = attribution_graph(model, torch.tensor(PROMPT), transcoders, attention_products=products)
        said = pruned(graph).check.endswith("(rows crossed attention in bfloat16)")
        assert said == (products == "bfloat16") and graph.check.endswith("(rows crossed attention in bfloat16)") == said


def test_a_capped_graph_in_bfloat16_keeps_its_identity_within_the_bound():
    model, transcoders = tiny()
    graph = attribution_graph(model, torch.tensor(PROMPT), transcoders, max_feature_nodes=12, batch_size=4,
                              attention_products="bfloat16")
    assert graph.meta["max_feature_nodes"] == 12
    assert graph.error < BOUND, graph.check


def test_the_transpose_in_pieces_of_rows_equals_it_whole(monkeypatch):
    model, transcoders = tiny()
    ids = torch.tensor(PROMPT)
    sublayer = Replacement(model, transcoders, ids, attention_products=torch.bfloat16).sublayers[1]
    g = torch.randn(5, len(PROMPT) - 1, model.config.d_model, generator=torch.Generator().manual_seed(3))
    image = torch.randn(model.config.d_model, generator=torch.Generator().manual_seed(4))
    whole = g.clone()
    whole_first = sublayer.add_transpose(whole, image)
    monkeypatch.setattr(frozen, "LOW_PRODUCT_ROWS", 4)  # 5 rows x 6 positions: 8 pieces of g, the last of 2
    pieces = g.clone()
    pieces_first = sublayer.add_transpose(pieces, image)
    exact = Replacement(model, transcoders, ids).sublayers[1]
    in_float32 = g.clone()
    exact_first = exact.add_transpose(in_float32, image)
    share = (in_float32 - g).abs().max()  # what attention adds: the pieces' may differ from the whole's by a rounding
    assert (pieces - whole).abs().max() < BOUND * share  # (a piece left out or misplaced differs by the share)
    assert (pieces_first - whole_first).abs().max() < BOUND * whole_first.abs().max()
    for result, first in ((whole, whole_first), (pieces, pieces_first)):  # each within bfloat16's rounding of float32
        assert 1e-5 * share < (result - in_float32).abs().max() < BOUND * share
        assert (first - exact_first).abs().max() < BOUND * exact_first.abs().max()


@pytest.mark.parametrize("value", ["float16", "bf16", None, torch.bfloat16])
def test_other_products_are_refused_naming_the_allowed(value):
    model, transcoders = tiny()
    with pytest.raises(ValueError, match="attention_products must be one of float32, bfloat16"):
        attribution_graph(model, torch.tensor(PROMPT), transcoders, attention_products=value)


def test_importing_anatomy_bounds_onednns_kernels_unless_the_environment_says():
    code = "import os, anatomy; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"
    environment = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    shown = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "16"
    environment["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = "256"
    shown = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "256"


@pytest.mark.parametrize("products", [torch.float32, torch.bfloat16])
def test_the_transposes_reuse_their_scratch_and_give_what_fresh_buffers_give(products):
    """frozen.Scratch: a prompt's sublayers share the temporaries' buffers, kept between calls (grown when a call
    needs more); the result is a fresh sublayer's, whatever an earlier call left in them."""
    model, transcoders = tiny()
    rep = Replacement(model, transcoders, torch.tensor(PROMPT), attention_products=products)
    image = torch.randn(model.config.d_model, generator=torch.Generator().manual_seed(5))
    generator = torch.Generator().manual_seed(6)
    big, small = (torch.randn(r, P, model.config.d_model, generator=generator) for r, P in ((6, 6), (3, 4)))
    scratch = rep.sublayers[0].scratch
    assert all(sublayer.scratch is scratch for sublayer in rep.sublayers)
    rep.sublayers[0].add_transpose(big.clone(), image)
    held = {name: buffer.data_ptr() for name, buffer in scratch.buffers.items()}
    assert {name for name, _ in held} >= {"u", "by key", "mixing", "mixed", "dv"}
    for layer, sublayer in enumerate(rep.sublayers):
        for g in (small, big):
            fresh = Replacement(model, transcoders, torch.tensor(PROMPT), attention_products=products).sublayers[layer]
            expected, got = g.clone(), g.clone()
            expected_first, got_first = fresh.add_transpose(expected, image), sublayer.add_transpose(got, image)
            assert torch.equal(got, expected) and torch.equal(got_first, expected_first)
    assert {name: buffer.data_ptr() for name, buffer in scratch.buffers.items()} == held  # nothing made again
