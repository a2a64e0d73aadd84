"""Positions: attention by itself is blind to order, so the position of each token must be added.

Shape letters: B batch, T positions, H heads, D head width, S key positions.

Six choices, named by ModelConfig.pos_encoding:
- "sinusoidal": a fixed table added to the token embeddings (the paper, Marian);
- "learned": a trained table added to the token embeddings (BERT, GPT-2);
- "rotary": queries and keys are rotated by an angle proportional to their position (Llama);
- "alibi": a penalty proportional to the query-key distance is added to the scores;
- "relative": a learned bias per head and per bucket of query-key distance is added to the scores (T5);
- "none": no position information at all (the model is then permutation-equivariant).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_table(n_positions: int, d_model: int, layout: str = "interleaved") -> torch.Tensor:
    """The paper's positional encoding, section 3.5, as a [n_positions, d_model] table.

        PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
        PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

    The frequency is indexed by the *pair* i = 0 .. d_model/2 - 1: dimensions 2i and 2i+1 share
    one frequency, one as a sine and one as a cosine. The "Transformer Anatomy" notes and Armas
    (2024) write the exponent with the dimension index instead of the pair index (10000^(2*dim/d)),
    which makes the frequencies fall twice as fast and pairs no sine with its own cosine; this
    follows the paper.

    layout "interleaved" puts sin, cos, sin, cos ... (the paper); "halves" puts every sine first
    and then every cosine (the Marian checkpoints), with the same frequencies.
    """
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (T, 1)
    pair = torch.arange(d_model // 2, dtype=torch.float64)[None, :]  # (1, d_model/2)
    angle = position / torch.pow(10000.0, 2 * pair / d_model)  # (T, d_model/2)
    table = torch.empty(n_positions, d_model, dtype=torch.float64)
    if layout == "interleaved":
        table[:, 0::2] = torch.sin(angle)
        table[:, 1::2] = torch.cos(angle)
    elif layout == "halves":
        table[:, : d_model // 2] = torch.sin(angle)
        table[:, d_model // 2 :] = torch.cos(angle)
    else:
        raise ValueError(f"unknown sinusoid layout {layout!r}; allowed: 'interleaved', 'halves'")
    return table.float()


class SinusoidalPositions(nn.Module):
    """A fixed table of sinusoids; forward(position_ids [B, T] or [T]) -> [.., T, d_model]."""

    def __init__(self, max_seq_len: int, d_model: int, layout: str = "interleaved"):
        super().__init__()
        # Not a parameter and not saved: the table is a formula, recomputed on load.
        self.register_buffer("table", sinusoidal_table(max_seq_len, d_model, layout), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids]


class LearnedPositions(nn.Embedding):
    """A trained vector per position (BERT, GPT-2); forward(position_ids) -> [.., T, d_model].

    With an offset, position p reads row p + offset: the first rows are never used by a real
    token (OPT and BART reserve 2; RoBERTa reserves pad_token_id + 1, its padding row included).
    """

    def __init__(self, n_positions: int, d_model: int, offset: int = 0):
        super().__init__(n_positions + offset, d_model)
        self.offset = offset

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(position_ids + self.offset)


def rope_frequencies(config, theta: float, scaling: str) -> torch.Tensor:
    """The rotation speed of each pair of rotated dimensions, w_j = theta^(-2j/r) (r = rotary_dim), [r/2].

    RoPE scaling stretches a trained model to longer contexts by slowing the rotations:
    - "linear" (Chen et al., 2023, position interpolation): every w_j / factor;
    - "llama3": wavelengths 2 pi / w_j longer than original_max_len / low_freq_factor are divided by
      factor, those shorter than original_max_len / high_freq_factor are kept, and the band between
      is interpolated, with s = (original_max_len / wavelength - low) / (high - low):
          w_j <- (1 - s) w_j / factor + s w_j
    """
    r = config.rotary_dim
    inv_freq = 1.0 / theta ** (torch.arange(0, r, 2, dtype=torch.float32) / r)  # (r/2,)
    factor = config.rope_scaling_factor
    if scaling == "linear":
        return inv_freq / factor
    if scaling == "llama3":
        low, high, original = config.rope_low_freq_factor, config.rope_high_freq_factor, config.rope_original_max_len
        wavelength = 2 * math.pi / inv_freq
        scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        in_between = (wavelength >= original / high) & (wavelength <= original / low)
        return torch.where(in_between, smoothed, scaled)
    return inv_freq


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoFormer): queries and keys are rotated by their position.

    The first r = rotary_dim dimensions of each head form r/2 pairs; pair j turns by the angle
    pos * w_j (see rope_frequencies); the other d_head - r dimensions pass unchanged (GPT-NeoX, GPT-J):

        rotate(x) = x * cos(pos * w) + rotate_pairs(x) * sin(pos * w)

    so that the score q_m . k_n depends on the positions only through m - n. The pairs are
    (j, j + r/2) in the "halves" layout (Llama, GPT-NeoX) and (2j, 2j + 1) in the "interleaved"
    layout (GPT-J, RoFormer's paper).
    """

    def __init__(self, d_head: int, max_seq_len: int, theta: float = 10000.0, *, rotary_dim: int | None = None,
                 layout: str = "halves", inv_freq: torch.Tensor | None = None):
        super().__init__()
        self.rotary_dim = d_head if rotary_dim is None else rotary_dim
        self.interleaved = layout == "interleaved"
        if inv_freq is None:  # w_j = theta^(-2j/r)
            inv_freq = 1.0 / theta ** (torch.arange(0, self.rotary_dim, 2, dtype=torch.float32) / self.rotary_dim)
        angle = torch.arange(max_seq_len, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (T, r/2)
        if self.interleaved:
            angle = angle.repeat_interleave(2, dim=-1)  # (T, r): dimensions 2j and 2j + 1 share an angle
        else:
            angle = torch.cat([angle, angle], dim=-1)  # (T, r): dimensions j and j + r/2 share an angle
        self.register_buffer("cos", angle.cos(), persistent=False)
        self.register_buffer("sin", angle.sin(), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """x [B, H, T, D], position_ids [B, T] or [T] -> x rotated, same shape."""
        cos = self.cos[position_ids].unsqueeze(-2)  # (T, 1, r) or (B, T, 1, r): the same rotation for every head
        sin = self.sin[position_ids].unsqueeze(-2)
        # Rotate in (B, T, H, D) order: heads split from a projection are a transposed view of that
        # memory, and elementwise work runs faster in memory order (0.32 vs 0.57 ms a call here, with backward).
        x = x.transpose(1, 2)  # (B, T, H, D)
        rotated, passed = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        partner = rotate_every_two(rotated) if self.interleaved else rotate_half(rotated)
        rotated = rotated * cos + partner * sin
        rotated = rotated if passed.size(-1) == 0 else torch.cat([rotated, passed], dim=-1)
        return rotated.transpose(1, 2)  # (B, H, T, D)

    @classmethod
    def from_config(cls, config, *, local: bool = False) -> "RotaryEmbedding":
        """The rotary embedding a ModelConfig describes; local=True: that of the sliding layers when
        they have their own base (rope_local_theta, unscaled: Gemma 3)."""
        theta, scaling = (config.rope_local_theta, "none") if local else (config.rope_theta, config.rope_scaling)
        return cls(config.d_head, config.max_seq_len, rotary_dim=config.rotary_dim, layout=config.rotary_layout,
                   inv_freq=rope_frequencies(config, theta, scaling))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[a, b] -> [-b, a] on the last axis, split in halves."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """[a0, b0, a1, b1, ...] -> [-b0, a0, -b1, a1, ...] on the last axis."""
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., r/2) each
    return torch.stack([-odd, even], dim=-1).flatten(-2)  # (..., r/2, 2) -> (..., r)


def relative_position_bucket(distance: torch.Tensor, *, bidirectional: bool, n_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """T5's bucket of each key - query distance (Raffel et al., 2020, section 2.1), a long tensor.

    Bidirectional: half the buckets for keys before the query, half for keys after. Causal: only
    keys before count (a later key gets bucket 0, and the mask hides it). Within a half, the
    first n/2 distances have a bucket each; the rest share log-spaced buckets up to max_distance,
    and farther distances all take the last bucket.
    """
    buckets = torch.zeros_like(distance)
    if bidirectional:
        n_buckets //= 2
        buckets = buckets + (distance > 0).long() * n_buckets  # keys after the query: the upper half
        distance = distance.abs()
    else:
        distance = (-distance).clamp(min=0)  # how far back the key is
    n_exact = n_buckets // 2
    log_spaced = n_exact + (
        torch.log(distance.float() / n_exact) / math.log(max_distance / n_exact) * (n_buckets - n_exact)
    ).long()
    log_spaced = log_spaced.clamp(max=n_buckets - 1)
    return buckets + torch.where(distance < n_exact, distance, log_spaced)


class RelativePositionBias(nn.Embedding):
    """T5's relative position bias: one learned scalar per (bucket, head), shared by every layer
    of a stack; forward(query_positions [T], key_positions [S]) -> bias [H, T, S] for the scores."""

    def __init__(self, n_buckets: int, n_heads: int, max_distance: int, *, bidirectional: bool):
        super().__init__(n_buckets, n_heads)
        self.max_distance = max_distance
        self.bidirectional = bidirectional

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        distance = key_positions[None, :] - query_positions[:, None]  # (T, S)
        buckets = relative_position_bucket(distance, bidirectional=self.bidirectional,
                                           n_buckets=self.num_embeddings, max_distance=self.max_distance)
        return super().forward(buckets).permute(2, 0, 1)  # (T, S, H) -> (H, T, S)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's head-specific slopes (Press et al., 2022): a geometric sequence starting at 2^(-8/n).

    For a head count that is not a power of two, the slopes of the next lower power of two are
    followed by every other slope of the next higher one, as in the paper's reference code.
    """
    def power_of_two_slopes(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two_slopes(n_heads)
    else:
        lower = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two_slopes(lower) + power_of_two_slopes(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """bias[h, t, s] = -slope_h * |pos_t - pos_s|: [H, T, S], added to the scores before the softmax.

    For causal attention only s <= t survive the mask, so this is the paper's -m (t - s); for
    bidirectional attention the distance is symmetric.
    """
    distance = (query_positions[:, None] - key_positions[None, :]).abs().to(slopes.dtype)  # (T, S)
    return -slopes[:, None, None] * distance  # (H, T, S)
