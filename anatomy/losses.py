"""The language-modelling loss, computed without holding every logit.

Shape letters: N rows (positions with a target, flattened over the batch), E model width,
V vocabulary, C rows in one chunk.

    L = -(1/n) sum_t log softmax(h_t W^T + b)[target_t]          (mean next-token cross-entropy)

The logits of a training batch are large (8 x 128 positions x 50257 tokens = 206 MB, and as
much again for their gradient). Because the gradient of softmax cross-entropy is local to each
row, the rows can be processed a chunk at a time: the chunk's logits exist only while its loss
and gradients are computed. Measured in BENCHMARKS.md: 1.25x the transformers training step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of the logits h W^T + b against targets, a chunk of rows at a time.

    The gradients of softmax cross-entropy are local to each row, so forward computes them
    along with the loss while a chunk's logits exist, and backward only scales them:

        dL/dlogits = (softmax(logits) - onehot(target)) / n     (n: rows with a target)
        dL/dh = dL/dlogits W,   dL/dW = sum over chunks of dL/dlogits^T h,   dL/db = sum of dL/dlogits
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, ignore_index: int, chunk: int):
        real = targets != ignore_index  # (N,)
        count = real.sum().clamp(min=1)
        safe_targets = targets.masked_fill(~real, 0)  # any valid index; their rows are zeroed below
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_hidden = torch.empty_like(hidden)  # (N, E)
        grad_weight = torch.zeros_like(weight)  # (V, E)
        grad_bias = torch.zeros_like(bias) if bias is not None else None
        for start in range(0, hidden.size(0), chunk):
            rows = slice(start, start + chunk)
            h, t, keep = hidden[rows], safe_targets[rows, None], real[rows, None]  # (C, E), (C, 1), (C, 1)
            log_p = torch.log_softmax(F.linear(h, weight, bias).float(), dim=-1)  # (C, V)
            total -= log_p.gather(1, t).masked_fill(~keep, 0.0).sum()
            grad = log_p.exp_()  # softmax(logits), in place
            grad.scatter_add_(1, t, -keep.to(grad.dtype))  # - onehot(target)
            grad = grad.mul_(keep / count).to(weight.dtype)  # rows without a target contribute nothing
            torch.mm(grad, weight, out=grad_hidden[rows])
            grad_weight.addmm_(grad.t(), h)
            if grad_bias is not None:
                grad_bias += grad.sum(dim=0)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        return (total / count).to(hidden.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        return (grad_hidden * grad_loss, grad_weight * grad_loss,
                None if grad_bias is None else grad_bias * grad_loss, None, None, None)


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          targets: torch.Tensor, ignore_index: int = -100, chunk_bytes: int = 16 * 2**20) -> torch.Tensor:
    """= F.cross_entropy(F.linear(hidden, weight, bias), targets, ignore_index=ignore_index).

    hidden [N, E], weight [V, E], targets [N]. Rows go through in chunks whose logits take at most
    `chunk_bytes` (16 MB: 83 rows for GPT-2's 50257 tokens): memory is one chunk's logits instead
    of all of them, and buffers that small are reused by the allocator instead of being mapped
    fresh, page fault by page fault, at every step (measured in BENCHMARKS.md). Without autograd
    (torch.no_grad, or nothing requires grad), only the loss is computed.
    """
    chunk = max(1, chunk_bytes // (weight.size(0) * 4))
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias))
    if needs_grad:
        return _ChunkedCrossEntropy.apply(hidden, weight, bias, targets, ignore_index, chunk)
    total, count = hidden.new_zeros((), dtype=torch.float32), (targets != ignore_index).sum().clamp(min=1)
    for start in range(0, hidden.size(0), chunk):
        logits = F.linear(hidden[start:start + chunk], weight, bias).float()  # (C, V)
        total += F.cross_entropy(logits, targets[start:start + chunk], ignore_index=ignore_index, reduction="sum")
    return (total / count).to(hidden.dtype)
