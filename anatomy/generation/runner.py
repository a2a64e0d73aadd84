"""One step of generation: the logits of the next token, with a KV cache, and past the context.

Shape letters: B batch (rows: prompts, or prompts x beams), T positions, V vocabulary.

The KV cache (cache.py) makes each step cost one position instead of the whole sequence: the
prompt is run once ("prefill"), then each step feeds only the token just chosen.

Past the context. A model whose positions come from a table (learned, sinusoidal, rotary) has
seen at most max_seq_len positions. Once a sequence is longer, the window slides, as in nanoGPT's
`generate`: the last max_seq_len tokens are cropped and run again from scratch, numbered from 0,
at every step. The cache cannot serve here, because every token's position changes each time the
window moves. ALiBi and models without positions have no table and no window.
"""

from __future__ import annotations

import torch

from ..models import EncoderDecoderModel


class Runner:
    """Gives the logits of the next token, for decoder-only and encoder-decoder models alike.

    With a cache, `next_logits(sequences, end)` feeds only the columns the cache has not seen yet
    (the whole prompt on the first call, then one token); without, it feeds sequences[:, :end]
    every time. Past `window` columns it feeds the last `window` columns and no cache. Either way
    it returns the logits at column end - 1, [B, V], in float32, and refuses NaN.
    """

    def __init__(self, model, *, use_cache: bool, capacity: int, padding_mask: torch.Tensor | None,
                 memory: torch.Tensor | None, memory_mask: torch.Tensor | None):
        self.model = model
        self.window = context_window(model)  # None: unbounded
        if self.window is not None:
            capacity = min(capacity, self.window)
        self.cache = model.new_cache(capacity) if use_cache else None
        self.padding_mask = padding_mask  # (B, T_total) or None: every column real
        self.memory = memory  # (B, S, E), encoder-decoder only
        self.memory_mask = memory_mask  # (B, S)
        self.slid = False  # True once a step ran on a cropped window
        self.steps = 0

    def next_logits(self, sequences: torch.Tensor, end: int) -> torch.Tensor:
        start = self.cache.length if self.cache is not None else 0
        if self.window is not None and end > self.window:
            self.cache, self.slid = None, True  # from here on, every step recomputes its window
            start = end - self.window
        ids = sequences[:, start:end]  # (B, T_new)
        if self.cache is not None or start == 0:
            mask = self.padding_mask[:, :end] if self.padding_mask is not None else None  # past + new
        else:
            mask = self.padding_mask[:, start:end] if self.padding_mask is not None else None  # the window
        if self.memory is not None:
            _, logits = self.model.decode(ids, self.memory, self.memory_mask, mask, self.cache)
        else:
            past = self.cache.length if self.cache is not None else 0
            positions = position_ids(self.model, mask)
            if positions is not None:
                positions = positions[:, past:]  # the new columns' positions
            logits = self.model(ids, padding_mask=mask, position_ids=positions, cache=self.cache).logits
        logits = logits[:, -1].float()  # (B, V)
        self.steps += 1
        if torch.isnan(logits).any():
            raise ValueError(
                f"the model gave NaN logits at generation step {self.steps}: its weights or config hold a "
                "non-finite value (e.g. layer_norm_epsilon), so no token can be chosen"
            )
        return logits

    def reorder(self, rows: torch.Tensor) -> None:
        """Beam search: row i continues row rows[i]. Only the cache depends on the row's history;
        masks and memory are the same for every beam of one prompt, and a beam's parent is always
        a beam of the same prompt."""
        if self.cache is not None:
            self.cache.reorder(rows)


def context_window(model) -> int | None:
    """The most positions the model's (decoder's) position table covers; None: unbounded."""
    stack = model.decoder if isinstance(model, EncoderDecoderModel) else model
    return stack.max_positions


def position_ids(model, padding_mask: torch.Tensor | None) -> torch.Tensor | None:
    """[B, T]: each token's position counted over real tokens only (pads get 0).

    Left padding shifts a row's tokens to the right; numbering them by real tokens gives each the
    position it would have alone. ALiBi and "none" need no ids: ALiBi depends only on the
    distance between two columns, which left padding does not change (the stack measures it
    between sequence slots and ignores position ids).
    """
    if padding_mask is None or model.config.pos_encoding in ("alibi", "none"):
        return None
    return (padding_mask.long().cumsum(dim=1) - 1).clamp(min=0)
