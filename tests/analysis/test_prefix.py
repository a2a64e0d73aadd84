"""A pass continued from a shared prefix (anatomy/analysis/prefix.py) is the full pass: every trace point,
in the same order, within 1e-5 of run_with_cache's, for every decoder layout and for the real decoder
families (tiny random transformers checkpoints); the others are refused and recompute in full."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import anatomy
from anatomy.analysis import run_with_cache
from anatomy.analysis.prefix import Positions, common_prefix, extend, extendable

from analysis_models import FAMILIES, TINY, tiny
from test_cache_memory import BLOCKS

sys.path.insert(0, str(Path(__file__).parents[1] / "checkpoints"))
from checkpoint_cases import CASES as BASE_CASES, VOCAB, checkpoint_factory, tiny_config  # noqa: E402
from test_families_learned import CASES as LEARNED_CASES  # noqa: E402
from test_families_rotary import CASES as ROTARY_CASES  # noqa: E402

TOL = 1e-5
LAYOUTS = {**BLOCKS, **{f"family {name}": overrides for name, overrides in FAMILIES.items()}}
DECODER_CLASSES = ("ForCausalLM", "LMHeadModel")
BASE = {name: case for name, case in BASE_CASES.items() if case[0].endswith(DECODER_CLASSES)}  # tiny_config's sizes
FAMILY = {name: case for cases in (ROTARY_CASES, LEARNED_CASES) for name, case in cases.items()
          if case[0].endswith(DECODER_CLASSES)}  # their own sizes


def texts(vocab: int, seed: int = 0) -> list[list[int]]:
    """A typing session: a text, its last tokens retokenised and more appended, a deletion back into
    the shared prefix, the same text again, one token, then an unrelated text."""
    draw = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(0, vocab, (n,), generator=draw).tolist()  # noqa: E731
    first = ids(7)
    grown = first[:5] + ids(6)
    return [first, grown, grown[:8] + ids(1), grown[:8] + ids(1), grown[:1], ids(9)]


def assert_continues_a_full_pass(model, session: list[list[int]]) -> list[int]:
    """Continue one pass along `session`; at each text, every point equals the full pass's. Returns how
    many positions each pass computed."""
    computed, previous = [], None
    for ids in session:
        continued = extend(model, ids, previous)
        output, full = run_with_cache(model, torch.tensor([ids]))
        assert list(continued.trace) == list(full), "the points, in the order of the pass"
        assert continued.trace.tokens[0] == full.tokens[0]
        for name in full:
            assert continued.trace.axes(name) == full.axes(name)
            torch.testing.assert_close(continued.trace[name], full[name], atol=TOL, rtol=TOL, msg=name)
        torch.testing.assert_close(continued.logits_at(len(ids) - 1), output.logits[0, -1], atol=TOL, rtol=TOL)
        computed.append(continued.computed)
        previous = continued
    return computed


@pytest.mark.parametrize("overrides", LAYOUTS.values(), ids=list(LAYOUTS))
def test_a_continued_pass_is_the_full_pass_for_every_layout(overrides):
    model = tiny(**overrides)
    if not extendable(model):
        assert (model.config.arch != "decoder" or model.config.pos_encoding == "relative" or model.config.n_experts)
        with pytest.raises(ValueError, match="run_with_cache"):
            extend(model, [1, 2, 3])
        return
    computed = assert_continues_a_full_pass(model, texts(TINY["vocab_size"]))
    # only the positions after the shared prefix ran: 6 of 11, then 1, none new (the same text), the
    # one token (a pass always runs its last position), then all 9 of an unrelated text
    assert computed == [7, 6, 1, 1, 1, 9]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    base, family = checkpoint_factory(BASE, tmp_path_factory, tiny_config), checkpoint_factory(FAMILY, tmp_path_factory)
    return lambda case: base(case) if case in BASE else family(case)


@pytest.mark.parametrize("case", [*BASE, *FAMILY])
def test_a_continued_pass_is_the_full_pass_for_every_decoder_family(checkpoint, case):
    model = anatomy.from_pretrained(checkpoint(case)).eval()
    if not extendable(model):  # a mixture of experts: each expert's points see only its own tokens
        assert model.config.n_experts
        return
    assert assert_continues_a_full_pass(model, texts(VOCAB, seed=3)) == [7, 6, 1, 1, 1, 9]


def test_the_same_text_is_the_same_pass_and_nothing_runs():
    model = tiny(arch="decoder")
    first = extend(model, [5, 6, 7])
    assert extend(model, [5, 6, 7], first) is first


def test_a_continued_pass_leaves_the_previous_one_intact():
    model = tiny(arch="decoder", pos_encoding="rotary")
    first = extend(model, [5, 6, 7, 8])
    before = {name: first.trace[name].clone() for name in first.trace}
    extend(model, [5, 6, 9, 9, 9], first)
    for name, value in before.items():
        assert torch.equal(first.trace[name], value), name


def test_pieces_join_once_and_read_a_position_without_joining():
    a, b = torch.arange(6.0).view(1, 3, 2), torch.arange(6.0, 10.0).view(1, 2, 2)  # (B, T, E)
    pieces = Positions(1, [a, b])
    assert torch.equal(pieces.at(3), b[:, 0]) and len(pieces.parts) == 2
    assert [p.size(1) for p in pieces.first(4)] == [3, 1]
    joined = pieces.join(*pieces.parts)
    assert torch.equal(joined, torch.cat([a, b], dim=1)) and pieces.parts == [joined]
    with pytest.raises(IndexError, match="5 positions"):
        pieces.at(5)


def test_common_prefix_counts_equal_leading_ids():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([1, 2], [1, 2]) == 2


def test_an_encoder_a_seq2seq_model_and_training_mode_are_refused():
    for model in (tiny(arch="encoder"), tiny(arch="encoder-decoder"), tiny(arch="decoder").train()):
        assert not extendable(model)
        with pytest.raises(ValueError, match="extendable"):
            extend(model, [1, 2])
    with pytest.raises(ValueError, match="at least one id"):
        extend(tiny(arch="decoder"), [])


def test_a_pass_stopped_by_its_check_leaves_nothing_behind():
    model = tiny(arch="decoder", pos_encoding="rotary")
    first = extend(model, [5, 6, 7, 8])
    before = {name: first.trace[name].clone() for name in first.trace}
    calls = []

    def check():  # stop at the tenth trace point, as a superseded keystroke's pass does
        calls.append(1)
        if len(calls) == 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extend(model, [5, 6, 7, 9, 9], first, check=check)
    assert all(torch.equal(first.trace[name], value) for name, value in before.items())
    assert not any(point.active for point in anatomy.trace_points(model).values())  # every trace point off
    assert assert_continues_a_full_pass(model, [[5, 6, 7, 8], [5, 6, 7, 9, 9]]) == [4, 2]
