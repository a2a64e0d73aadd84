"""The heads on top of a stack: the LM head (hidden states -> vocabulary logits), BERT's pooler,
and pooling of a sequence into one vector.

Shape letters: B batch, T positions, E model width (d_embed for the LM head), V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .layers import ACTIVATIONS, make_norm
from .losses import chunked_cross_entropy, vocabulary_logits


class VocabularyProjection(nn.Linear):
    """nn.Linear onto the vocabulary, h W^T + b, computed by vocabulary_logits: on the CPU a block of
    1024 vocabulary rows at a time, which is faster there for a large vocabulary, with equal logits."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return vocabulary_logits(x, self.weight, self.bias)


class LMHead(nn.Module):
    """Hidden states -> vocabulary logits, optionally through a transform (dense, act, norm; BERT)."""

    def __init__(self, config: ModelConfig, token_embedding: nn.Embedding):
        super().__init__()
        if config.lm_head_transform:
            self.transform_dense = nn.Linear(config.d_model, config.d_model)
            self.transform_act = ACTIVATIONS[config.activation][0]
            self.transform_norm = make_norm(config)
        self.proj = VocabularyProjection(config.d_embed, config.vocab_size, bias=config.lm_head_bias)
        if config.tie_embeddings:
            self.proj.weight = token_embedding.weight  # the paper, 3.4: one matrix for both
        self.softcap = config.final_logit_softcap  # logits -> c * tanh(logits / c) (Gemma 2)
        self.rescale = config.d_model ** -0.5 if config.lm_head_rescale else 1.0

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "transform_dense"):
            x = self.transform_norm(self.transform_act(self.transform_dense(x)))
        if self.rescale != 1.0:
            x = x * self.rescale  # T5: a tied head reads h / sqrt(d_model)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.proj(self.transform(x))  # (B, T, V)
        if self.softcap is not None:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return logits

    def token_logits(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """[..., E] -> [..., n]: the logits of the tokens `ids` [n] only, the columns `ids` of
        forward(x) without the other V − n (the logit lens's chosen targets)."""
        bias = None if self.proj.bias is None else self.proj.bias[ids]
        logits = F.linear(self.transform(x), self.proj.weight[ids], bias)  # (..., n)
        if self.softcap is not None:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return logits

    def loss(self, x: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, *,
             label_smoothing: float = 0.0, reduction: str = "mean") -> torch.Tensor:
        """F.cross_entropy(self(x), targets, ignore_index=..., label_smoothing=..., reduction=...),
        without the logits.

        x [B, T, E], targets [B, T]. The logits [B, T, V] of a training batch are hundreds of MB
        (8 x 128 x 50257 floats: 206 MB, and as much again for their gradient); this computes them
        a chunk of positions at a time (see chunked_cross_entropy) and never holds them all.
        """
        hidden = self.transform(x).flatten(0, -2)  # (N, E), N = B*T
        return chunked_cross_entropy(hidden, self.proj.weight, self.proj.bias, targets.flatten(), ignore_index,
                                     label_smoothing=label_smoothing, reduction=reduction, softcap=self.softcap)


class Pooler(nn.Module):
    """BERT's pooler: act(W h + b) on the pooled vector; act is tanh (BERT, RoBERTa) or ReLU (DistilBERT)."""

    def __init__(self, d_model: int, activation: str = "tanh"):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = {"tanh": torch.tanh, "relu": F.relu}[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


def pool(hidden: torch.Tensor, padding_mask: torch.Tensor | None, how: str) -> torch.Tensor:
    """[B, T, E] -> [B, E]: the first token's state ("first", BERT's [CLS]), the mean over real
    (unpadded) tokens ("mean", sum_t m_t h_t / sum_t m_t), or their element-wise maximum ("max")."""
    if how == "first":
        return hidden[:, 0]
    if padding_mask is None:
        return hidden.amax(dim=1) if how == "max" else hidden.mean(dim=1)
    if how == "max":
        return hidden.masked_fill(~padding_mask[:, :, None], torch.finfo(hidden.dtype).min).amax(dim=1)
    weights = padding_mask.to(hidden.dtype)[:, :, None]  # (B, T, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
