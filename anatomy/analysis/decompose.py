"""The residual stream as a sum of what each part of the model wrote into it, and each part's
direct effect on a logit (Elhage et al., "A Mathematical Framework for Transformer Circuits", 2021).

Shape letters: C components, B batch, T positions, E model width, V vocabulary, H heads.

In a pre-norm block every sublayer adds its output to the stream, x_{l+1} = x_l + Attn(Norm(x_l))
+ MLP(...), and the attention output is a sum over heads, Concat(h_1..h_H) W^O + b^O = sum_i h_i W_i^O
+ b^O. So the final residual is exactly

    x_L = embed + pos_embed + sum_{l,i} head_{l,i} + sum_l b^O_l + sum_l MLP_l.

Direct logit attribution reads each component through the final norm *with the scale of the
whole residual frozen* (the norm is then linear) and the unembedding:

    logit_v = sum_c  gamma * centre(c) / sigma(x_L) . W_U[v]  +  (beta . W_U[v] + b_U[v])

so the contributions, with the last term as its own row, sum to the logit.
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers import norm_parts
from ..trace import trace
from .inputs import as_batch
from .lens import stack_of, stack_prefix
from .result import Result, max_abs_diff


def _check_additive(model: nn.Module) -> None:
    config = model.config
    if config.norm_position != "pre":
        raise ValueError(
            f"the residual stream is a sum of components only in pre-norm blocks (norm_position='pre'); this model "
            f"has norm_position={config.norm_position!r}, where a norm rescales the stream or a sublayer's output"
        )
    if config.embed_norm:
        raise ValueError("embed_norm=True normalises the embeddings before the first block: they are no sum of components")


def head_writes(block: nn.Module, head_out: torch.Tensor) -> torch.Tensor:
    """[B, T, H, E]: what each head adds to the stream, from its output head_out [B, T, H, E]: itself, or through
    the norm on the attention's output (sandwich, post-sublayer) with the norm's scale frozen at this run's,
    centre(head_out_h) s g, so that the heads' writes and the norm of the output bias sum to the norm's output.
    One definition of a head's write, for decomposition here and the sources of circuit discovery."""
    norm = getattr(block, "attn_out_norm", None)
    if norm is None:
        return head_out
    bias = block.attn.o_proj.bias
    total = head_out.sum(2) + (0 if bias is None else bias)  # (B, T, E): the attention's output
    parts = norm_parts(norm, total)
    centred = head_out - head_out.mean(-1, keepdim=True) if parts.centred else head_out
    return (centred * parts.scale[..., None, None] * parts.gain).to(head_out.dtype)


def mlp_write_point(block: nn.Module, prefix: str) -> str:
    """The point whose value a block adds to the stream for its MLP: its output, or its output norm's (sandwich,
    post-sublayer); prefix "blocks.L." names the block."""
    return f"{prefix}mlp_out_norm.out" if hasattr(block, "mlp_out_norm") else f"{prefix}mlp.out"


def components(model: nn.Module, inputs, *, tokenizer=None) -> tuple[list[str], torch.Tensor, torch.Tensor, object]:
    """(names, parts [C, B, T, E], final residual [B, T, E], batch); parts sum to the final residual."""
    _check_additive(model)
    model.eval()
    batch = as_batch(model, inputs, tokenizer)
    stack, prefix = stack_of(model), stack_prefix(model)
    last = f"{prefix}blocks.{len(stack.blocks) - 1}.resid_post"
    points = [f"{prefix}*embed", f"{prefix}blocks.*.head_out", last]
    points += [mlp_write_point(block, f"{prefix}blocks.{index}.") for index, block in enumerate(stack.blocks)]
    with torch.no_grad(), trace(model, points) as t:
        batch.run(model)
    names, parts = [], []
    for point in ("embed", "pos_embed", "type_embed"):
        if f"{prefix}{point}" in t:
            names.append(point)
            parts.append(t[f"{prefix}{point}"])
    for index, block in enumerate(stack.blocks):
        attentions = [("attn", "", " attn")] + ([("cross_attn", " cross ", " cross")] if block.has_cross_attention else [])
        for attention, head_label, bias_label in attentions:
            heads = t[f"{prefix}blocks.{index}.{attention}.head_out"]  # (B, T, H, E)
            if attention == "attn":
                heads = head_writes(block, heads)
            for head in range(heads.size(2)):
                names.append(f"L{index}{head_label}H{head}")
                parts.append(heads[:, :, head])
            bias = getattr(block, attention).o_proj.bias
            if bias is not None:
                names.append(f"L{index}{bias_label} bias")
                parts.append(bias.detach().expand_as(heads[:, :, 0]))
        names.append(f"L{index} MLP")
        parts.append(t[mlp_write_point(block, f"{prefix}blocks.{index}.")])
    return names, torch.stack(parts), t[last], batch


def decompose(model: nn.Module, inputs, *, tokenizer=None) -> Result:
    """[component, batch, pos, d_model]: embeddings, every head (cross-attention heads too), every
    attention output bias, every MLP; they sum to the final residual (before the final norm).

    Raises ValueError for blocks where the stream is not a sum (post-norm, sandwich norms)."""
    names, parts, final, batch = components(model, inputs, tokenizer=tokenizer)
    error = max_abs_diff(parts.sum(0), final)
    return Result(
        "decomposition", parts, ("component", "batch", "pos", "d_model"), labels={"component": names},
        check=f"the components sum to the final residual: max |diff| {error:.1e}", error=error,
        tokens=batch.target.tokens,
    )


def frozen_norm(norm: nn.Module | None, residual: torch.Tensor, parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The norm as the linear map it is once its scale is frozen at the whole residual's (layers.norm_parts).

    residual [B, T, E], parts [C, B, T, E] summing to it -> (normed parts [C, B, T, E], bias [E]);
    normed parts + bias sum to norm(residual)."""
    if norm is None:
        return parts, residual.new_zeros(residual.size(-1))
    gain, bias, centred, _, scale = norm_parts(norm, residual)  # scale (B, T)
    if centred:
        parts = parts - parts.mean(dim=-1, keepdim=True)
    bias = torch.zeros_like(gain) if bias is None else bias
    return parts * scale[..., None] * gain, bias.to(norm.weight.dtype)


def _targets(target, logits: torch.Tensor) -> torch.Tensor:
    batch, length, vocab = logits.shape
    if target is None:
        return logits.argmax(dim=-1)  # (B, T): each position's own top prediction
    target = torch.as_tensor(target, dtype=torch.long, device=logits.device)
    if target.dim() == 0:
        target = target.expand(batch, length)
    elif target.dim() == 1:
        if target.numel() != batch:
            raise ValueError(f"a target per sequence needs {batch} ids, got {target.numel()}")
        target = target[:, None].expand(batch, length)
    if tuple(target.shape) != (batch, length):
        raise ValueError(f"target must be an id, [batch] or [batch, pos] = {(batch, length)}; got {tuple(target.shape)}")
    if int(target.min()) < 0 or int(target.max()) >= vocab:
        raise ValueError(f"target ids must be in [0, vocab_size={vocab})")
    return target


def direct_logit_attribution(model: nn.Module, inputs, target=None, *, tokenizer=None) -> Result:
    """[component, batch, pos]: each component's direct contribution to the logit of `target`
    (an id for every position, [batch] ids, [batch, pos] ids, or None: each position's top token),
    through the final norm with its scale frozen and the unembedding. The last component, "norm
    bias + unembed bias", is what no component wrote; the rows sum to the logit. extra["target"]:
    the ids [batch, pos], extra["target_tokens"]: them as text ("␣Paris")."""
    if model.config.lm_head_transform or model.config.final_logit_softcap is not None:
        raise ValueError("direct logit attribution needs a linear unembedding: this model has an LM-head transform "
                         "or a logit soft-cap")
    if not hasattr(model, "lm_head"):
        raise ValueError(f"direct logit attribution needs an LM head; this model has head={model.config.head!r}")
    names, parts, final, batch = components(model, inputs, tokenizer=tokenizer)
    with torch.no_grad():
        logits = batch.logits(model)
        ids = _targets(target, logits)  # (B, T)
        directions = model.lm_head.proj.weight[ids]  # (B, T, E): W_U[v] for each position's target
        normed, bias = frozen_norm(getattr(stack_of(model), "final_norm", None), final, parts)
        contributions = (normed * directions).sum(-1)  # (C, B, T)
        constant = directions @ bias  # (B, T)
        if model.lm_head.proj.bias is not None:
            constant = constant + model.lm_head.proj.bias[ids]
        values = torch.cat([contributions, constant[None]])  # (C+1, B, T)
        expected = logits.gather(-1, ids[..., None])[..., 0]  # (B, T)
    error = max_abs_diff(values.sum(0), expected)
    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    target_tokens = [tok.labels(row.tolist()) if tok is not None else [str(int(i)) for i in row] for row in ids]
    return Result(
        "direct logit attribution", values, ("component", "batch", "pos"),
        labels={"component": names + ["norm bias + unembed bias"]},
        check=f"the contributions sum to the logit: max |diff| {error:.1e}", error=error,
        tokens=batch.target.tokens, extra={"target": ids, "target_tokens": target_tokens},
    )
