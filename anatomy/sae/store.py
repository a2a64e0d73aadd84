"""Activations of a trace point, harvested from passes that stop there, served in shuffled batches.

Shape letters: N contexts, T tokens per context, R rows (activation vectors), B rows per batch,
E the width harvested (d_in, or d_in + d_out for a transcoder: its input and target side by side).

    tokens (one stream) -> contexts of T tokens -> a fill of N contexts -> passes stopped at the point
        -> R = N (T - skip) rows [R, E] -> shuffled -> R // B batches of [B, E]

The pass stops where the point is reached (`harvest`): an intervention on the last point needed raises
and the rest of the model never runs, so a middle layer of a 30-layer model costs about half a pass
(no later blocks, no LM head). The first `skip` positions of each context are left out: the first
token's residual stream is an outlier, SmolLM2's 100 times the norm of the others (an attention sink),
which an SAE would spend features on.

Memory is bounded by one fill (`fill_tokens` rows). With `shards` (a folder), each fill is written once
as a safetensors file and read back on later epochs instead of running the model again.

Which rows a batch holds is a pure function of (seed, step): the order of the contexts is drawn once,
each epoch visits the fills in its own order and shuffles each fill with its own generator, so a run
resumed at step s draws exactly the batches of the uninterrupted run. Under DistributedDataParallel each
rank harvests its own share of the contexts (every world_size-th) and serves its own rows.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ..checkpoints.writing import replacing
from ..trace import anatomy_name, trace, trace_points


class _Reached(Exception):
    """Raised inside the pass once every point asked for has been recorded: the rest does not run."""


def harvest(model: nn.Module, ids: torch.Tensor, points: Sequence[str]) -> list[torch.Tensor]:
    """[B, T] token ids -> the values of `points` ([B, T, ...] each) from one pass that stops as soon
    as all of them are reached (later layers and the head never run). Raises KeyError for a point the
    model lacks, ValueError when the pass ends without reaching one."""
    if getattr(model.config, "arch", None) == "encoder-decoder":
        raise ValueError("harvesting reads one stream of tokens: a decoder or an encoder, not an encoder-decoder")
    names = [anatomy_name(p) for p in points]
    available = trace_points(model)
    missing = [p for p in names if p not in available]
    if missing:
        raise KeyError(f"this model has no trace point {missing[0]!r} (see anatomy.trace_points(model))")
    values: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def fn(x: torch.Tensor) -> torch.Tensor:
            values[name] = x.detach()
            if len(values) == len(names):
                raise _Reached
            return x
        return fn

    with torch.no_grad(), trace(model, [], interventions={name: keep(name) for name in names}):
        try:
            model(ids)
        except _Reached:
            pass
    if len(values) < len(names):
        raise ValueError(f"the forward pass did not reach {sorted(set(names) - set(values))}")
    return [values[name] for name in names]


class ActivationStore:
    """Shuffled batches [B, E] of the values of `points` over `tokens` (see the module docstring).

    points: the point an SAE reads, or (input, output) for a transcoder (rows hold both, concatenated).
    tokens: a 1-D array of token ids (a np.memmap is fine). context: T; skip: positions left out at
    the start of each context; fill_tokens: rows per fill (the memory bound); harvest_batch: contexts
    per forward pass; shards: a folder for the fills' safetensors files (None: keep nothing on disk).
    """

    def __init__(self, model: nn.Module, points: Sequence[str], tokens: np.ndarray, *, context: int = 128,
                 batch_size: int = 4096, fill_tokens: int = 2**18, skip: int = 1, harvest_batch: int = 16,
                 seed: int = 0, rank: int = 0, world_size: int = 1, shards: str | os.PathLike | None = None,
                 dtype: torch.dtype = torch.float32):
        if not 0 <= skip < context:
            raise ValueError(f"skip must be in [0, context={context}), got {skip}")
        n_contexts = len(tokens) // context
        rows_per_context = context - skip
        contexts_per_fill = max(1, math.ceil(fill_tokens / rows_per_context))
        mine = n_contexts // world_size  # every rank gets as many contexts as the others
        if mine * rows_per_context < batch_size:
            raise ValueError(f"{len(tokens):,} tokens make {mine * rows_per_context:,} rows per rank, fewer than one "
                             f"batch of {batch_size}: give more text or a smaller --batch-size")
        self.model, self.points, self.tokens = model, [anatomy_name(p) for p in points], tokens
        self.context, self.skip, self.batch_size, self.harvest_batch = context, skip, batch_size, harvest_batch
        self.seed, self.rank, self.world_size, self.dtype = seed, rank, world_size, dtype
        order = np.random.default_rng([seed, 0]).permutation(n_contexts)[:mine * world_size]
        contexts = order[rank::world_size]  # this rank's contexts, in the run's fixed order
        self.fills = [contexts[i:i + contexts_per_fill] for i in range(0, len(contexts), contexts_per_fill)]
        rows = [len(fill) * rows_per_context for fill in self.fills]
        self.batches_per_fill = [r // batch_size for r in rows]
        self.steps_per_epoch = sum(self.batches_per_fill)
        self.shards = Path(shards) if shards is not None else None
        self._loaded: tuple[int, torch.Tensor] | None = None  # (fill, its rows)
        self._shuffled: tuple[tuple[int, int], torch.Tensor] | None = None  # ((epoch, fill), row order)

    @property
    def rows(self) -> int:
        """Rows one epoch serves on this rank."""
        return self.steps_per_epoch * self.batch_size

    def batch(self, step: int) -> torch.Tensor:
        """[B, E]: the rows of optimizer step `step` (counted from 0 over the whole run)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        fill_order = np.random.default_rng([self.seed, 1, epoch]).permutation(len(self.fills))
        for fill in fill_order:
            if within < self.batches_per_fill[fill]:
                break
            within -= self.batches_per_fill[fill]
        rows = self.fill(int(fill))
        if self._shuffled is None or self._shuffled[0] != (epoch, fill):
            order = np.random.default_rng([self.seed, 2, epoch, int(fill)]).permutation(len(rows))
            self._shuffled = ((epoch, fill), torch.from_numpy(order))
        order = self._shuffled[1][within * self.batch_size:(within + 1) * self.batch_size]
        return rows[order]

    def first_rows(self, count: int) -> torch.Tensor:
        """[<= count, E]: rows of the fill that step 0 reads, in its epoch-0 order (no other fill harvested)."""
        fill = int(np.random.default_rng([self.seed, 1, 0]).permutation(len(self.fills))[0])
        self.batch(0)  # loads that fill and its order
        return self.fill(fill)[self._shuffled[1][:count]]

    def fill(self, index: int) -> torch.Tensor:
        """[R, E]: the rows of fill `index`, from memory, its shard, or passes of the model (then kept)."""
        if self._loaded is not None and self._loaded[0] == index:
            return self._loaded[1]
        self._loaded = None  # free the previous fill before making the next
        shard = None if self.shards is None else self.shards / f"fill-{self.rank:03d}-{index:05d}.safetensors"
        rows = _read_shard(shard) if shard is not None and shard.is_file() else None
        if rows is None:
            rows = self.harvest_contexts(self.fills[index])
            if shard is not None:
                _write_shard(shard, rows)
        self._loaded = (index, rows)
        return rows

    def harvest_contexts(self, contexts: np.ndarray) -> torch.Tensor:
        """[len(contexts) (T - skip), E]: the points' values on those contexts."""
        return harvest_rows(self.model, self.points, self.tokens, contexts, context=self.context, skip=self.skip,
                            harvest_batch=self.harvest_batch, dtype=self.dtype)


def harvest_rows(model: nn.Module, points: Sequence[str], tokens: np.ndarray, contexts: np.ndarray, *,
                 context: int, skip: int, harvest_batch: int = 16, dtype: torch.dtype | None = None) -> torch.Tensor:
    """[len(contexts) (T - skip), E]: the values of `points` (side by side) on the contexts numbered `contexts`
    (context c = tokens[c T : (c + 1) T]), the first `skip` positions of each dropped, [.., head, d_head]
    points flattened; in `dtype` (default the model's), each pass's rows written into place as they come,
    so that no second copy of the whole is ever made."""
    rows, done = None, 0
    for start in range(0, len(contexts), harvest_batch):
        chosen = contexts[start:start + harvest_batch]
        ids = torch.from_numpy(np.stack([np.asarray(tokens[c * context:(c + 1) * context], dtype=np.int64)
                                         for c in chosen]))  # (n, T)
        kept = [v[:, skip:].flatten(2) for v in harvest(model, ids, points)]  # (n, T - skip, .) each
        part = torch.cat(kept, dim=-1).flatten(0, 1)  # (n (T - skip), E)
        if rows is None:
            rows = part.new_empty((len(contexts) * (context - skip), part.size(1)), dtype=dtype or part.dtype)
        rows[done:done + len(part)] = part
        done += len(part)
    return rows


def rows_of(model: nn.Module, points: Sequence[str], tokens: np.ndarray, *, context: int = 128, skip: int = 1,
            limit: int | None = None) -> torch.Tensor:
    """[R, E]: the rows of `points` on consecutive contexts of `tokens`, in order; at most `limit` rows
    (rounded up to whole contexts)."""
    n = len(tokens) // context
    if limit is not None:
        n = min(n, max(1, math.ceil(limit / (context - skip))))
    if n == 0:
        raise ValueError(f"{len(tokens)} tokens make no context of {context}: give more text")
    return harvest_rows(model, points, tokens, np.arange(n), context=context, skip=skip)


def _write_shard(path: Path, rows: torch.Tensor) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as temporary:
        save_file({"rows": rows.contiguous()}, str(temporary))


def _read_shard(path: Path) -> torch.Tensor | None:
    """The shard's rows, or None (it is made again) when it cannot be read."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            return handle.get_tensor("rows")
    except Exception:  # noqa: BLE001 - a torn or foreign file: harvest again, and overwrite it
        return None


def corpus_tokens(paths: Sequence[str | os.PathLike], tokenizer, eval_fraction: float | None = 0.05,
                  cache_dir: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(training tokens, held-out tokens): each file tokenized once (the training floor's memory-mapped
    cache), its last `eval_fraction` held out (None: none), the parts joined in the order of `paths`."""
    from ..training.data import split_tokens, tokenize_to_memmap

    train, held = [], []
    for path in paths:
        ids = tokenize_to_memmap(path, tokenizer, cache_dir)
        a, b = split_tokens(ids, eval_fraction) if eval_fraction else (ids, ids[:0])
        train.append(np.asarray(a, dtype=np.int64))  # torch has no arithmetic on uint16 ids
        held.append(np.asarray(b, dtype=np.int64))
    return np.concatenate(train), np.concatenate(held)
