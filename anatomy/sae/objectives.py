"""What an SAE minimises in training, by kind, and the sparse step that makes TopK training cheap.

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

The TopK step computes what it needs and nothing else. The encoder's pre-activations of the whole
batch are one dense product [B, E] x [E, F], without gradient; only K (and A) of the F entries per
row are used, so the rest is built from the chosen (row, feature) pairs alone:

    z_bj    = pre[b, idx_bj]                                         chosen pre-activations  [B, K]
    y^_b    = sum_j ReLU(z_bj) W_dec[idx_bj] + b_dec                 F.embedding_bag         [B, O]
    dL/dW_enc[:, c] = sum_{(b,j): idx_bj = c} dL/dz_bj (x_b - b_dec)  F.embedding_bag, rows by feature

so no [B, F] tensor has a gradient, and the decoder never multiplies by F - K zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .modules import SAE, batch_topk


class _Chosen(torch.autograd.Function):
    """z = pre[b, idx_bj], pre = (x - b_dec) W_enc + b_enc: values from the dense no-grad product, gradients
    for W_enc, b_enc and b_dec computed from the chosen pairs alone.

        dL/dW_enc[:, c] = sum_{(b,j): idx_bj = c} g_bj (x_b - b_dec)       dL/db_enc[c] = sum_{idx_bj = c} g_bj
        dL/db_dec = -sum_b sum_j g_bj W_enc[:, idx_bj] = -W_enc dL/db_enc   (x is data: no gradient)
    """

    @staticmethod
    def forward(ctx, x_c, b_dec, W_enc, b_enc, idx, values):  # (B, E), (E,) or None, (E, F), (F,), (B, K), (B, K)
        ctx.save_for_backward(x_c, W_enc, idx)
        ctx.subtracts_b_dec = b_dec is not None
        return values.clone()

    @staticmethod
    def backward(ctx, grad):  # (B, K)
        x_c, W_enc, idx = ctx.saved_tensors
        n_features = W_enc.size(1)
        features = idx.flatten()  # (B*K,): the feature of each chosen pair
        weights = grad.flatten()
        grad_b_enc = torch.zeros(n_features, dtype=grad.dtype, device=grad.device).index_add_(0, features, weights)
        grad_W_enc = None
        if ctx.needs_input_grad[2]:
            rows = torch.arange(idx.size(0), device=idx.device).repeat_interleave(idx.size(1))  # (B*K,): each pair's row
            order = torch.argsort(features, stable=True)  # the pairs grouped by feature: one bag per feature
            counts = torch.bincount(features, minlength=n_features)
            offsets = torch.cumsum(counts, 0) - counts  # (F,)
            by_feature = F.embedding_bag(rows[order], x_c, offsets, mode="sum", per_sample_weights=weights[order])
            grad_W_enc = by_feature.T  # (F, E) -> (E, F)
        grad_b_dec = -(W_enc @ grad_b_enc) if ctx.subtracts_b_dec and ctx.needs_input_grad[1] else None
        return None, grad_b_dec, grad_W_enc, grad_b_enc if ctx.needs_input_grad[3] else None, None, None


def sparse_decode(idx: torch.Tensor, acts: torch.Tensor, W_dec: torch.Tensor) -> torch.Tensor:
    """[B, K] feature ids and their activations -> [B, O] = sum_j acts_bj W_dec[idx_bj] (no bias)."""
    return F.embedding_bag(idx, W_dec, mode="sum", per_sample_weights=acts)


def _chosen(sae: SAE, x: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """[B, K]: the pre-activations at idx (values), differentiable in the SAE's parameters (see _Chosen)."""
    b_dec = sae.b_dec if sae.apply_b_dec_to_input else None
    x_c = (x - sae.b_dec.detach()) if b_dec is not None else x
    return _Chosen.apply(x_c, b_dec, sae.W_enc, sae.b_enc, idx, values)


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
    """(loss, {"mse", "aux", "fired" [F] bool, "recon" [B, O] detached}) of a TopK SAE on x [B, E] -> y [B, O]."""
    with torch.no_grad():
        pre = _pre_activations(sae, x)  # (B, F): the one dense product of the step
        values, idx = pre.topk(sae.k, dim=-1, sorted=False)  # (B, K)
    z = _chosen(sae, x, idx, values)
    acts = F.relu(z)
    recon = sparse_decode(idx, acts, sae.W_dec) + sae.b_dec + skip_path(sae, x)  # (B, O)
    loss = reconstruction = mse(recon, y)
    fired = torch.zeros(sae.d_sae, dtype=torch.bool, device=x.device)
    fired[idx[acts > 0]] = True
    aux = _aux_k(sae, x, pre, recon, y, dead, aux_k, aux_coefficient)
    if aux is not None:
        loss = loss + aux
    return loss, {"mse": reconstruction.detach(), "aux": aux.detach() if aux is not None else None,
                  "fired": fired, "recon": recon.detach(), "l0": (acts > 0).sum(-1).float().mean().detach()}


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
    z = _chosen(sae, x, idx, values)
    error = (y - recon).detach()  # what the live features left
    predicted = sparse_decode(idx, F.relu(z), sae.W_dec)  # (B, O)
    return coefficient * min(n_dead / aux_k, 1.0) * mse(predicted, error)


def dense_step(sae: SAE, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor | None, *, l1: float = 0.0,
               l0: float = 0.0, bandwidth: float = 1e-3, aux_k: int = 0, aux_coefficient: float = 0.0
               ) -> tuple[torch.Tensor, dict]:
    """(loss, stats) of a relu, jumprelu or batchtopk SAE: the whole [B, F] activations, autograd throughout."""
    pre = _pre_activations(sae, x)  # (B, F)
    if sae.kind == "jumprelu":
        acts = _JumpReLU.apply(pre, sae.threshold, bandwidth)
        sparsity = l0 * _Step.apply(pre, sae.threshold, bandwidth).sum(-1).mean()
    elif sae.kind == "batchtopk":
        acts = batch_topk(pre, sae.k)
        sparsity = None
    else:
        acts = F.relu(pre)
        sparsity = l1 * acts.sum(-1).mean()
    recon = acts @ sae.W_dec + sae.b_dec + skip_path(sae, x)
    loss = reconstruction = mse(recon, y)
    if sparsity is not None:
        loss = loss + sparsity
    aux = _aux_k(sae, x, pre.detach(), recon, y, dead, aux_k, aux_coefficient) \
        if sae.kind == "batchtopk" else None
    if aux is not None:
        loss = loss + aux
    active = acts > 0
    return loss, {"mse": reconstruction.detach(), "aux": aux.detach() if aux is not None else None,
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
