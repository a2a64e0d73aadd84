"""The activation store: passes stop at the point with the pass's own values; batches are a pure function of
(seed, step), an epoch serves every row once, shards on disk give the same batches, ranks split the contexts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anatomy
from analysis_models import tiny
from anatomy.sae.store import ActivationStore, harvest, rows_of

TOKENS = np.random.default_rng(0).integers(0, 99, 16 * 20).astype(np.uint16)  # 20 contexts of 16


def test_harvest_stops_at_the_point_with_the_passes_values():
    model = tiny()
    ids = torch.as_tensor(TOKENS[:48].astype(np.int64)).view(3, 16)
    with torch.no_grad(), anatomy.trace(model, ["blocks.0.resid_post", "blocks.0.mlp_norm.out"]) as t:
        model(ids)
    reached = []
    model.blocks[1].register_forward_pre_hook(lambda *_: reached.append(1))
    model.lm_head.register_forward_pre_hook(lambda *_: reached.append(2))
    resid, normed = harvest(model, ids, ["blocks.0.hook_resid_post", "blocks.0.mlp_norm.out"])
    assert torch.equal(resid, t["blocks.0.resid_post"]) and torch.equal(normed, t["blocks.0.mlp_norm.out"])
    assert reached == []  # the second block and the head never ran
    with pytest.raises(KeyError, match="no trace point"):
        harvest(model, ids, ["blocks.7.resid_post"])


def _store(**options) -> ActivationStore:
    options = {"context": 16, "batch_size": 25, "fill_tokens": 60, "skip": 1, "seed": 3, **options}
    return ActivationStore(tiny(), ["blocks.0.resid_post"], TOKENS, **options)


def test_batches_are_a_pure_function_of_the_step_and_an_epoch_serves_each_row_once():
    store, again = _store(), _store()
    steps = store.steps_per_epoch
    assert steps == sum(store.batches_per_fill) and steps >= 4
    forward = [store.batch(s) for s in range(steps)]
    backward = [again.batch(s) for s in reversed(range(steps))][::-1]  # another order, another store
    assert all(torch.equal(a, b) for a, b in zip(forward, backward))
    every_row = torch.cat([store.fill(i) for i in range(len(store.fills))])
    served = torch.cat(forward)
    assert len({tuple(r.tolist()) for r in served}) == len(served)  # no row twice
    assert {tuple(r.tolist()) for r in served} <= {tuple(r.tolist()) for r in every_row}
    # the next epoch is another order of the same rows
    second = torch.cat([store.batch(steps + s) for s in range(steps)])
    assert not torch.equal(second, served)
    all_rows = rows_of(tiny(), ["blocks.0.resid_post"], TOKENS, context=16, skip=1)
    assert all_rows.shape == (20 * 15, 32)


def test_shards_on_disk_give_the_same_batches_without_running_the_model(tmp_path, monkeypatch):
    first = _store(shards=tmp_path)
    batches = [first.batch(s) for s in range(first.steps_per_epoch)]
    assert len(list(tmp_path.glob("fill-*.safetensors"))) == len(first.fills)
    second = _store(shards=tmp_path)
    monkeypatch.setattr("anatomy.sae.store.harvest", lambda *a, **k: pytest.fail("the model ran again"))
    assert all(torch.equal(second.batch(s), b) for s, b in enumerate(batches))


def test_two_ranks_harvest_disjoint_contexts_that_cover_the_run():
    ranks = [_store(rank=r, world_size=2) for r in range(2)]
    contexts = [np.concatenate(store.fills) for store in ranks]
    assert not set(contexts[0]) & set(contexts[1])
    assert sorted(np.concatenate(contexts)) == list(range(20))


def test_a_transcoders_rows_hold_its_input_and_its_target():
    store = ActivationStore(tiny(), ["blocks.1.mlp_norm.out", "blocks.1.mlp.out"], TOKENS, context=16, batch_size=25,
                            fill_tokens=60)
    model = tiny()
    ids = torch.as_tensor(TOKENS[:16].astype(np.int64))[None]
    with torch.no_grad(), anatomy.trace(model, ["blocks.1.mlp_norm.out", "blocks.1.mlp.out"]) as t:
        model(ids)
    rows = rows_of(model, store.points, TOKENS[:16], context=16, skip=1)
    assert rows.shape == (15, 64)
    assert torch.equal(rows[:, :32], t["blocks.1.mlp_norm.out"][0, 1:]) and torch.equal(rows[:, 32:], t["blocks.1.mlp.out"][0, 1:])


def test_too_little_text_is_refused_before_any_pass():
    with pytest.raises(ValueError, match="fewer than one batch"):
        _store(batch_size=10_000)
    with pytest.raises(ValueError, match="skip"):
        _store(skip=16)
