"""What the explorer holds between requests: the models it may open, and the traced passes it ran.

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
from pathlib import Path

import torch
from torch import nn

from ..analysis import run_with_cache
from ..analysis.prefix import PrefixPass, common_prefix, extend, extendable
from ..checkpoints import from_pretrained
from ..checkpoints.describe import config_of
from ..config import ModelConfig
from ..generation import generate
from ..text import check_text as check_readable
from .lanes import raise_if_gone

MAX_TEXT_CHARACTERS = 8000  # a text the page may send
MAX_TOKENS = 512  # positions a pass may have (the panels page through longer axes)
MAX_TRANSLATION = 48  # tokens an encoder-decoder writes when no target is given
MAX_OPENED = 4  # models the page may have opened (--allow-open) at once, besides those given


def give_back_memory() -> None:
    """Return the heap that a computation freed to the system (glibc's malloc_trim, 0.4 ms): a lens
    over 49,152 tokens builds and drops [layers, positions, vocabulary] arrays, and without this the
    server's resident memory keeps their high-water mark."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        pass


class ExploreError(ValueError):
    """A request the explorer refuses, with the reason and the allowed values (a 4xx)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class ModelSlot:
    """One model the explorer may open: loaded on first use, then kept. `lock` serialises its
    computations (one forward pass at a time per model)."""

    name: str
    config: ModelConfig | None = None
    model: nn.Module | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    loading: threading.Lock = field(default_factory=threading.Lock)
    load_seconds: float | None = None
    cache: dict = field(default_factory=dict)  # per-model results computed once (head scores)
    shared: set = field(default_factory=set)  # the storages of the model's parameters and buffers
    saes: dict = field(default_factory=dict)  # name -> a sparse autoencoder on one of its points
    transcoders: object = None  # a TranscoderSet for the circuit panel (anatomy.circuits), or None

    def get(self) -> nn.Module:
        """The model, loaded the first time it is asked for (once, whatever thread asks)."""
        with self.loading:
            if self.model is None:
                began = time.perf_counter()
                model = from_pretrained(self.name)
                if getattr(model, "tokenizer", None) is None:
                    raise ExploreError(f"{self.name} has no tokenizer: the explorer needs one to read text")
                self.model, self.config = model.eval(), model.config
                self.shared = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
                self.load_seconds = time.perf_counter() - began
        return self.model

    def describe(self) -> dict:
        config = self.config
        info = {"name": self.name, "loaded": self.model is not None}
        if config is not None:
            decoder = config.decoder_config() if config.arch == "encoder-decoder" else config
            info.update(arch=config.arch, n_layers=decoder.n_layers, n_heads=decoder.n_heads, d_model=config.d_model,
                        d_ff=config.d_ff, vocab_size=config.vocab_size, head=config.head,
                        encoder_layers=config.n_layers if config.arch == "encoder-decoder" else None,
                        # direct logit attribution needs a residual stream that sums its components
                        sums_components=config.norm_position == "pre" and not config.lm_head_transform
                        and config.final_logit_softcap is None)
        info["saes"] = [{"name": name, "point": sae.point, "d_sae": sae.d_sae, "kind": sae.kind}
                        for name, sae in self.saes.items()]
        info["transcoders"] = None if self.transcoders is None else {
            "d_transcoder": self.transcoders.d_transcoder, "kind": self.transcoders.kind,
            "cross_layer": self.transcoders.cross_layer}
        return info


class Models:
    """The models given on the command line, and (with allow_open) up to max_opened more that the
    page opened: each resolved and loaded before it is listed, the least recently used closed when
    one more opens."""

    def __init__(self, names: list[str], *, allow_open: bool = False, saes: list[str] = (),
                 transcoders: list[str] = (), max_opened: int = MAX_OPENED):
        self.slots: dict[str, ModelSlot] = {}
        self.allow_open = allow_open
        self.max_opened = max_opened
        self._opened: OrderedDict[str, ModelSlot] = OrderedDict()  # opened from the page, least recently used first
        self._lock = threading.Lock()
        self._opening = threading.Lock()  # one model opens at a time
        for name in names:
            self.add(name)
        for given in saes:
            self.attach_sae(given)
        for given in transcoders:
            self.attach_transcoders(given)

    def attach_transcoders(self, given: str) -> None:
        """`MODEL=RUN` (or RUN, for the first model): a transcoder set (anatomy.load_transcoders: a run folder,
        circuit-tracer's or Gemma Scope 2's files) for the circuit panel, checked against the model's config
        (its layers and width) before any pass; CheckpointError or ValueError in one line."""
        from ..sae import load_transcoders

        model, _, path = given.rpartition("=") if "=" in given and given.split("=", 1)[0] in self.slots else ("", "", given)
        slot = self.slots[model] if model else next(iter(self.slots.values()))
        transcoders = load_transcoders(path)
        config = slot.config
        if config is not None and (transcoders.n_layers != config.n_layers or transcoders.d_model != config.d_model):
            raise ValueError(f"the transcoders in {path!r} have {transcoders.n_layers} layers of width {transcoders.d_model}; "
                             f"{slot.name} has {config.n_layers} of {config.d_model}")
        slot.transcoders = transcoders

    def attach_sae(self, given: str) -> None:
        """`MODEL=PATH` (or PATH, for the first model): a sparse autoencoder (anatomy.load_sae: an
        `anatomy sae train` run, SAELens's or Gemma Scope's files) on the point its files name, checked
        against the model's width before any pass."""
        from ..sae import load_sae

        model, _, path = given.rpartition("=") if "=" in given and given.split("=", 1)[0] in self.slots else ("", "", given)
        slot = self.slots[model] if model else next(iter(self.slots.values()))
        sae = load_sae(path)
        if sae.point is None:
            raise ValueError(f"the SAE in {path!r} does not say which trace point it reads")
        width = slot.config.d_model if slot.config is not None else None
        if width is not None and not sae.flatten_heads and sae.d_in != width:
            raise ValueError(f"the SAE in {path!r} reads vectors of {sae.d_in}; {slot.name} has d_model {width}")
        slot.saes[Path(path).name or path] = sae.eval()

    def add(self, name: str) -> ModelSlot:
        """A slot for a model given on the command line, its config read without loading a weight
        (CheckpointError if none)."""
        with self._lock:
            if name not in self.slots:
                self.slots[name] = ModelSlot(name, config_of(name))
            return self.slots[name]

    def listed(self) -> list[ModelSlot]:
        """The models the page may use now, those given first."""
        with self._lock:
            return list(self.slots.values())

    def slot(self, name) -> ModelSlot:
        """A listed model (ExploreError: 403 for another name, 404 with allow_open: open it first)."""
        if not isinstance(name, str) or not name:
            raise ExploreError("'model' must be the name of a model; GET /api/models lists them")
        with self._lock:
            found = self.slots.get(name)
            if found is not None:
                if name in self._opened:
                    self._opened.move_to_end(name)
                return found
        if not self.allow_open:
            raise ExploreError(f"model {name[:200]!r} is not open here: the explorer was started with "
                               f"{', '.join(list(self.slots)[:8])}; opening another path or Hub id from the page "
                               "needs `anatomy explore --allow-open`", status=403)
        raise ExploreError(f"model {name[:200]!r} is not open: POST /api/open {{\"model\": NAME}} opens it", status=404)

    def open(self, name) -> ModelSlot:
        """A listed model, or (allow_open) the model `name` opened now: its config resolved, its
        weights loaded (a Hub id fetched), then listed; a model that cannot open is never listed.
        Blocks while it loads: call it from a worker thread. Raises ExploreError: 403 without
        allow_open, 429 while another model opens, 400 naming why this one cannot open."""
        if not isinstance(name, str) or not name:
            raise ExploreError("'model' must be the name of a model, a folder, a .gguf file or a Hub id")
        try:
            return self.slot(name)
        except ExploreError as error:
            if error.status != 404:
                raise
        if not self._opening.acquire(blocking=False):
            raise ExploreError("another model is opening; ask again once it has", status=429)
        try:
            slot = ModelSlot(name, config_of(name))
            slot.get()
        except ExploreError:
            raise
        except Exception as error:  # noqa: BLE001 - whatever a named path or Hub id does, the page is told why
            why = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
            raise ExploreError(f"cannot open {name[:200]!r}: {why[:300]}") from None
        finally:
            self._opening.release()
        with self._lock:
            self.slots[name] = self._opened[name] = slot
            while len(self._opened) > self.max_opened:
                closed, _ = self._opened.popitem(last=False)
                del self.slots[closed]  # its weights go once no request and no job holds them
        return slot


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
