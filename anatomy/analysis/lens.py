"""The logit lens (nostalgebraist, "interpreting GPT: the logit lens", 2020): read the residual
stream after every layer through the model's own final norm and unembedding.

Shape letters: L layers, B batch, T positions, E model width, V vocabulary.

    lens_l = log_softmax(W_U · FinalNorm(x_l) + b_U),   x_0 = the embeddings, x_l = block l's output

The last row is the model's own prediction: lens_L equals log_softmax(logits), and the result
reports the measured difference.
"""

from __future__ import annotations

import torch
from torch import nn

from ..trace import trace
from .inputs import as_batch
from .result import Result, max_abs_diff


def stack_of(model: nn.Module) -> nn.Module:
    """The stack whose residual stream the LM head reads: the model itself, or the decoder."""
    return model.decoder if model.config.arch == "encoder-decoder" else model


def stack_prefix(model: nn.Module) -> str:
    return "decoder." if model.config.arch == "encoder-decoder" else ""


def unembed(model: nn.Module, residual: torch.Tensor) -> torch.Tensor:
    """[..., E] -> [..., V]: the final norm (if the stack has one) and the LM head."""
    if not hasattr(model, "lm_head"):
        raise ValueError("the logit lens needs an LM or masked-LM head (config.head), this model has "
                         f"head={model.config.head!r}")
    stack = stack_of(model)
    if hasattr(stack, "final_norm"):
        residual = stack.final_norm(residual)
    return model.lm_head(residual)


# Positions unembedded at once by lens_top: [L+1, 16, V] floats, 98 MB for SmolLM2's 31 × 49,152.
LENS_BLOCK = 16


def lens_top(model: nn.Module, residuals: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The logit lens's `top` tokens of residuals [L+1, T, E], a block of positions at a time, so that
    the [L+1, T, V] log-probabilities are never held at once: (probs [L+1, T, top], ids [L+1, T, top],
    log_norm [L+1, T] = logsumexp of each cell's logits, from which lens_probabilities reads any
    token's probability)."""
    probs, ids, norms = [], [], []
    with torch.no_grad():
        for start in range(0, residuals.size(1), LENS_BLOCK):
            logits = unembed(model, residuals[:, start:start + LENS_BLOCK]).float()  # (L+1, block, V)
            log_norm = torch.logsumexp(logits, dim=-1)  # (L+1, block)
            best, where = logits.topk(top, dim=-1)  # (L+1, block, top)
            probs.append((best - log_norm[..., None]).exp())
            ids.append(where)
            norms.append(log_norm)
    return torch.cat(probs, dim=1), torch.cat(ids, dim=1), torch.cat(norms, dim=1)


def lens_probabilities(model: nn.Module, residuals: torch.Tensor, log_norm: torch.Tensor,
                       token_ids: torch.Tensor) -> torch.Tensor:
    """[L+1, T, n]: the lens's probability of each token of `token_ids` [n] at every cell of residuals
    [L+1, T, E], exp(logit − log_norm) with lens_top's log_norm [L+1, T], from those n rows of the
    unembedding only."""
    stack = stack_of(model)
    with torch.no_grad():
        normed = stack.final_norm(residuals) if hasattr(stack, "final_norm") else residuals
        logits = model.lm_head.token_logits(normed, token_ids).float()  # (L+1, T, n)
    return (logits - log_norm[..., None]).exp()


def logit_lens(model: nn.Module, inputs, *, tokenizer=None, top: int = 5, cache=None) -> Result:
    """[layer+1, batch, pos, vocab] log-probabilities of the residual stream at resid_pre of every
    block and after the last one. extra["top_ids"] / ["top_tokens"] / ["top_probs"]: the `top`
    most likely tokens per cell, [layer+1, batch, pos, top] (the view's top-k control shows up to
    `top` of them); the tokens are shown as text (Tokenizer.labels: "␣Paris"). cache: a Trace of
    these inputs (run_with_cache's) to read the residual stream from instead of running the model."""
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= model.config.vocab_size:
        raise ValueError(f"top must be an integer in [1, vocab_size={model.config.vocab_size}], got {top!r}")
    model.eval()
    batch = as_batch(model, inputs, tokenizer)
    prefix, n_layers = stack_prefix(model), len(stack_of(model).blocks)
    names = [f"{prefix}blocks.{i}.resid_pre" for i in range(n_layers)] + [f"{prefix}blocks.{n_layers - 1}.resid_post"]
    with torch.no_grad():
        if cache is None:
            with trace(model, names) as cache:
                logits = batch.logits(model)
        else:
            logits = cache[f"{prefix}logits" if f"{prefix}logits" in cache else "logits"]  # the pass's own
        residuals = torch.stack([cache[name] for name in names])  # (L+1, B, T, E)
        log_probs = torch.log_softmax(unembed(model, residuals).float(), dim=-1)  # (L+1, B, T, V)
    error = max_abs_diff(log_probs[-1], torch.log_softmax(logits.float(), dim=-1))
    probs, ids = log_probs.exp().topk(top, dim=-1)  # (L+1, B, T, top)
    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    # each top token as anatomy shows tokens everywhere (Tokenizer.labels: "␣Paris", not "ĠParis")
    to_text = tok.labels if tok is not None else (lambda cell: [str(i) for i in cell])
    top_tokens = [[[to_text(cell.tolist()) for cell in row] for row in layer] for layer in ids]
    return Result(
        "logit lens", log_probs, ("layer", "batch", "pos", "vocab"),
        labels={"layer": [f"resid_pre {i}" for i in range(n_layers)] + [f"resid_post {n_layers - 1}"]},
        check=f"last layer = the model's own log-probs: max |diff| {error:.1e}", error=error,
        tokens=batch.target.tokens, extra={"top_ids": ids, "top_probs": probs, "top_tokens": top_tokens},
    )
