"""What every analysis takes: text, a list of texts (a padded batch) or token ids, for any family.

Shape letters: B batch, T positions (target), S source positions, V vocabulary.

    batch = as_batch(model, "The cat sat")                  # the tokenizer: model.tokenizer
    batch = as_batch(model, ["a b", "c d e"], tokenizer=tok)  # right-padded, with a padding mask
    batch = as_batch(model, torch.tensor([[1, 2, 3]]))        # ids as they are
    batch = as_batch(seq2seq, ("Hallo Welt", "Hello"))        # encoder-decoder: (source, target)

    logits, t = run_with_cache(model, "The cat sat")         # t["blocks.0.attn.pattern"], t.tokens

Inputs are made on the CPU (a tokenizer's rows, a task's pairs) and go to the model's device where they
meet it: as_batch puts its batch there, and a Batch moves itself there before it runs the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from ..inputs import InputError
from ..text import check_text
from ..trace import Trace, trace
from .derived import Derivations


@dataclass
class Text:
    """One side of the input: ids [B, T], padding_mask [B, T] (True = real token) or None, tokens."""

    ids: torch.Tensor
    padding_mask: torch.Tensor | None
    tokens: list[list[str]]

    @property
    def last(self) -> torch.Tensor:
        """[B]: the position of each row's last real token (right padding)."""
        if self.padding_mask is None:
            return torch.full((self.ids.size(0),), self.ids.size(1) - 1, dtype=torch.long, device=self.ids.device)
        return self.padding_mask.long().sum(dim=1) - 1

    def to(self, device: torch.device) -> "Text":
        """The ids and the mask on `device` (this Text itself when they are there)."""
        if self.ids.device == torch.device(device):
            return self
        mask = None if self.padding_mask is None else self.padding_mask.to(device)
        return Text(self.ids.to(device), mask, self.tokens)

    def repeat(self, n: int) -> "Text":
        """The batch n times over, [n*B, T]: row r is row r % B."""
        mask = None if self.padding_mask is None else self.padding_mask.repeat(n, 1)
        return Text(self.ids.repeat(n, 1), mask, self.tokens * n)


@dataclass
class Batch:
    """The inputs of one forward pass: `target` (the only side, or the decoder's), `source` (encoder-decoder)."""

    target: Text
    source: Text | None = None

    @property
    def size(self) -> int:
        return self.target.ids.size(0)

    def repeat(self, n: int) -> "Batch":
        return Batch(self.target.repeat(n), None if self.source is None else self.source.repeat(n))

    def to(self, device: torch.device) -> "Batch":
        """Both sides on `device` (this Batch itself when they are there)."""
        target, source = self.target.to(device), None if self.source is None else self.source.to(device)
        return self if target is self.target and source is self.source else Batch(target, source)

    def on(self, model: nn.Module) -> "Batch":
        """This batch on the model's device, where its ids meet the embeddings."""
        return self.to(device_of(model))

    def run(self, model: nn.Module):
        """The model's output for this batch (EncoderOutput, DecoderOutput or Seq2SeqOutput)."""
        batch = self.on(model)
        target, source = batch.target, batch.source
        if source is not None:
            return model(source.ids, target.ids, src_padding_mask=source.padding_mask,
                         tgt_padding_mask=target.padding_mask)
        return model(target.ids, padding_mask=target.padding_mask)

    def hidden(self, model: nn.Module, start: tuple | None = None) -> torch.Tensor:
        """[B, T, E]: the (decoder's) last hidden states, before the LM head. start = (layer, resid [B, T, E]):
        the stack run from that layer, given the residual stream there (Stack.run_from), the layers before
        it not computed; for an encoder-decoder, the decoder's stack. start = (layer, resid [B, T - P, E],
        past): the positions after the P that the KVCache `past` holds, [B, T - P, E] returned."""
        batch = self.on(model)
        target, source = batch.target, batch.source
        stack = model.decoder if source is not None else model
        memory = {}
        if source is not None:
            memory = dict(memory=model.encode(source.ids, source.padding_mask),
                          memory_padding_mask=source.padding_mask)
        if start is not None:
            layer, resid, *past = start
            return stack.run_from(layer, resid, padding_mask=target.padding_mask, past=(past or [None])[0],
                                  **memory)
        name = "tgt_ids" if source is not None else "input_ids"
        mask_name = "tgt_padding_mask" if memory else "padding_mask"
        stack.check_inputs(name, target.ids, target.padding_mask, mask_name)
        return stack.run(target.ids, padding_mask=target.padding_mask, **memory)  # (B, T, E)

    def last_logits(self, model: nn.Module, start: tuple | None = None) -> torch.Tensor:
        """[B, 1, V]: the logits at each row's last real position only, without the LM head's work
        on every other position (T times less of it); a sequence classifier's label logits [B, 1, labels]
        (what a metric of the whole sequence reads). start = (layer, resid): from that layer on (hidden)."""
        batch = self.on(model)
        if getattr(model.config, "head", None) == "sequence-classification":
            if start is None:
                return batch.run(model).logits[:, None]  # (B, 1, labels)
            return model.outputs(batch.hidden(model, start), batch.target.padding_mask).logits[:, None]
        if not hasattr(model, "lm_head"):
            raise ValueError("this analysis needs token logits: a model with an LM or masked-LM head")
        done = start[2].length if start is not None and len(start) > 2 else 0  # positions the cache holds
        hidden = batch.hidden(model, start)  # (B, T - done, E)
        last = hidden[torch.arange(batch.size, device=hidden.device), batch.target.last - done]  # (B, E)
        return model.lm_head(last[:, None])  # (B, 1, V)

    def logits(self, model: nn.Module, start: tuple | None = None) -> torch.Tensor:
        """[B, T, V]. start = (layer, resid): from that layer on (hidden)."""
        if start is not None and hasattr(model, "lm_head"):
            return model.logits(model.lm_head(self.hidden(model, start)))
        logits = self.run(model).logits if start is None else None
        if logits is None or logits.dim() != 3:
            raise ValueError("this analysis needs token logits [batch, pos, vocab]: a model with an LM or masked-LM head")
        return logits


def device_of(model: nn.Module) -> torch.device:
    """The device of the model's weights: where its inputs go."""
    return next(model.parameters()).device


def _tokenizer(model: nn.Module, tokenizer):
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise InputError("text inputs need a tokenizer: pass tokenizer=..., or load the model with "
                         "anatomy.from_pretrained, which attaches model.tokenizer; or pass token ids")
    return tokenizer


def as_text(model: nn.Module, inputs, tokenizer=None, side: str = "input") -> Text:
    """One side: a string, a list of strings (right-padded batch), or ids [T] / [B, T].

    A text is encoded as the model reads it: a decoder's input as a prompt (its tokenizer's
    template, BOS where it adds one, never a closing EOS), an encoder's or a source with the whole
    template ([CLS] ... [SEP]), and an encoder-decoder's target as its decoder start token and the
    text. Tokens are shown as text (Tokenizer.labels: "␣capital", not "Ġcapital").

    Raises InputError for an empty text (a target may be empty: its start token is read) or one that
    is not Unicode (anatomy.text.check_text)."""
    if isinstance(inputs, str) or (isinstance(inputs, Sequence) and inputs and all(isinstance(x, str) for x in inputs)):
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        named = "the text" if side == "input" else f"the {side} text"
        texts = [check_text(text, named if len(texts) == 1 else f"{named} at index {i}", empty=side == "target")
                 for i, text in enumerate(texts)]
        tok = _tokenizer(model, tokenizer)
        if side == "target":
            rows = [tok.encode_target(text, model.config.decoder_start_token_id) for text in texts]
        else:
            rows = tok.encode_batch(texts, max_length=tok.max_length,
                                    prompt=side == "input" and model.config.arch == "decoder")
        ids, mask = tok.pad(rows)
        tokens = [tok.labels(row) + [""] * (ids.size(1) - len(row)) for row in rows]
        return Text(ids, mask if not bool(mask.all()) else None, tokens)
    ids = inputs if torch.is_tensor(inputs) else _as_ids(inputs)
    if ids.dim() == 1:
        ids = ids[None]  # (T,) -> (1, T)
    if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise InputError(f"inputs must be a string, a list of strings, or integer token ids [T] or [batch, T]; "
                         f"got a tensor of shape {tuple(ids.shape)} and dtype {ids.dtype}")
    ids = ids.long()
    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tok is not None:
        tokens = [tok.labels(row.tolist()) for row in ids]
    else:
        tokens = [[str(int(i)) for i in row] for row in ids]
    return Text(ids, None, tokens)


def _as_ids(inputs) -> torch.Tensor:
    if isinstance(inputs, Iterable) and not isinstance(inputs, (bytes, dict)):
        try:
            return torch.as_tensor(inputs, device="cpu")  # on the model's device once a Batch
        except (TypeError, ValueError, RuntimeError):
            pass
    raise InputError(f"inputs must be a string, a list of strings, or token ids; got {type(inputs).__name__}")


def as_batch(model: nn.Module, inputs, tokenizer=None) -> Batch:
    """Inputs for `model`, on its device: for an encoder-decoder, a pair (source, target) of any of the forms
    above."""
    if isinstance(inputs, Batch):
        return inputs.on(model)
    if model.config.arch == "encoder-decoder":
        if not (isinstance(inputs, tuple) and len(inputs) == 2):
            raise InputError("an encoder-decoder model takes inputs=(source, target), each a string, a list of "
                             "strings or token ids")
        source, target = as_text(model, inputs[0], tokenizer, "source"), as_text(model, inputs[1], tokenizer, "target")
        if source.ids.size(0) != target.ids.size(0):
            raise InputError(f"source has batch {source.ids.size(0)} but target has batch {target.ids.size(0)}")
        return Batch(target, source).on(model)
    return Batch(as_text(model, inputs, tokenizer)).on(model)


def run_with_cache(model: nn.Module, inputs, names=None, *, tokenizer=None, grad: bool = False):
    """(output, Trace): one forward pass of `inputs` with the trace points `names` recorded (None: all
    but the on-request per-head outputs; TransformerLens names accepted). `Trace.tokens` holds the
    string tokens of the (decoder's) input. Runs without gradients unless grad=True.

    A full cache (names=None, grad=False) keeps the points derived.py lists (attention scores,
    patterns and z, MLP activations, the residual stream, norm outputs) as recipes over the points
    it stores, and computes each when first read: bitwise the value of the pass, at about half the
    memory until read (GPT-2: 69.5 of 131 MB)."""
    batch = as_batch(model, inputs, tokenizer)
    derivations = Derivations(model) if names is None and not grad else None
    with torch.set_grad_enabled(grad), trace(model, names, grad=grad, derive=derivations) as cache, \
            derivations.capturing() if derivations is not None else nullcontext():
        output = batch.run(model)
    cache.tokens = batch.target.tokens
    return output, cache


__all__ = ["Batch", "Text", "Trace", "as_batch", "as_text", "run_with_cache"]
