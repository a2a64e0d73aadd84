"""Scaled dot-product attention: the seeds' worked example, the two kernels, masking."""

import math

import numpy as np
import pytest
import torch

import anatomy
from anatomy.attention import eager_attention, sdpa_attention
from anatomy.masks import causal_mask, self_attention_mask


def test_seed_002_worked_example():
    # Seed 002 prints these for its q, k, v (4 queries, 4 keys, depth 2) with no mask.
    q = np.array([[1, 0], [0, 2], [1, 1], [1, 0]])
    k = np.array([[1, 2], [4, 5], [7, 8], [4, 3]])
    v = np.array([[1, 0], [0, 2], [1, 1], [2, 1]])
    output, weights = anatomy.scaled_dot_product_attention(q, k, v)
    expected_output = np.array(
        [[1.0, 1.08412591], [0.98668512, 1.01394796], [0.98931693, 1.01391173], [1.0, 1.08412591]]
    )
    expected_weights = np.array([
        [1.14579473e-02, 9.55838542e-02, 7.97374344e-01, 9.55838542e-02],
        [2.03348558e-04, 1.41513064e-02, 9.84808921e-01, 8.36423531e-04],
        [2.02820414e-04, 1.41145522e-02, 9.82251144e-01, 3.43148384e-03],
        [1.14579473e-02, 9.55838542e-02, 7.97374344e-01, 9.55838542e-02],
    ])
    np.testing.assert_allclose(output.numpy(), expected_output, atol=1e-6)
    np.testing.assert_allclose(weights.numpy(), expected_weights, atol=1e-6)


def test_any_leading_dimensions_match_a_loop():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 7)
    output, weights = anatomy.scaled_dot_product_attention(q, k, v)
    assert output.shape == (2, 3, 5, 7) and weights.shape == (2, 3, 5, 6)
    for b in range(2):
        for h in range(3):
            scores = q[b, h] @ k[b, h].T / math.sqrt(4)
            torch.testing.assert_close(weights[b, h], torch.softmax(scores, -1))
            torch.testing.assert_close(output[b, h], torch.softmax(scores, -1) @ v[b, h])


def test_mask_true_means_may_attend():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 3), torch.randn(1, 5, 3), torch.randn(1, 5, 3)
    mask = torch.tensor([True, True, False, True, False])
    _, weights = anatomy.scaled_dot_product_attention(q, k, v, mask)
    assert torch.all(weights[..., ~mask] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4))


def test_mask_must_be_boolean():
    q = torch.randn(2, 3)
    with pytest.raises(TypeError, match="boolean"):
        anatomy.scaled_dot_product_attention(q, q, q, mask=torch.ones(2, 2))


@pytest.mark.parametrize("kernel", [eager_attention, sdpa_attention])
def test_row_with_nothing_to_attend_to_is_zero_not_nan(kernel):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[False, False, False], [True, False, False], [True, True, True]])
    output, _ = kernel(q, k, v, mask)
    assert torch.all(output[:, :, 0] == 0)
    assert not torch.isnan(output).any()
    output.sum().backward()
    assert not any(torch.isnan(t.grad).any() for t in (q, k, v))


def test_eager_and_sdpa_kernels_agree():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    padding = torch.ones(2, 6, dtype=torch.bool)
    padding[1, 4:] = False
    bias = -torch.rand(4, 6, 6)
    for mask, is_causal in [(None, False), (causal_mask(6), True), (padding[:, None, None, :], False),
                            (causal_mask(6) & padding[:, None, None, :], False),
                            (causal_mask(6, window=3) & padding[:, None, None, :], False)]:
        for b in (None, bias):
            for scale in (None, 0.3):
                eager, _ = eager_attention(q, k, v, mask, bias=b, is_causal=is_causal, scale=scale)
                fused, _ = sdpa_attention(q, k, v, mask, bias=b, is_causal=is_causal, scale=scale)
                torch.testing.assert_close(eager, fused, atol=1e-5, rtol=1e-5)


def test_is_causal_is_a_hint_beside_the_mask_never_instead_of_it():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="give the mask"):
        eager_attention(q, q, q, None, is_causal=True)
    with pytest.raises(ValueError, match="soft-caps"):
        sdpa_attention(q, q, q, causal_mask(4), softcap=5.0)


def test_softcap_bounds_the_scores():
    q, k = torch.randn(1, 1, 3, 4) * 30, torch.randn(1, 1, 3, 4) * 30
    scores = []
    eager_attention(q, k, k, softcap=2.0, on_scores=lambda s: scores.append(s) or s)
    assert scores[0].abs().max() <= 2.0 and (q @ k.transpose(-2, -1)).abs().max() > 20
    expected = 2.0 * torch.tanh(q @ k.transpose(-2, -1) / 2.0 / 2.0)  # scale 1/sqrt(4) = 1/2
    torch.testing.assert_close(scores[0], expected)


def test_sliding_window_mask_keeps_the_last_w_keys():
    mask = causal_mask(3, 6, offset=3, window=2)  # queries at positions 3, 4, 5
    assert mask.int().tolist() == [[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]]
    # a window that reaches the first key changes nothing, and the fused kernel's flag may stand for it
    full, is_causal = self_attention_mask(None, 4, causal=True, window=4)
    assert is_causal and torch.equal(full, causal_mask(4))
    cut, is_causal = self_attention_mask(None, 4, causal=True, window=2)
    assert not is_causal and torch.equal(cut, causal_mask(4, window=2))


def test_causal_mask_with_cached_offset():
    # Two new queries after three cached keys: query 0 is absolute position 3.
    mask = causal_mask(2, 5, offset=3)
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    mask, is_causal = self_attention_mask(None, 4, causal=True)
    assert is_causal and torch.equal(mask, causal_mask(4))  # the mask is always built, the flag is a hint


def test_cross_attention_scores_are_rectangular():
    # Seed 000: 8 target positions query 4 source positions.
    torch.manual_seed(0)
    target, source = torch.randn(8, 4), torch.randn(4, 4)
    w_q, w_k, w_v = torch.randn(4, 4), torch.randn(4, 4), torch.randn(4, 4)
    output, weights = anatomy.scaled_dot_product_attention(target @ w_q, source @ w_k, source @ w_v)
    assert weights.shape == (8, 4) and output.shape == (8, 4)
