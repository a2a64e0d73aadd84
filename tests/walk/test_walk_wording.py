"""The walk's words say what the model has: a sum is written with one sign per term, Concat lists
the heads there are, and the projections' check names biases only where the model has them."""

from __future__ import annotations

import re

import pytest
import torch

import anatomy
from anatomy.walk import EXAMPLES, example_walk, toy_example, walkthrough

# A sign written twice: "+ -0.0113", "− -0.0544", "×-0.1700".
DOUBLE_SIGN = re.compile(r"[+−×] ?-\d")


def lines(walk) -> list[str]:
    """Every equation, check and worked line of the walk, as the terminal and the page write them."""
    out = []
    for step in walk.steps:
        out += [step.title, step.text, step.equation]
        out += [line.text for line in step.worked]
        out += [step.check.recomputed] if step.check is not None else []
    return [line for line in out if line]


TOY_WALKS = [(name, layer, head, norm) for name in ("toy", "toy-encoder", "toy-seq2seq")
             for layer in (0, 1) for head in (0, 1) for norm in ("post", "pre")]


@pytest.mark.parametrize("name, layer, head, norm", TOY_WALKS)
def test_no_sum_writes_a_sign_twice(name, layer, head, norm):
    overrides = {} if norm == "post" else {"norm_position": "pre", "final_norm": True}
    model, ids, options = toy_example(name, **overrides)
    walk = walkthrough(model, ids, **{**options, "layer": layer, "head": head})
    assert walk.ok
    bad = [line for line in lines(walk) if DOUBLE_SIGN.search(line)]
    assert not bad, bad[:3]


@pytest.mark.parametrize("example", list(EXAMPLES))
def test_the_source_examples_write_one_sign_per_term(example):
    bad = [line for line in lines(example_walk(example)) if DOUBLE_SIGN.search(line)]
    assert not bad, bad[:3]


@pytest.mark.parametrize("heads, written", [(1, "Concat(head_0)"), (2, "Concat(head_0, head_1)"),
                                            (3, "Concat(head_0, head_1, head_2)"),
                                            (4, "Concat(head_0, …, head_3)")])
@pytest.mark.parametrize("bias", [True, False])
def test_concat_lists_the_heads_there_are_and_the_check_names_the_biases_there_are(heads, written, bias):
    config = anatomy.preset("toy").replace(d_model=4 * heads, n_heads=heads, attn_bias=bias, attn_out_bias=bias,
                                            mlp_bias=bias)
    torch.manual_seed(0)
    model = anatomy.build_model(config).eval()
    walk = walkthrough(model, [1, 2, 3, 4])
    text = "\n".join(lines(walk))
    assert walk.ok
    assert f"MultiHead = {written}·W_O" in text
    assert ("with the module's W and b" in text) == bias
    assert "with the module's W" in text
