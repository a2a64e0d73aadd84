"""The optimizers `anatomy train` offers (OPTIMIZERS), their parameter groups, and layer-wise LR decay.

- adamw: AdamW (Loshchilov & Hutter) over every parameter, torch's fused kernel.
- muon:  Muon (Jordan et al., 2024; muon.py) for the blocks' weight matrices, AdamW for the
         rest (embeddings, the output head or classifier, norms, biases), as Muon's authors prescribe:
         orthogonalising a vector or an embedding table's rows has no meaning.

Every group carries `lr_scale`: its learning rate is the schedule's times lr_scale. Layer-wise LR
decay (Clark et al., 2020, ELECTRA; for fine-tuning) sets it from the parameter's depth d:

    lr_scale(d) = layer_decay ** (L + 1 - d)    d = 0 the embeddings, 1..L the blocks, L + 1 the rest

so the head learns at the full rate and each block below it at `layer_decay` times the one above:
the lower a layer, the more general what it learned in pre-training, the less it should move.
A new head on a pretrained body may learn faster than the body (`head_lr_scale`, Howard & Ruder's
discriminative fine-tuning taken to its two-rate case):

    lr_scale(L + 1) = head_lr_scale,   lr_scale(d) = layer_decay ** (L + 1 - d) for d <= L
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch
from torch import nn

from .choices import OPTIMIZERS
from .muon import Muon, ns_schedule

if TYPE_CHECKING:
    from .trainer import TrainConfig

__all__ = ["OPTIMIZERS", "Optimizers", "layer_depths", "make_optimizer", "param_groups"]

_BLOCK = re.compile(r"(?:^|\.)blocks\.(\d+)\.")


def layer_depths(model: nn.Module) -> tuple[dict[int, int], int]:
    """(id(parameter) -> its depth, L + 1): depth 0 for embeddings, i + 1 for a parameter of `blocks.i`
    (an encoder-decoder's two stacks share the numbering), L + 1 for the rest (final norm, head)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    named = list(model.named_parameters())  # a tied weight once, under its first name (the embedding)
    blocks = [int(m.group(1)) for name, _ in named if (m := _BLOCK.search(name))]
    top = max(blocks, default=-1) + 2
    depths = {}
    for name, p in named:
        block = _BLOCK.search(name)
        depths[id(p)] = 0 if id(p) in embeddings else int(block.group(1)) + 1 if block else top
    return depths, top


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float = 1.0,
                 head_lr_scale: float = 1.0) -> list[dict]:
    """AdamW groups: decay for weight matrices, none for norms, biases (1-D) and embeddings; one
    pair per depth when layer_decay < 1, or one for the head and one for the rest when only
    head_lr_scale != 1, each with its `lr_scale` (see the module docstring).

    Decay pulls weights toward 0; a norm's gain pulled toward 0 (or an embedding row that is rarely
    seen, decayed every step) only hurts, so they are left out (as in GPT-2, BERT, nanoGPT)."""
    if not 0.0 < layer_decay <= 1.0:
        raise ValueError(f"layer_decay must be in (0, 1], not {layer_decay}")
    if not head_lr_scale > 0.0:
        raise ValueError(f"head_lr_scale must be above 0, not {head_lr_scale}")
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    depths, top = layer_depths(model)
    groups: dict[tuple[bool, int], dict] = {}
    seen = set()
    for p in model.parameters():  # parameters() yields a tied weight once
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        decays = p.dim() >= 2 and id(p) not in embeddings
        depth = depths[id(p)]
        if layer_decay == 1.0:  # one rate for the whole body: its parameters share the top's groups,
            depth = top if depth == top or head_lr_scale == 1.0 else 0  # or depth 0's when the head has its own
        scale = head_lr_scale if depth == top else layer_decay ** (top - depth)
        group = groups.setdefault((decays, depth), {"params": [], "weight_decay": weight_decay if decays else 0.0,
                                                    "lr_scale": scale})
        group["params"].append(p)
    # decay groups first, shallow to deep: with layer_decay 1, exactly [decay, no_decay]
    return [groups[key] for key in sorted(groups, key=lambda k: (not k[0], k[1]))]


class Optimizers(torch.optim.Optimizer):
    """Several optimizers stepped, zeroed, saved and scheduled as one (Muon + AdamW).

    `param_groups` is every member's groups in order, the same dicts, so an LR scheduler that sets
    group["lr"] reaches them all; `state_dict()` holds each member's under its index."""

    def __init__(self, *members: torch.optim.Optimizer):  # noqa: D107 - the members own the state
        self.members = members
        self.defaults = {}
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}

    @property
    def param_groups(self) -> list[dict]:
        return [group for member in self.members for group in member.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for member in self.members for p, s in member.state.items()}

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("Optimizers.step takes no closure")
        for member in self.members:
            member.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for member in self.members:
            member.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {str(i): member.state_dict() for i, member in enumerate(self.members)}

    def load_state_dict(self, state_dict: dict) -> None:
        if sorted(state_dict) != [str(i) for i in range(len(self.members))]:
            raise ValueError(f"an optimizer state of {len(state_dict)} member(s); this optimizer has {len(self.members)}")
        for i, member in enumerate(self.members):
            member.load_state_dict(state_dict[str(i)])


def _adamw(groups: list[dict], config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """The fused kernel updates every parameter in one pass per tensor instead of a dozen element-wise
    ops each; torch has it for CPU and CUDA (BENCHMARKS.md: the optimizer step of the char-LM recipe's
    shapes takes a fraction of the per-op loop's time)."""
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps,
                             fused=device.type in ("cpu", "cuda") or None)


def make_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer `config.optimizer` names, over param_groups(model, ...) with each group's lr set
    to config.lr x lr_scale (the scheduler multiplies these).

    AdamW:  m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2,   p -= lr (m_hat / (sqrt(v_hat) + eps) + wd p)

    Muon (muon.py), for a weight matrix W (n_out, n_in), Nesterov momentum mu = 0.95:

        M = mu M + g,   O = polar(g + mu M) ~ U V^T  (g + mu M = U S V^T; config.ns_steps iterations of
        config.ns_coefficients),   W -= lr (0.2 sqrt(max(n_out, n_in)) O + wd W)

    O is the nearest semi-orthogonal matrix to the momentum; the 0.2 sqrt(max dim) factor gives it the
    RMS of a typical AdamW update, so that --lr and --weight-decay keep
    their AdamW meaning. Raises ValueError for an unknown name."""
    if config.optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {config.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    groups = param_groups(model, config.weight_decay, config.layer_decay, config.head_lr_scale)
    for group in groups:
        group["lr"] = config.lr * group["lr_scale"]
    if config.optimizer == "adamw":
        return _adamw(groups, config, device)
    # Muon takes the blocks' matrices: 2-D, and not the head's (depth L + 1) or an embedding's (depth 0)
    depths, top = layer_depths(model)
    muon, adam = [], []
    for group in groups:
        is_hidden = [p.dim() == 2 and 0 < depths[id(p)] < top for p in group["params"]]
        hidden = [p for p, h in zip(group["params"], is_hidden) if h]
        rest = [p for p, h in zip(group["params"], is_hidden) if not h]
        if hidden:
            muon.append({**group, "params": hidden})
        if rest:
            adam.append({**group, "params": rest})
    if not muon:
        raise ValueError("--optimizer muon found no weight matrix inside the blocks to orthogonalise")
    return Optimizers(Muon(muon, lr=config.lr, weight_decay=config.weight_decay,
                           ns=ns_schedule(config.ns_coefficients, config.ns_steps, config.ns_norm)),
                      _adamw(adam, config, device))
