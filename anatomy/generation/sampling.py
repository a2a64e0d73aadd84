"""Choosing the next token by sampling: temperature, top-k and top-p (nucleus) filtering.

Shape letters: B batch (rows), V vocabulary.

    x_t ~ softmax(filter(logits / temperature))

Each filter sets the logits of the tokens it removes to -inf, so that softmax gives them
probability 0 and the rest keep their relative odds.
"""

from __future__ import annotations

import math

import torch


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row and set the others to -inf. [..., V] -> [..., V].

    Tokens tied with the k-th largest logit are kept too (so a row may keep more than k).
    """
    k = min(k, logits.size(-1))
    kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth_largest, -math.inf)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al., 2020): keep the smallest set of most probable tokens
    whose total probability is at least p, set the others to -inf. [..., V] -> [..., V].

        V_p = the smallest V' (taken in order of decreasing probability) with sum_{x in V'} P(x) >= p

    Sorting the probabilities P_(1) >= P_(2) >= ..., token (i) is kept exactly when the tokens
    ranked above it hold less than p: sum_{j < i} P_(j) < p. The most probable token is always
    kept. p = 1 keeps every token.
    """
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V)
    sorted_probs = torch.softmax(sorted_logits.float(), dim=-1)
    mass_above = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # sum_{j < i} P_(j)
    remove_sorted = mass_above >= p
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)  # back to vocabulary order
    return logits.masked_fill(remove, -math.inf)


def sampling_distribution(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                          top_p: float | None = None) -> torch.Tensor:
    """logits [B, V] -> the probabilities that `sample` draws from, [B, V]:

        softmax(filter(logits / temperature))

    with the filters applied in the order top-k, then top-p. temperature < 1 sharpens the
    distribution (towards greedy), > 1 flattens it (towards uniform).

    The largest logit is subtracted first (softmax and both filters are unchanged by a shift), so
    that a tiny temperature (even one that rounds to 0 in the logits' dtype) sends every other
    logit to -inf, never to +inf or NaN: the distribution becomes the argmax's, as T -> 0 does.
    """
    shifted = logits - logits.amax(dim=-1, keepdim=True)  # <= 0; the largest is 0 and stays 0
    logits = torch.where(shifted == 0, shifted, shifted / temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return torch.softmax(logits, dim=-1)
