"""The walkthrough: one real forward pass, narrated step by step in the source texts' order.

The model runs once under `anatomy.trace(model)`. Every matrix a step shows is read from that
trace (or computed from traced tensors where the model has no name for it, e.g. QKᵀ before
scaling). Every step then recomputes its result from its inputs in float64 with the module's own
weights (walk/reference.py) and compares it with the model's tensor; so does every line of
arithmetic worked by hand.

    walk = walkthrough(model, ids, tokens=tokens, layer=0, head=0)
    walk.ok                      # every check passed
    walk.steps[9].matrices[0]    # the attention pattern of head 0, as the model computed it
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..checkpoints.token_text import legend_for
from ..trace import trace
from .block_steps import layer_steps
from .builder import Builder
from .input_steps import input_steps
from .narration import say
from .output_steps import lm_steps, pooled_step, rest_steps
from .reference import f64
from .render_html import render_html
from .render_markdown import render_markdown
from .render_terminal import render_terminal, render_text
from .types import Check, WalkResult


class Walkthrough(WalkResult):
    """A WalkResult that renders itself: to_markdown(), to_html(), to_text(), print()."""

    def to_markdown(self) -> str:
        return render_markdown(self)

    def to_html(self) -> str:
        return render_html(self)

    def to_text(self, width: int = 80) -> str:
        """The terminal rendering without colour, `width` columns wide."""
        return render_text(self, width=width)

    def print(self, console=None) -> None:
        render_terminal(self, console=console)


def _as_ids(ids) -> list[int]:
    if torch.is_tensor(ids):
        if ids.dim() == 2:
            if ids.size(0) != 1:
                raise ValueError(f"the walkthrough narrates one sequence; got a batch of {ids.size(0)}")
            ids = ids[0]
    return [int(i) for i in ids]


def _labeller(vocab) -> Callable[[int], str]:
    if vocab is None:
        return str
    if callable(vocab):
        return lambda i: str(vocab(i))
    return lambda i: str(vocab[i]) if i < len(vocab) else str(i)


def check_layer_and_head(config, layer: int, head: int) -> None:
    """Raise ValueError, naming the range, for a layer or head that `config` (a ModelConfig) does not
    have; an encoder-decoder's must exist in both its stacks."""
    seq2seq = config.arch == "encoder-decoder"
    n_layers = config.decoder_config().n_layers if seq2seq else config.n_layers
    n_layers = min(n_layers, config.n_layers)
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} is out of range: this model has {n_layers} layers, choose 0 … {n_layers - 1}")
    n_heads = min(config.n_heads, config.decoder_config().n_heads) if seq2seq else config.n_heads
    if not 0 <= head < n_heads:
        raise ValueError(f"head {head} is out of range: this model has {n_heads} heads, choose 0 … {n_heads - 1}")


def walkthrough(
    model: nn.Module,
    ids,
    *,
    tokens: Sequence[str] | None = None,
    vocab: Sequence[str] | Callable[[int], str] | None = None,
    layer: int = 0,
    head: int = 0,
    target_ids=None,
    target_tokens: Sequence[str] | None = None,
    model_name: str = "model",
    task: str | None = None,
    mask_token: str | None = None,
    focus: int | None = None,
    cache=None,
    lazy: bool = False,
) -> Walkthrough:
    """Run `model` once on `ids` under a full trace and narrate the pass.

    ids [T] (or [1, T]): the input; for an encoder-decoder, the source, with `target_ids` [T'] the
    decoder's input. `tokens`: the strings shown for each id (default: `vocab` of each id).
    `vocab`: id -> token string (a sequence or a function). `layer` and `head`: the block and head
    narrated in full. `task`: what the model learned, in words (the toys). `mask_token`: a
    masked-language model's mask, whose position the output step reads. `focus`: the row worked
    through by hand (default 4, or the last row of a shorter text). `cache`: a Trace of every point
    of this very pass (anatomy.run_with_cache's, or anatomy.analysis.prefix's) to read instead of
    running the model again; an encoder-decoder runs its pass anyway (its step compares the memory
    with the forward pass's own output). `lazy`: leave the steps that cost as much as a pass (the
    float64 logits over the whole vocabulary) unbuilt until read (Step.build; a renderer builds
    each step it shows, and walk.ok builds them all); the live explorer builds them when opened.

    Raises ValueError for a layer or head out of range (naming the range), a batch, or a missing
    target for an encoder-decoder.
    """
    config = model.config
    seq2seq = config.arch == "encoder-decoder"
    check_layer_and_head(config, layer, head)
    label = _labeller(vocab)
    ids = _as_ids(ids)
    tokens = list(tokens) if tokens is not None else [label(i) for i in ids]
    if len(tokens) != len(ids):
        raise ValueError(f"{len(tokens)} tokens were given for {len(ids)} ids")
    if seq2seq:
        if target_ids is None:
            raise ValueError("an encoder-decoder needs target_ids (the decoder's input) as well as ids (the source)")
        target_ids = _as_ids(target_ids)
        target_tokens = list(target_tokens) if target_tokens is not None else [label(i) for i in target_ids]

    if cache is not None and not seq2seq:
        t = cache
    else:
        was_training = model.training
        model.eval()
        try:
            device = next(model.parameters()).device  # the reference math runs on the CPU, in float64
            with torch.no_grad(), trace(model) as t:
                if seq2seq:
                    output = model(torch.tensor([ids], device=device), torch.tensor([target_ids], device=device))
                else:
                    output = model(torch.tensor([ids], device=device))
        finally:
            model.train(was_training)

    labels = [str(v) for v in vocab] if vocab is not None and not callable(vocab) else None
    b = Builder(model, t, label, head, focus, vocabulary=labels)
    trained = task is not None or config.vocab_size > 64
    if seq2seq:
        enc, dec = model.encoder, model.decoder
        input_steps(b, enc, "encoder.", ids, tokens, "Encoder input")
        layer_steps(b, enc, "encoder.", layer, tokens, f"Encoder layer {layer}")
        memory = rest_steps(b, enc, "encoder.", layer, tokens, "Encoder output")
        b.add(
            "Encoder output", "The encoder's output M (the memory)", say("memory"),
            "M = Encoder(X_source)", r"M = \mathrm{Encoder}(X_{source})",
            [b.matrix("M", "M", memory, (0,), rows=tokens)],
            b.check(f"the traced {memory}", "the forward pass's encoder_last_hidden_state",
                    b.get(memory, 0), f64(output.encoder_last_hidden_state[0])),
        )
        input_steps(b, dec, "decoder.", target_ids, target_tokens, "Decoder input", one_hot=False)
        layer_steps(b, dec, "decoder.", layer, target_tokens, f"Decoder layer {layer}",
                    memory=(memory, tokens), compact_self=True)
        hidden = rest_steps(b, dec, "decoder.", layer, target_tokens, "Output")
        lm_steps(b, model.lm_head, hidden, target_tokens, "Output", trained=trained)
    else:
        input_steps(b, model, "", ids, tokens, "Input")
        if layer > 0:
            gap = (b.get(f"blocks.{layer}.resid_pre", 0) - b.get(f"blocks.{layer - 1}.resid_post", 0)).abs().max()
            b.add(
                "Input", f"The layers before layer {layer} (" + (f"0 … {layer - 1})" if layer > 1 else "0)"),
                say("earlier_layers", layer=layer),
                f"X_{layer} = Block_{layer - 1}(… Block_0(X))",
                f"X_{{{layer}}} = \\mathrm{{Block}}_{{{layer - 1}}}" + r"(\ldots \mathrm{Block}_0(X))",
                [b.matrix(f"X_{layer}", f"X_{{{layer}}}", f"blocks.{layer}.resid_pre", (0,), rows=tokens)],
                Check(f"layer {layer}'s input", f"layer {layer - 1}'s traced output", float(gap), 0.0),
            )
        layer_steps(b, model, "", layer, tokens, f"Layer {layer}")
        hidden = rest_steps(b, model, "", layer, tokens, "Output")
        if hasattr(model, "lm_head"):
            lm_steps(b, model.lm_head, hidden, tokens, "Output", trained=trained,
                     masked=mask_token if config.arch == "encoder" else None)
        elif config.arch == "encoder":
            pooled_step(b, hidden, tokens, "Output")
    if not lazy:
        for step in b.steps:
            step.build()
    walk = Walkthrough(b.steps, t, config, layer, head, tokens, target_tokens, model_name, task)
    legend = legend_for([*tokens, *(target_tokens or [])])
    if legend is not None:  # the convention for tokens with a space or a new line, said once
        walk.notes.append(f"Tokens: {legend}.")
    return walk
