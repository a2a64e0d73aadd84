"""The held-out numbers at their limits: an SAE that reconstructs exactly explains all the variance and
recovers all of the loss; one that writes nothing recovers none; the sums are the definitions'."""

from __future__ import annotations

import numpy as np
import torch

import anatomy
from analysis_models import FAMILIES, tiny
from anatomy.sae import SAE
from anatomy.sae.evaluate import OUTLIER, contexts_of, loss_recovered, reconstruction_stats, typical

TOKENS = np.random.default_rng(1).integers(0, 99, 16 * 6)


def _exact(point: str, d: int = 32) -> SAE:
    """ReLU features x and -x: relu(x) - relu(-x) = x, so x^ = x for every input (2d features)."""
    sae = SAE(d, 2 * d, kind="relu", point=point, seed=None, apply_b_dec_to_input=False)
    eye = torch.eye(d)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae.eval()


def test_an_exact_sae_explains_everything_and_recovers_all_the_loss():
    model = tiny(**FAMILIES["decoder-llama"])
    ids = contexts_of(TOKENS, 16)
    sae = _exact("blocks.0.resid_post")
    stats = reconstruction_stats(model, sae, ids)
    assert abs(stats["fve"] - 1) < 1e-6 and stats["tokens"] == 6 * 15
    result = loss_recovered(model, sae, ids)
    assert abs(result["ce_spliced"] - result["ce_clean"]) < 1e-5
    assert abs(result["loss_recovered"] - 1) < 1e-4
    assert result["ce_zero"] > result["ce_clean"]


def test_an_sae_that_writes_nothing_recovers_nothing():
    model = tiny(**FAMILIES["decoder-llama"])
    ids = contexts_of(TOKENS, 16)
    sae = SAE(32, 64, kind="topk", k=4, point="blocks.1.resid_mid", seed=0).eval()
    with torch.no_grad():
        sae.W_dec.zero_()
    result = loss_recovered(model, sae, ids)
    assert abs(result["ce_spliced"] - result["ce_zero"]) < 1e-6 and abs(result["loss_recovered"]) < 1e-5


def test_l0_fve_dead_and_dense_are_their_definitions():
    model = tiny()
    ids = contexts_of(TOKENS, 16)
    sae = SAE(32, 64, kind="relu", point="blocks.0.resid_post", seed=3).eval()
    stats = reconstruction_stats(model, sae, ids, skip=2)
    with torch.no_grad(), anatomy.trace(model, "blocks.0.resid_post") as t:
        model(ids)
    x = t["blocks.0.resid_post"][:, 2:].flatten(0, 1)  # (R, E): no outlier in a tiny random model
    f = sae.encode(x)
    residual = (x - sae.decode(f)).double()
    fve = 1 - residual.pow(2).sum() / (x.double() - x.double().mean(0)).pow(2).sum()
    assert abs(stats["fve"] - fve.item()) < 1e-6 * abs(fve.item())
    assert abs(stats["l0"] - (f > 0).sum(-1).double().mean().item()) < 1e-9
    frequency = (f > 0).double().mean(0)
    assert stats["dead"] == (frequency == 0).double().mean().item()
    assert stats["dense"] == (frequency > 0.1).double().mean().item()


def test_outliers_are_the_vectors_far_beyond_the_median_norm():
    x = torch.ones(2, 6, 4)
    x[0, 0] *= 1000  # the first position: skipped anyway
    x[1, 3] *= OUTLIER * 1.5  # an attention sink later on
    kept = typical(x, skip=1)
    assert kept[:, 0].logical_not().all()
    assert kept.sum() == 2 * 5 - 1 and not kept[1, 3]
