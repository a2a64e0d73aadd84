"""Heads named by role: the classic IOI roles (Wang et al. 2022) read off each head's scores.

Shape letters: L layers, H heads, B pairs, T positions.

- duplicate-token, induction, previous-token: analysis.heads.detect_heads on repeated random tokens;
- name mover: at the last position the head attends to the indirect object's name and writes that
  name up against the subject's,

      attention[L, H] = mean_pairs A_{L,H}(last -> position of the answer's token)
      direct[L, H]    = mean_pairs DLA_{L,H}(answer) - DLA_{L,H}(wrong)        (analysis.direct_logit_attribution)

  a name mover has attention >= 0.3 and direct > 0; a negative name mover the same with direct < 0.

A head gets every role whose score passes ROLE_THRESHOLD (0.3), strongest first.
"""

from __future__ import annotations

import torch
from torch import nn

from ...analysis.decompose import direct_logit_attribution
from ...analysis.heads import KINDS, detect_heads
from ...analysis.result import Result
from ...trace import trace
from .tasks import Task

ROLE_THRESHOLD = 0.3
DETECTOR_ROLES = {"duplicate": "duplicate token", "induction": "induction", "previous_token": "previous token"}


def name_mover_scores(model: nn.Module, task: Task, batch_size: int = 16, pairs: int | None = None) -> Result:
    """[layer, head] the direct effect of each head on the logit difference at the last position (mean over
    the first `pairs` pairs, default all); extra["attention"] [layer, head]: its attention from the last
    position to the first position holding the answer's token (the indirect object's name in IOI)."""
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    direct = torch.zeros(n_layers, n_heads, dtype=torch.float64, device="cpu")
    attention = torch.zeros(n_layers, n_heads, dtype=torch.float64, device="cpu")
    count = len(task) if pairs is None else min(pairs, len(task))
    for rows in task.batches(batch_size):
        if rows.start >= count:
            break
        rows = range(rows.start, min(rows.stop, count))
        clean, _ = task.inputs(rows)
        last = clean.target.last  # (B,)
        index = torch.arange(len(rows), device="cpu")
        answers, wrongs = task.answers[list(rows), 0], task.wrongs[list(rows), 0]
        right = direct_logit_attribution(model, clean, answers)
        wrong = direct_logit_attribution(model, clean, wrongs)
        names = right.labels["component"]
        for layer in range(n_layers):
            for head in range(n_heads):
                c = names.index(f"L{layer}H{head}")
                direct[layer, head] += (right.values[c, index, last] - wrong.values[c, index, last]).double().sum()
        ids = clean.target.ids
        where = (ids == answers[:, None]).double().argmax(dim=1)  # (B,) the answer's first position in the prompt
        # a pair whose prompt does not hold its answer (greater-than's years) counts 0: argmax would point at
        # position 0, the attention sink, and make every head a "name mover"
        present = (ids == answers[:, None]).any(dim=1).double()  # (B,)
        with torch.no_grad(), trace(model, "blocks.*.attn.pattern") as t:
            clean.last_logits(model)
        for layer in range(n_layers):
            pattern = t[f"blocks.{layer}.attn.pattern"]  # (B, H, T, T), on the model's device
            from_last = pattern[index.to(pattern.device), :, last.to(pattern.device)].cpu()  # (B, H, T): the last query's row
            attention[layer] += (from_last[index, :, where].double() * present[:, None]).sum(0)  # (H,)
    direct, attention = direct / count, attention / count
    labels = {"layer": [str(i) for i in range(n_layers)], "head": [str(h) for h in range(n_heads)]}
    return Result("name-mover heads (direct effect on the logit difference)", direct, ("layer", "head"), labels=labels,
                  check="direct logit attribution: each head's share of the logit difference, the norm's scale frozen",
                  extra={"attention": attention}, about=f"{task.name}, {count} pairs")


def head_roles(model: nn.Module, task: Task, heads: list[tuple[int, int]], *, batch_size: int = 16,
               pairs: int | None = None) -> dict:
    """{(layer, head): [role, ...]} for the given heads, and the scores behind them:
    {"roles": ..., "scores": {kind: [layer, head] tensor}, "attention": ..., "direct": ...}; the name movers'
    over the first `pairs` pairs (default all)."""
    scores = {kind: detect_heads(model, kind).values for kind in KINDS}
    movers = name_mover_scores(model, task, batch_size, pairs)
    roles = {}
    for layer, head in heads:
        found = []
        attention, direct = float(movers.extra["attention"][layer, head]), float(movers.values[layer, head])
        if attention >= ROLE_THRESHOLD:
            found.append((attention, "name mover" if direct > 0 else "negative name mover"))
        for kind, name in DETECTOR_ROLES.items():
            if float(scores[kind][layer, head]) >= ROLE_THRESHOLD:
                found.append((float(scores[kind][layer, head]), name))
        roles[(layer, head)] = [name for _, name in sorted(found, reverse=True)]
    return {"roles": roles, "scores": scores, "attention": movers.extra["attention"], "direct": movers.values}
