"""What an SAE minimises in training, by kind, and the sparse step that makes (Batch)TopK training cheap.

Shape letters: B rows in the batch, E input width, O output width, F features, K active features per
row, A auxiliary (dead) features per row.

Every kind reconstructs its target y (x itself for an SAE, the MLP's output for a transcoder):

    L = ||y - y^||^2  (summed over O, averaged over the batch)  + the kind's sparsity term

(y^ includes a skip transcoder's x W_skip^T, a dense product trained with the rest.)

    relu       + lambda sum_i f_i                     the L1 penalty (decoder rows kept at unit norm,
                                                      so that it cannot be dodged by growing them)
    jumprelu   + lambda sum_i H(pre_i - theta_i)      the L0 itself, through a straight-through estimator
                                                      for theta (Rajamanoharan et al. 2024, "Jumping Ahead")
    topk       + alpha L_aux                          AuxK: the A largest pre-activations of the dead
    batchtopk  + alpha L_aux                          features reconstruct the error y - y^ (Gao et al.
                                                      2024, appendix A.2), so that they come back to life

L_aux = ||(y - y^) - e^||^2 with e^ = sum over the A dead features chosen of f_j W_dec[j] (no bias),
scaled, as SAELens scales it, by min(dead / A, 1).

The TopK and BatchTopK steps compute what they need and nothing else. The encoder's pre-activations
of the whole batch are one dense product [B, E] x [E, F], without gradient; only the chosen
(row r_p, feature c_p) pairs are used (K a row for TopK, k B over the batch for BatchTopK), so the
rest is built from them alone:

    z_p     = pre[r_p, c_p]                                          chosen pre-activations  [P]
    y^_b    = sum_{p: r_p = b} ReLU(z_p) W_dec[c_p] + b_dec          F.embedding_bag         [B, O]
    dL/dW_enc[:, c] = sum_{p: c_p = c} dL/dz_p (x_{r_p} - b_dec)      F.embedding_bag, pairs by feature

so no [B, F] tensor has a gradient, and the decoder never multiplies by F - K zeros.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .modules import SAE


class _Chosen(torch.autograd.Function):
    """z_p = pre[r_p, c_p] for the chosen pairs p = (row r_p, feature c_p), pre = (x - b_dec) W_enc + b_enc:
    values from the dense no-grad product, gradients for W_enc, b_enc and b_dec from the pairs alone.

        dL/dW_enc[:, c] = sum_{p: c_p = c} g_p (x_{r_p} - b_dec)       dL/db_enc[c] = sum_{p: c_p = c} g_p
        dL/db_dec = -sum_p g_p W_enc[:, c_p] = -W_enc dL/db_enc       (x is data: no gradient)
    """

    @staticmethod
    def forward(ctx, x_c, b_dec, W_enc, b_enc, rows, features, values):  # (B, E), (E,) or None, (E, F), (F,), (P,) x3
        ctx.save_for_backward(x_c, W_enc, rows, features)
        ctx.subtracts_b_dec = b_dec is not None
        return values.clone()

    @staticmethod
    def backward(ctx, grad):  # (P,)
        x_c, W_enc, rows, features = ctx.saved_tensors
        n_features = W_enc.size(1)
        grad_b_enc = torch.zeros(n_features, dtype=grad.dtype, device=grad.device).index_add_(0, features, grad)
        grad_W_enc = None
        if ctx.needs_input_grad[2]:
            order = torch.argsort(features, stable=True)  # the pairs grouped by feature: one bag per feature
            counts = torch.bincount(features, minlength=n_features)
            offsets = torch.cumsum(counts, 0) - counts  # (F,)
            by_feature = F.embedding_bag(rows[order], x_c, offsets, mode="sum", per_sample_weights=grad[order])
            grad_W_enc = by_feature.T  # (F, E) -> (E, F)
        grad_b_dec = -(W_enc @ grad_b_enc) if ctx.subtracts_b_dec and ctx.needs_input_grad[1] else None
        return None, grad_b_dec, grad_W_enc, grad_b_enc if ctx.needs_input_grad[3] else None, None, None, None


def sparse_decode(features: torch.Tensor, acts: torch.Tensor, W_dec: torch.Tensor,
                  offsets: torch.Tensor | None = None) -> torch.Tensor:
    """-> [B, O] = sum over each row's pairs of acts_p W_dec[c_p] (no bias): features and acts [B, K] (K pairs
    a row), or [P] with offsets [B], where each row's pairs start (pairs sorted by row)."""
    return F.embedding_bag(features, W_dec, offsets, mode="sum", per_sample_weights=acts)


def _chosen(sae: SAE, x: torch.Tensor, rows: torch.Tensor, features: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """[P]: the pre-activations of the pairs (rows, features), `values`, differentiable in the SAE's parameters."""
    b_dec = sae.b_dec if sae.apply_b_dec_to_input else None
    x_c = (x - sae.b_dec.detach()) if b_dec is not None else x
    return _Chosen.apply(x_c, b_dec, sae.W_enc, sae.b_enc, rows, features, values)


def _pre_activations(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    """[B, F] = (x - a b_dec) W_enc + b_enc, with gradients (the dense kinds)."""
    return (x - sae.b_dec if sae.apply_b_dec_to_input else x) @ sae.W_enc + sae.b_enc


def skip_path(sae: SAE, x: torch.Tensor) -> torch.Tensor | float:
    """[B, O] = x W_skip^T for a skip transcoder; 0 otherwise."""
    return x @ sae.W_skip.T if sae.W_skip is not None else 0.0


def mse(y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """||y - y^||^2 summed over the vector, averaged over the batch (SAELens's mse_loss)."""
    return (y_hat - y).pow(2).sum(-1).mean()


def topk_step(sae: SAE, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor | None, aux_k: int,
              aux_coefficient: float) -> tuple[torch.Tensor, dict]:
    """(loss, stats) of a TopK SAE on x [B, E] -> y [B, O]: each row's k largest pre-activations."""
    with torch.no_grad():
        pre = _pre_activations(sae, x)  # (B, F): the one dense product of the step
        values, idx = pre.topk(sae.k, dim=-1, sorted=False)  # (B, K)
        rows = torch.arange(x.size(0), device=x.device).repeat_interleave(sae.k)  # (B K,): each pair's row
    return _sparse_step(sae, x, y, dead, pre, rows, idx.flatten(), values.flatten(), None, aux_k, aux_coefficient)


def batchtopk_step(sae: SAE, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor | None, aux_k: int,
                   aux_coefficient: float) -> tuple[torch.Tensor, dict]:
    """(loss, stats) of a BatchTopK SAE on x [B, E] -> y [B, O]: the floor(k B) largest entries of ReLU(pre)
    over the whole batch (modules.batch_topk, the same pairs), computed sparsely as TopK is."""
    n_rows, n_features = x.size(0), sae.d_sae
    with torch.no_grad():
        pre = _pre_activations(sae, x)  # (B, F)
        count = min(pre.numel(), max(1, math.floor(sae.k * n_rows)))
        flat, _ = largest(pre.relu().flatten(), count)  # (P,) over (B F,)
        flat, _ = flat.sort()  # by row, then feature: each row's pairs contiguous
        rows, features = flat // n_features, flat % n_features
        counts = torch.bincount(rows, minlength=n_rows)
        offsets = torch.cumsum(counts, 0) - counts  # (B,): where each row's pairs start
    return _sparse_step(sae, x, y, dead, pre, rows, features, pre.flatten()[flat], offsets, aux_k, aux_coefficient)


def largest(values: torch.Tensor, count: int, stride: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, values) of the `count` largest of the 1-D `values`: the pairs values.topk(count) gives, found
    among the candidates above a threshold read from every stride-th value (the (1.5 count / stride)-th largest
    of them), exactly: when fewer than `count` candidates pass, it is values.topk itself. A quarter of topk's
    time on a batch's 4.7 M pre-activations."""
    sample = values[::stride]
    above = min(sample.numel(), max(1, math.ceil(1.5 * count / stride)))
    threshold = sample.kthvalue(sample.numel() - above + 1).values  # the above-th largest of the sample
    candidates = (values >= threshold).nonzero().squeeze(1)  # (C,)
    if candidates.numel() < count:
        chosen, indices = values.topk(count, sorted=False)
        return indices, chosen
    chosen, within = values[candidates].topk(count, sorted=False)
    return candidates[within], chosen


def _sparse_step(sae, x, y, dead, pre, rows, features, values, offsets, aux_k, aux_coefficient) -> tuple[torch.Tensor, dict]:
    """(loss, {"mse", "aux", "fired" [F] bool, "recon" [B, O], "l0", "acts" [P]}) from the chosen pairs."""
    z = _chosen(sae, x, rows, features, values)
    acts = F.relu(z)
    if offsets is None:  # k pairs a row: the [B, K] form
        recon = sparse_decode(features.view(x.size(0), -1), acts.view(x.size(0), -1), sae.W_dec)
    else:
        recon = sparse_decode(features, acts, sae.W_dec, offsets)
    recon = recon + sae.b_dec + skip_path(sae, x)  # (B, O)
    loss = reconstruction = mse(recon, y)
    on = acts > 0
    fired = torch.zeros(sae.d_sae, dtype=torch.bool, device=x.device)
    fired[features[on]] = True
    aux = _aux_k(sae, x, pre, recon, y, dead, aux_k, aux_coefficient)
    if aux is not None:
        loss = loss + aux
    return loss, {"mse": reconstruction.detach(), "aux": aux.detach() if aux is not None else None, "fired": fired,
                  "recon": recon.detach(), "l0": on.sum().float() / x.size(0), "acts": acts.detach()}


def _aux_k(sae, x, pre, recon, y, dead, aux_k, coefficient) -> torch.Tensor | None:
    """alpha min(n_dead / A, 1) ||(y - y^) - e^||^2, e^ from the A largest pre-activations among dead features."""
    if dead is None or coefficient == 0:
        return None
    n_dead = int(dead.sum())
    if n_dead == 0:
        return None
    chosen = min(aux_k, n_dead)
    with torch.no_grad():
        values, idx = pre.masked_fill(~dead, float("-inf")).topk(chosen, dim=-1, sorted=False)  # (B, A)
    rows = torch.arange(x.size(0), device=x.device).repeat_interleave(chosen)  # (B A,)
    z = _chosen(sae, x, rows, idx.flatten(), values.flatten()).view_as(values)
    error = (y - recon).detach()  # what the live features left
    predicted = sparse_decode(idx, F.relu(z), sae.W_dec)  # (B, O)
    return coefficient * min(n_dead / aux_k, 1.0) * mse(predicted, error)


def dense_step(sae: SAE, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor | None, *, l1: float = 0.0,
               l0: float = 0.0, bandwidth: float = 1e-3) -> tuple[torch.Tensor, dict]:
    """(loss, stats) of a relu or jumprelu SAE: the whole [B, F] activations, autograd throughout."""
    pre = _pre_activations(sae, x)  # (B, F)
    if sae.kind == "jumprelu":
        acts = _JumpReLU.apply(pre, sae.threshold, bandwidth)
        sparsity = l0 * _Step.apply(pre, sae.threshold, bandwidth).sum(-1).mean()
    else:
        acts = F.relu(pre)
        sparsity = l1 * acts.sum(-1).mean()
    recon = acts @ sae.W_dec + sae.b_dec + skip_path(sae, x)
    loss = reconstruction = mse(recon, y)
    loss = loss + sparsity
    active = acts > 0
    return loss, {"mse": reconstruction.detach(), "aux": None,
                  "fired": active.any(0), "recon": recon.detach(), "l0": active.sum(-1).float().mean(),
                  "acts": acts.detach()}


# JumpReLU's straight-through estimators (Rajamanoharan et al. 2024, eq. 11-12): the derivative of the step
# H(pre - theta) with respect to theta is replaced by a rectangle kernel of width `bandwidth` around it.
def _rectangle(u: torch.Tensor) -> torch.Tensor:
    return ((u > -0.5) & (u < 0.5)).to(u.dtype)


class _Step(torch.autograd.Function):
    """H(pre - theta); d/d theta ~ -(1/eps) K((pre - theta)/eps); no gradient to pre."""

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        kernel = _rectangle((pre - threshold) / ctx.bandwidth) / ctx.bandwidth
        return None, -(kernel * grad).sum(0), None


class _JumpReLU(torch.autograd.Function):
    """pre H(pre - theta); d/d pre = H; d/d theta ~ -(theta/eps) K((pre - theta)/eps)."""

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        kernel = _rectangle((pre - threshold) / ctx.bandwidth) / ctx.bandwidth
        return (pre > threshold).to(grad.dtype) * grad, -(threshold * kernel * grad).sum(0), None
