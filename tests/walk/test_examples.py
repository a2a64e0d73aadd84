"""The source texts' worked examples reproduce the numbers the sources printed, and say where a
source departs from its own formulas."""

import pytest

from anatomy.walk import example_walk
from anatomy.walk.examples import load


@pytest.mark.parametrize("name", ["armas", "anasashb", "notes"])
def test_each_example_reproduces_its_source(name):
    walk = example_walk(name)
    assert walk.ok, [c.summary for step in walk.failures for c in step.checks if not c.ok]
    assert walk.source and "seed" not in walk.to_text()


def test_armas_prints_the_articles_values_and_its_departures():
    text = example_walk("armas").to_text()
    flat = " ".join(text.split())
    for value in ("2.6664", "2.9434", "3.2204", "3.4974",  # v₃
                  "2.1124", "2.3894", "28.7448", "14.3724",  # q₃, k₃, q₃·k₃, a₃,₃
                  "0.0824", "0.1077", "0.7801", "0.0210", "0.0089",  # α₃
                  "0.3411", "1.2990", "0.1003", "1.0296",  # x₃
                  "-0.7189", "1.2408", "-1.2115", "0.6896",  # LayerNorm of x₃
                  "0.5109", "0.4891"):  # the decoder's masked softmax
        assert value in text, value
    assert "writes v₃ = W_V·x₃ but computes x₃·W_V" in flat
    assert "two different W_Q" in flat
    assert "adds 0.03 in the last entry, where e₃ has −0.3" in flat
    assert "i the dimension" in flat and "indexes the frequency by the pair" in flat
    assert 'Alejandro Armas, “What are Transformers – Understanding the Architecture End-to-End” (2024)' in flat


def test_anasashb_walks_its_seven_steps():
    walk = example_walk("anasashb")
    assert [step.title.split(")")[0] for step in walk.steps] == [f"Step {i}" for i in range(8)]
    text = walk.to_text(width=120)
    data = load("anasashb")
    for row in data["normalized_attention"]:
        assert f"{row[0]:.4f}" in text
    assert "Transformers: Walking Through the Encoder Forward Pass" in text


def test_the_notes_walk_their_five_by_four_example():
    text = " ".join(example_walk("notes").to_text().split())
    assert "E (5 × 4)" in text and "(4 × 2)" in text and "QKᵀ / √d), d = 2" in text
    assert "a₁₁v₁₁ + a₁₂v₂₁ + ⋯ + a₁₅v₅₁" in text and "q₁₁k₁₁ + q₁₂k₁₂" in text
