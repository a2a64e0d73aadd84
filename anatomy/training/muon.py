"""Muon (Jordan et al., 2024): momentum, orthogonalised by a few polynomial iterations, per weight matrix.

For a weight matrix W (n_out, n_in) with gradient g, Nesterov momentum mu (0.95):

    M = mu M + (1 - mu) g                          the momentum buffer, an average of gradients
    O = polar((1 - mu) g + mu M) ~ U V^T           where (1 - mu) g + mu M = U S V^T
    W -= lr (wd W + 0.2 sqrt(max(n_out, n_in)) O)  ("match_rms_adamw", Liu et al., 2025)

O is the nearest semi-orthogonal matrix to the momentum: every direction moves by the same amount,
however small its singular value. The 0.2 sqrt(max dim) factor gives O the RMS of a typical AdamW
update, so that --lr and --weight-decay keep their AdamW meaning.

polar(G) is approximated with odd quintic polynomials, applied to the singular values through X X^T:

    X_0 = G / (h bound(G))                          every singular value in (0, 1/h]
    X_{k+1} = a_k X_k + (b_k A_k + c_k A_k^2) X_k   A_k = X_k X_k^T, i.e. s -> a_k s + b_k s^3 + c_k s^5

for a wide X (m <= n; for a tall one A = X^T X, multiplied from the right, so that A is the smaller
square). bound(G) is an upper bound on G's largest singular value s_1, NS_NORMS:

- "frobenius": ||G||_F = (sum s_i^2)^(1/2), torch.optim.Muon's. For a momentum matrix of the char-LM
  recipe s_1 is 0.25-0.8 of it, so the iterations start with every singular value that much short.
- "gram": ||(G G^T)^2||_F^(1/4) = (sum s_i^8)^(1/8), nearly s_1 itself, at no extra cost: G G^T and
  its square are the first iteration's A_0 and A_0^2, computed before this scaling (after the
  Frobenius one, which keeps them in range) and divided after (A_0 by bound^2, A_0^2 by bound^4).

Two schedules of (a_k, b_k, c_k) with their headroom h, NS_COEFFICIENTS:

- "jordan": Jordan's (3.4445, -4.7750, 2.0315) every iteration, chosen for a steep slope at 0, h = 1;
  after 5 iterations every s above ~3e-3 lands in (0.7, 1.15), not on 1 (torch.optim.Muon's default).
- "polar-express" (Amsel, Persson, Musco & Gower, 2025, Algorithm 1): a different polynomial per
  iteration, each the minimax-best given where the previous one left the singular values (for s in
  [1e-3, 1]), divided by a safety factor 1.01 (a / 1.01, b / 1.01^3, c / 1.01^5), h = 1.01; beyond
  its 8th iteration the last (1.875, -1.25, 0.375) repeats.

Unlike torch.optim.Muon, which runs its iterations one matrix at a time, the matrices of one shape
are stacked and orthogonalised together: one batched matrix product per term instead of one per
matrix (the char-LM recipe's 28 matrices, Jordan's 5 iterations, one CPU thread: 17-19 ms a step
instead of 25-26, BENCHMARKS.md). The iterations run in bfloat16 (as torch's do), the momentum and
weights in float32.
"""

from __future__ import annotations

import math
from itertools import repeat

import torch

from .choices import NS_NORMS

__all__ = ["NS_COEFFICIENTS", "NS_NORMS", "Muon", "ns_schedule", "orthogonalize"]

_POLAR_EXPRESS = [  # (a, b, c) of iterations 1..8, before the safety factor
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
]
NS_COEFFICIENTS: dict[str, tuple[float, list[tuple[float, float, float]]]] = {  # name: (headroom h, (a, b, c)s)
    "jordan": (1.0, [(3.4445, -4.7750, 2.0315)]),
    "polar-express": (1.01, [(a / 1.01, b / 1.01**3, c / 1.01**5) for a, b, c in _POLAR_EXPRESS[:-1]]
                      + _POLAR_EXPRESS[-1:]),
}
Schedule = tuple[float, list[tuple[float, float, float]], str]  # (headroom, each iteration's (a, b, c), norm)


def ns_schedule(name: str, steps: int, norm: str = "frobenius") -> Schedule:
    """Schedule `name`'s headroom, the (a, b, c) of each of `steps` iterations (its list, then its
    last entry repeated) and the norm that scales G. Raises ValueError for an unknown name or norm,
    or fewer than one step."""
    if norm not in NS_NORMS:
        raise ValueError(f"unknown Newton-Schulz norm {norm!r}; choose one of {', '.join(NS_NORMS)}")
    if name not in NS_COEFFICIENTS:
        raise ValueError(f"unknown Newton-Schulz coefficients {name!r}; choose one of {', '.join(NS_COEFFICIENTS)}")
    if steps < 1:
        raise ValueError(f"Newton-Schulz steps must be at least 1, not {steps}")
    headroom, table = NS_COEFFICIENTS[name]
    return headroom, (table + list(repeat(table[-1], max(0, steps - len(table)))))[:steps], norm


def orthogonalize(G: torch.Tensor, schedule: Schedule, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """polar(G) ~ U V^T for each matrix of a stack G (B, m, n), by the iterations of `schedule`
    (ns_schedule's) in the module docstring, computed in `dtype`; returned in G's dtype.

    A tall stack (m > n) is iterated as it lies, with A = X^T X (n, n) and X <- a X + X (b A + c A^2):
    the same polynomial of the singular values as on its transpose, without copying it."""
    headroom, coefficients, norm = schedule
    tall = G.size(-2) > G.size(-1)

    def gram(X):  # (B, k, k), k = min(m, n)
        return X.mT @ X if tall else X @ X.mT

    def plus(X, P, a):  # a X + X P, or a X + P X
        return torch.baddbmm(X, X, P, beta=a) if tall else torch.baddbmm(X, P, X, beta=a)

    X = G.to(dtype)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * headroom).clamp(min=1e-7)  # "frobenius"
    if norm == "gram":  # the first iteration from A_0 and A_0^2 of X as it is, scaled afterwards
        A = gram(X)  # (B, k, k), k = min(m, n)
        A2 = A @ A
        bound = (A2.norm(dim=(-2, -1), keepdim=True) ** 0.25 * headroom).clamp(min=1e-7)  # (B, 1, 1), <= 1
        (a, b, c), coefficients = coefficients[0], coefficients[1:]
        X = X / bound
        X = plus(X, A * (b / bound**2) + A2 * (c / bound**4), a)
    for a, b, c in coefficients:
        A = gram(X)
        X = plus(X, torch.baddbmm(A, A, A, beta=b, alpha=c), a)  # a X + (b A + c A^2) X
    return X.to(G.dtype)


class Muon(torch.optim.Optimizer):
    """Muon over 2-D parameters (see the module docstring), same-shaped matrices orthogonalised as
    one stack. Each group takes lr, weight_decay, momentum, nesterov and `ns` (ns_schedule's
    (headroom, [(a, b, c) per iteration], norm)). Its state per parameter is torch.optim.Muon's
    ("momentum_buffer"), so either loads the other's checkpoint."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns: Schedule | None = None):
        ns = ns_schedule("jordan", 5) if ns is None else ns
        if lr < 0 or weight_decay < 0 or not 0 <= momentum < 1 or not ns[1]:
            raise ValueError(f"Muon needs lr >= 0, weight_decay >= 0, 0 <= momentum < 1 and one iteration at "
                             f"least; got {lr}, {weight_decay}, {momentum}, {len(ns[1])} iterations")
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                                  "nesterov": nesterov, "ns": ns})
        self._stacks: dict[tuple[int, ...], tuple[torch.Tensor, list[torch.Tensor]]] = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon takes weight matrices only, not a parameter of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("Muon.step takes no closure")
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            mu = group["momentum"]
            torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
            by_shape: dict[torch.Size, list[torch.Tensor]] = {}
            for p in params:
                by_shape.setdefault(p.shape, []).append(p)
            for members in by_shape.values():
                grads = torch.stack([p.grad for p in members])  # (B, n_out, n_in)
                buffers = self._momentum(members)  # (B, n_out, n_in)
                buffers.lerp_(grads, 1 - mu)  # M = mu M + (1 - mu) g
                direction = grads.lerp_(buffers, mu) if group["nesterov"] else buffers
                orthogonal = orthogonalize(direction, group["ns"])
                torch._foreach_add_(members, orthogonal.unbind(), alpha=-group["lr"] * 0.2 * math.sqrt(max(members[0].shape)))

    def _momentum(self, members: list[torch.Tensor]) -> torch.Tensor:
        """The momentum buffers of `members` (one shape) as one stack (B, n_out, n_in): each
        parameter's state["momentum_buffer"] is a view into it, so one lerp updates them all. Built on
        the first step and again whenever a state was replaced (load_state_dict), from what it holds."""
        key = tuple(id(p) for p in members)
        stack, views = self._stacks.get(key, (None, ()))
        if stack is None or any(self.state[p].get("momentum_buffer") is not v for p, v in zip(members, views)):
            stack = torch.stack([self.state[p].get("momentum_buffer", torch.zeros_like(p)) for p in members])
            views = list(stack.unbind())
            for p, v in zip(members, views):
                self.state[p]["momentum_buffer"] = v
            self._stacks[key] = stack, views
        return stack
