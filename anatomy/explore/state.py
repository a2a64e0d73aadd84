"""What the explorer holds between requests: the traced passes it ran (the models it may open: models.py).

Shape letters: T positions (the decoder's, or the only side), S source positions, V vocabulary.

One traced pass per (model, text) feeds every panel: `Passes.get` runs `anatomy.run_with_cache`
once (every trace point, the derived ones kept as recipes) and keeps it, least recently used first
out, within a memory budget. Each model computes one thing at a time (its lock), so that two
panels asking at once share the pass instead of running it twice, and a request whose browser
went away while it waited is dropped (app.py) before it costs anything.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from torch import nn

from ..analysis import run_with_cache
from ..analysis.prefix import PrefixPass, common_prefix, extend, extendable
from ..generation import generate
from ..text import check_text as check_readable
from .lanes import raise_if_gone
from .models import MAX_OPENED, ModelSlot, Models
from .values import ExploreError

MAX_TEXT_CHARACTERS = 8000  # a text the page may send
MAX_TOKENS = 512  # positions a pass may have (the panels page through longer axes)
MAX_TRANSLATION = 48  # tokens an encoder-decoder writes when no target is given


def give_back_memory() -> None:
    """Return the heap that a computation freed to the system (glibc's malloc_trim, 0.4 ms): a lens
    over 49,152 tokens builds and drops [layers, positions, vocabulary] arrays, and without this the
    server's resident memory keeps their high-water mark."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        pass


@dataclass
class Pass:
    """One traced forward pass of one text (an encoder-decoder: a source and a target)."""

    model: str
    text: str
    target: str | None
    ids: list[int]  # the decoder's (or the only side's) ids, [T]
    tokens: list[str]  # them as text ("␣Paris")
    source_ids: list[int] | None  # an encoder-decoder's source, [S]
    source_tokens: list[str] | None
    translated: bool  # the target was written by the model (none was given)
    trace: object  # the Trace of every point
    seconds: float
    prefix: PrefixPass | None = None  # a decoder's pass, which the next text's continues (analysis/prefix.py)
    kept: int = 0  # the positions this pass kept from the one it continued; the others it computed
    shared: set = field(default_factory=set, repr=False)  # the model's own storages (ModelSlot.shared)
    # what panels computed on this pass, by name: each value has tensors() (what it keeps) and may have
    # first(n) (itself for the first n positions, carried over to the pass that continues this one)
    memo: dict = field(default_factory=dict, repr=False)

    @property
    def predicts(self) -> bool:
        """Whether the model writes token logits here (an LM or masked-LM head)."""
        return any(name in self.trace and self.trace.axes(name)[-1] == "vocab" for name in ("logits", "decoder.logits"))

    def logits_at(self, position: int) -> torch.Tensor:
        """[V] float32: the logits at one position (a continued pass reads them from their piece, never
        joining the [T, V] logits)."""
        if self.prefix is not None:
            return self.prefix.logits_at(position).float()
        return self.logits[position]

    @property
    def logits(self) -> torch.Tensor:
        """[T, V] float32 (an empty [T, 0] for a model without an LM head)."""
        if not self.predicts:
            return torch.zeros(len(self.ids), 0)
        return self.trace["logits" if "logits" in self.trace else "decoder.logits"][0].float()

    def nbytes(self) -> int:
        """The bytes this pass holds now (derived points grow as panels read them), each storage
        once, less the `shared` storages (the model's own parameters and buffers, which a recipe
        refers to but never copies: rotary's cos/sin tables)."""
        return sum(storages([self], self.shared).values())

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the pass keeps: its trace's, and those of what panels computed on it (each
        memo value's tensors(): the lens's rows, the walk's matrices)."""
        return [*self.trace.stored(), *(t for value in self.memo.values() for t in value.tensors())]


def storages(passes, shared: set) -> dict[int, int]:
    """{storage address: bytes} of every tensor the passes keep (Pass.tensors), but the `shared` ones:
    a storage that continued passes share (the pieces of their common prefix) counts once."""
    held = {}
    for p in passes:
        for tensor in p.tensors():
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in shared:
                held[storage.data_ptr()] = storage.nbytes()
    return held


def check_length(model: nn.Module, name: str, count: int) -> None:
    """ExploreError (413) when a text of `count` tokens is past MAX_TOKENS or the model's positions."""
    config = model.config
    limit = config.max_seq_len if config.pos_encoding in ("learned", "sinusoidal", "rotary") else None
    if limit is not None and limit <= MAX_TOKENS and count > limit:  # the smaller limit is the one to name
        raise ExploreError(f"the text is {count} tokens long; {name} reads at most {limit}", status=413)
    if count > MAX_TOKENS:
        raise ExploreError(f"the text is {count} tokens long; the explorer reads at most {MAX_TOKENS}", status=413)


def text_ids(model: nn.Module, text: str, target: str | None, name: str = "the model") -> tuple[list[int], list[int] | None, bool]:
    """(ids, source ids or None, whether the target was translated by the model) for a text; a
    source past the limits is refused (check_length) before the model translates it."""
    tokenizer, config = model.tokenizer, model.config
    if config.arch != "encoder-decoder":
        return tokenizer.encode_for(config, text)[0], None, False
    source = tokenizer.encode(text)
    check_length(model, name, len(source))
    if target is not None:
        return tokenizer.encode_target(target, config.decoder_start_token_id), source, False
    start = config.decoder_start_token_id if config.decoder_start_token_id is not None else tokenizer.bos_id
    stops = [i for i in (config.eos_token_id, tokenizer.eos_id) if i is not None]
    out = generate(model, src_ids=torch.tensor([source]), decoder_start_token_id=start,
                   max_new_tokens=MAX_TRANSLATION, stop_tokens=stops or None)
    row = out.sequences[0][out.padding_mask[0]].tolist()
    if len(row) > 1 and row[-1] in stops:
        row = row[:-1]  # the decoder's input stops before its end token
    return row, source, True


def check_text(text, name: str = "text") -> str:
    if not isinstance(text, str):
        raise ExploreError(f"'{name}' must be a string")
    if len(text) > MAX_TEXT_CHARACTERS:
        raise ExploreError(f"'{name}' has {len(text)} characters; the explorer takes at most {MAX_TEXT_CHARACTERS}",
                           status=413)
    return check_readable(text, f"'{name}'")  # not empty, valid Unicode: anatomy's one check (InputError, 400)


# The traced passes' memory budget: four SmolLM2 passes of 16 tokens (about 15 MB each), so the panels
# of the text being typed and the last few read from memory. Every 64 MB more was 64-96 MB more resident.
CACHE_BYTES = 64 * 2**20
# ... and at most this many passes: a toy's pass holds 2.5 KB of tensors but 26 KB in all (Python's
# objects around them), so a byte budget alone kept 25,000 of them (650 MB) after as many keystrokes.
MAX_PASSES = 64


class Passes:
    """Traced passes by (model, text, target), least recently used first out, within `budget` bytes
    and MAX_PASSES passes (the newest pass is kept whatever its size).

    A decoder's pass continues the cached pass of the same model that shares the longest prefix of
    token ids with it (analysis/prefix.py): a keystroke computes the positions after that prefix only,
    and what panels computed on the kept positions (Pass.memo: the lens's rows) is carried over."""

    def __init__(self, budget: int = CACHE_BYTES):
        self.budget = budget
        self._passes: OrderedDict[tuple, Pass] = OrderedDict()
        self._lock = threading.Lock()
        self._making: dict[tuple, threading.Lock] = {}  # a pass being made, by key: its requests share it

    def cached(self, slot: ModelSlot, text: str, target: str | None = None) -> Pass | None:
        """The pass of `text` if the cache holds it (marked as just used), else None."""
        key = (slot.name, text, target)
        with self._lock:
            found = self._passes.get(key)
            if found is not None:
                self._passes.move_to_end(key)
            return found

    def get(self, slot: ModelSlot, text: str, target: str | None = None) -> Pass:
        """The pass of `text` on the slot's model: from the cache, or run now (continuing the cached
        pass with the longest common prefix, for a decoder)."""
        check_text(text)
        if target is not None:
            check_text(target, "target")
        found = self.cached(slot, text, target)
        if found is not None:
            return found
        key = (slot.name, text, target)
        with self._lock:  # one pass per text, whoever asks: other texts (another client's) are made at once
            making = self._making.setdefault(key, threading.Lock())
        with making:
            found = self.cached(slot, text, target)  # made while this request waited
            if found is None:
                try:
                    found = self._run(slot, text, target)
                    with self._lock:
                        self._passes[key] = found
                        while len(self._passes) > 1 and (self.held() > self.budget or len(self._passes) > MAX_PASSES):
                            self._passes.popitem(last=False)
                finally:
                    with self._lock:
                        self._making.pop(key, None)
        return found

    def _run(self, slot: ModelSlot, text: str, target: str | None) -> Pass:
        model = slot.get()
        began = time.perf_counter()
        ids, source, translated = text_ids(model, text, target, slot.name)
        check_length(model, slot.name, max(len(ids), len(source or [])))
        if not ids:
            raise ExploreError("the text has no tokens: type something")
        tokenizer = model.tokenizer
        tokens = tokenizer.labels(ids)
        if source is None and extendable(model):
            base = self._base(slot.name, ids)
            # a keystroke's pass stops at its next trace point once a later keystroke superseded it
            continued = extend(model, ids, base.prefix if base else None, tokens=tokens, check=raise_if_gone)
            kept = len(ids) - continued.computed
            memo = {name: value.first(kept) for name, value in base.memo.items()
                    if kept and hasattr(value, "first")} if base else {}
            return Pass(slot.name, text, target, ids, tokens, None, None, False, continued.trace,
                        time.perf_counter() - began, continued, kept, slot.shared, memo)
        inputs = torch.tensor([ids]) if source is None else (torch.tensor([source]), torch.tensor([ids]))
        _, trace = run_with_cache(model, inputs)
        return Pass(slot.name, text, target, ids, tokens, source, None if source is None else tokenizer.labels(source),
                    translated, trace, time.perf_counter() - began, shared=slot.shared)

    def _base(self, model: str, ids: list[int]) -> Pass | None:
        """The cached pass of `model` to continue: the longest common prefix with `ids`, the newest
        among equals."""
        with self._lock:
            candidates = [p for p in self._passes.values() if p.model == model and p.prefix is not None]
        best, length = None, 0
        for p in reversed(candidates):
            shared = common_prefix(p.ids, ids)
            if shared > length:
                best, length = p, shared
        return best

    def held(self) -> int:
        """The bytes every cached pass holds, each storage once (call with the cache's lock held)."""
        shared = next(iter(self._passes.values())).shared if self._passes else set()
        return sum(storages(self._passes.values(), shared).values())

    def __len__(self) -> int:
        return len(self._passes)


__all__ = ["CACHE_BYTES", "ExploreError", "MAX_OPENED", "MAX_PASSES", "MAX_TOKENS", "ModelSlot", "Models", "Pass", "Passes", "check_text"]
