"""The models the explorer may open: those given on the command line, and (--allow-open) those the page opens.

Each is a ModelSlot, its config read at once and its weights loaded on first use, with the sparse
autoencoders and transcoder set attached to it (--sae, --transcoders).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from ..checkpoints import from_pretrained
from ..checkpoints.describe import config_of
from ..config import ModelConfig
from .values import ExploreError

MAX_OPENED = 4  # models the page may have opened (--allow-open) at once, besides those given


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

        slot, path = self._slot_and_path(given)
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

        slot, path = self._slot_and_path(given)
        sae = load_sae(path)
        if sae.point is None:
            raise ValueError(f"the SAE in {path!r} does not say which trace point it reads")
        width = slot.config.d_model if slot.config is not None else None
        if width is not None and not sae.flatten_heads and sae.d_in != width:
            raise ValueError(f"the SAE in {path!r} reads vectors of {sae.d_in}; {slot.name} has d_model {width}")
        slot.saes[Path(path).name or path] = sae.eval()

    def _slot_and_path(self, given: str) -> tuple[ModelSlot, str]:
        """(the slot, the path) of `MODEL=PATH`, MODEL a model given; else (the first model's slot, `given`)."""
        model, _, path = given.rpartition("=") if "=" in given and given.split("=", 1)[0] in self.slots else ("", "", given)
        return (self.slots[model] if model else next(iter(self.slots.values()))), path

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
