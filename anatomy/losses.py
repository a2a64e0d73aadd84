"""The language-modelling loss, computed without holding every logit.

Shape letters: N rows (positions, flattened over the batch), E model width, V vocabulary,
C rows in one chunk.

    L = -(1/n) sum_t log softmax(h_t W^T + b)[target_t]          (mean next-token cross-entropy)

With label smoothing eps (the paper, section 5.4: eps = 0.1), the target is a mixture of the
one-hot label and the uniform distribution over the V tokens, as in F.cross_entropy:

    L_t = (1 - eps) * (-log p_t[target_t]) + eps * (1/V) sum_v (-log p_t[v])

Rows whose target is ignore_index (padding, the last position) count for nothing, and n counts
only the others. The logits of a training batch are large (8 x 128 positions x 50257 tokens =
206 MB, and as much again for their gradient). Because the gradient of softmax cross-entropy
is local to each row, the rows can be processed a chunk at a time: the chunk's logits exist
only while its loss and gradients are computed. Measured in BENCHMARKS.md.

Both the loss and the LM head (heads.py) compute the logits h W^T + b with vocabulary_logits,
which on the CPU takes the vocabulary a block of rows at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

REDUCTIONS = ("mean", "sum")
VOCABULARY_BLOCK = 1024  # rows of the weight per product in vocabulary_logits


def vocabulary_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """logits = h W^T + b = F.linear(hidden, weight, bias), a block of vocabulary rows at a time.

    hidden [..., E], weight [V, E] -> [..., V]. Each logit is the same dot product over E either
    way: equal to float32 rounding (the BLAS may pick another kernel for a small block; at GPT-2's
    shapes, bitwise). On the CPU, one matrix product whose output is 50257 columns wide
    runs far below the machine's rate: GPT-2's head on 128 positions takes 173 ms at once and 114 ms
    as 50 products of 1024 columns (measured in BENCHMARKS.md).

    The single product is kept where blocks do not pay: other devices, small vocabularies, a single
    row (decoding one sequence: a matrix-vector product, 11.4 vs 12.9 ms), autocast (the product
    picks the dtype), and autograd, where writing blocks into one tensor would copy the whole
    gradient once per block.
    """
    vocab = weight.size(0)
    tracked = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    one_row = hidden.numel() == hidden.size(-1)
    if (hidden.device.type != "cpu" or vocab <= 2 * VOCABULARY_BLOCK or one_row or tracked
            or torch.is_autocast_enabled(hidden.device.type)):
        return F.linear(hidden, weight, bias)
    logits = hidden.new_empty(*hidden.shape[:-1], vocab)  # (..., V)
    for start in range(0, vocab, VOCABULARY_BLOCK):
        block = slice(start, start + VOCABULARY_BLOCK)
        logits[..., block] = F.linear(hidden, weight[block], None if bias is None else bias[block])  # (..., 1024)
    return logits


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Cross-entropy of the logits h W^T + b against targets, a chunk of rows at a time.

    The gradients of softmax cross-entropy are local to each row, so forward computes them
    along with the loss while a chunk's logits exist, and backward only scales them:

        dL/dlogits = (softmax(logits) - (1 - eps) onehot(target) - eps / V) / n   (rows with a target)
        dL/dh = dL/dlogits W,   dL/dW = sum over chunks of dL/dlogits^T h,   dL/db = sum of dL/dlogits

    n is the number of rows with a target for reduction "mean", 1 for "sum".
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, ignore_index: int, label_smoothing: float, softcap, divisor,
                chunk: int):
        real = targets != ignore_index  # (N,)
        safe_targets = targets.masked_fill(~real, 0)  # any valid index; their rows are zeroed below
        eps, vocab = label_smoothing, weight.size(0)
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_hidden = torch.empty_like(hidden)  # (N, E)
        grad_weight = torch.zeros_like(weight)  # (V, E)
        grad_bias = torch.zeros_like(bias) if bias is not None else None
        for start in range(0, hidden.size(0), chunk):
            rows = slice(start, start + chunk)
            h, t, keep = hidden[rows], safe_targets[rows, None], real[rows, None]  # (C, E), (C, 1), (C, 1)
            logits = vocabulary_logits(h, weight, bias).float()  # (C, V)
            if softcap is not None:
                capped = torch.tanh(logits / softcap)
                logits = softcap * capped
            log_p = torch.log_softmax(logits, dim=-1)  # (C, V)
            row_loss = -log_p.gather(1, t)  # (C, 1)
            if eps > 0.0:
                row_loss = (1.0 - eps) * row_loss - (eps / vocab) * log_p.sum(dim=-1, keepdim=True)
            total += row_loss.masked_fill(~keep, 0.0).sum()
            grad = log_p.exp_()  # softmax(logits), in place
            grad.scatter_add_(1, t, -(1.0 - eps) * keep.to(grad.dtype))  # - (1 - eps) onehot(target)
            if eps > 0.0:
                grad.sub_(eps / vocab)
            grad = grad.mul_(keep / divisor)  # rows without a target contribute nothing
            if softcap is not None:
                grad.mul_(1.0 - capped * capped)  # d/dz c tanh(z / c) = 1 - tanh^2(z / c)
            grad = grad.to(weight.dtype)
            torch.mm(grad, weight, out=grad_hidden[rows])
            grad_weight.addmm_(grad.t(), h)
            if grad_bias is not None:
                grad_bias += grad.sum(dim=0)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        return (total / divisor).to(hidden.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        return (grad_hidden * grad_loss, grad_weight * grad_loss,
                None if grad_bias is None else grad_bias * grad_loss, None, None, None, None, None, None)


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          targets: torch.Tensor, ignore_index: int = -100, *, label_smoothing: float = 0.0,
                          reduction: str = "mean", softcap: float | None = None,
                          chunk_bytes: int = 16 * 2**20) -> torch.Tensor:
    """= F.cross_entropy(F.linear(hidden, weight, bias), targets, ignore_index=ignore_index,
    label_smoothing=label_smoothing, reduction=reduction), without holding all the logits.
    With `softcap` c, the logits are soft-capped first, c * tanh(logits / c), as LMHead does (Gemma 2).

    hidden [N, E], weight [V, E], targets [N]. reduction "mean" divides by the number of targets
    that are not ignore_index, "sum" does not divide (the trainer divides by the count of a whole
    accumulated, distributed batch). Rows go through in chunks whose logits take at most
    `chunk_bytes` (16 MB: 83 rows for GPT-2's 50257 tokens): memory is one chunk's logits instead
    of all of them, and buffers that small are reused by the allocator instead of being mapped
    fresh, page fault by page fault, at every step (measured in BENCHMARKS.md). Without autograd
    (torch.no_grad, or nothing requires grad), only the loss is computed.
    Raises ValueError for a label_smoothing outside [0, 1] or an unknown reduction.
    """
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}; got {reduction!r}")
    chunk = max(1, chunk_bytes // (weight.size(0) * 4))
    divisor = (targets != ignore_index).sum().clamp(min=1) if reduction == "mean" else 1.0
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias))
    if needs_grad:
        return _ChunkedCrossEntropy.apply(hidden, weight, bias, targets, ignore_index, label_smoothing, softcap,
                                          divisor, chunk)
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.size(0), chunk):
        logits = vocabulary_logits(hidden[start:start + chunk], weight, bias).float()  # (C, V)
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        total += F.cross_entropy(logits, targets[start:start + chunk], ignore_index=ignore_index,
                                 label_smoothing=label_smoothing, reduction="sum")
    return (total / divisor).to(hidden.dtype)
