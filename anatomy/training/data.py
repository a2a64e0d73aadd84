"""Data: files on disk -> batches of token ids, for the three tasks.

| task      | input                                   | one example                              |
|-----------|-----------------------------------------|------------------------------------------|
| `lm`      | one text file                           | a random block of T+1 consecutive tokens |
| `seq2seq` | two line-aligned files (source, target) | line i of source, line i of target       |
| `classify`| a TSV: text <TAB> label                 | one row                                  |

Token ids are written once to a cache file (`uint16` when the vocabulary fits, else `uint32`) and
read back with `np.memmap`, so only the pages a batch touches are in memory: a corpus larger than
memory trains. The cache key is the file's path, size and mtime plus the tokenizer, so editing either
re-tokenizes.

Which examples a batch holds is a pure function of `(seed, step)`: nothing to carry from one step to
the next, so resuming at step s draws exactly the batches the uninterrupted run drew, and under
DistributedDataParallel each rank takes its own slice of the same global batch.

Shapes: B batch, T target length, S source length.
"""

from __future__ import annotations

import csv
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..checkpoints.files import cache_root
from ..inputs import pad_batch
from ..text import text_lines
from .tokenizers import Tokenizer

IGNORE_INDEX = -100  # label value that cross-entropy skips (padding positions)
_LINES_PER_CHUNK = 8192  # lines tokenized per call: bounds memory while streaming a large file


def default_cache_dir() -> Path:
    """tokens/ in anatomy's cache folder (checkpoints.files.cache_root: $ANATOMY_CACHE, else
    $XDG_CACHE_HOME/anatomy, else ~/.cache/anatomy)."""
    return cache_root() / "tokens"


def _check_nonempty(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    if path.stat().st_size == 0:
        raise ValueError(f"{path} is empty: there is nothing to train on")
    return path


def _cache_key(paths: list[Path], tokenizer: Tokenizer, *extra: str) -> str:
    digest = hashlib.sha256(tokenizer.backend.to_str().encode())
    for p in paths:
        st = p.stat()
        digest.update(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    for e in extra:
        digest.update(e.encode())
    return digest.hexdigest()[:16]


def _dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def _write_atomically(path: Path, chunks, dtype: np.dtype) -> int:
    """Append each array of `chunks` to a temp file, then rename it to `path`; returns the count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    n = 0
    try:
        with open(tmp, "wb") as out:
            for chunk in chunks:
                arr = np.asarray(chunk, dtype=dtype)
                out.write(arr.tobytes())
                n += arr.size
            out.flush()
            os.fsync(out.fileno())
    except BaseException:  # a text that is not UTF-8, an interrupt: no half-written file left in the cache
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return n


def _line_chunks(path: Path):
    """The file's lines (newline kept), `_LINES_PER_CHUNK` at a time."""
    chunk = []
    for line in text_lines(path):
        chunk.append(line)
        if len(chunk) == _LINES_PER_CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# ---- language modelling ------------------------------------------------------------------------
def tokenize_to_memmap(path: str | os.PathLike, tokenizer: Tokenizer, cache_dir=None) -> np.memmap:
    """The whole file as one stream of ids, `np.memmap` over a cache file (written on first use).

    Lines are tokenized in chunks, so the text is never all in memory. A tokenizer that keeps
    newlines (char, bpe) sees them as tokens; one that drops them (word, wordpiece) gets <EOS>
    after each non-blank line instead. Raises ValueError if the file is empty or yields no tokens.
    """
    path = _check_nonempty(path)
    cache = Path(cache_dir or default_cache_dir())
    dtype = _dtype_for(tokenizer.vocab_size)
    bin_path = cache / f"{path.stem}-{_cache_key([path], tokenizer, 'lm')}.{dtype.name}.bin"
    if not bin_path.exists():

        def chunks():
            for lines in _line_chunks(path):
                if tokenizer.keeps_newlines:
                    encoded = tokenizer.encode_batch(lines)
                else:
                    encoded = tokenizer.encode_batch([l for l in lines if l.strip()], add_eos=True)
                yield [i for ids in encoded for i in ids]

        _write_atomically(bin_path, chunks(), dtype)
    if bin_path.stat().st_size == 0:
        raise ValueError(f"{path} holds no tokens (only whitespace?)")
    return np.memmap(bin_path, dtype=dtype, mode="r")


def split_tokens(ids: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """First (1 - val_fraction) of the stream for training, the rest for validation (nanoGPT's split)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_train = int(len(ids) * (1.0 - val_fraction))
    return ids[:n_train], ids[n_train:]


class LMBatches:
    """Random contiguous blocks from a token stream: x = ids[o : o+T], y = ids[o+1 : o+T+1].

    `batch(k)` (k counts micro-batches from the start of training) draws the global batch's
    B * world_size offsets from a generator seeded with (seed, k); this rank keeps its B of them.
    """

    def __init__(self, ids: np.ndarray, block_size: int, batch_size: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1):
        if len(ids) < block_size + 1:
            raise ValueError(f"the corpus has {len(ids)} tokens, fewer than block_size + 1 = "
                             f"{block_size + 1}: shorten the context or give more text")
        self.ids, self.block_size, self.batch_size = ids, block_size, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size

    def batch(self, k: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([self.seed, k])
        offsets = rng.integers(0, len(self.ids) - self.block_size, size=self.batch_size * self.world_size)
        offsets = offsets[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
        block = np.stack([np.asarray(self.ids[o:o + self.block_size + 1], dtype=np.int64) for o in offsets])
        block = torch.from_numpy(block)  # (B, T+1)
        return {"input_ids": block[:, :-1], "labels": block[:, 1:]}  # (B, T) each

    def eval_batches(self, n_batches: int):
        """`n_batches` fixed batches (the same every call), for a comparable validation loss."""
        for i in range(n_batches):
            yield self.batch(2**62 + i)  # far beyond any training k


# ---- variable-length examples (translation, classification) --------------------------------------
class TokenSequences:
    """Many id sequences stored flat: `ids` (memmap) plus `offsets`; item i = ids[off[i]:off[i+1]]."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self.ids, self.offsets = ids, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self.ids[self.offsets[i]:self.offsets[i + 1]], dtype=np.int64)

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @classmethod
    def build(cls, texts_in_chunks, tokenizer: Tokenizer, bin_path: Path) -> "TokenSequences":
        """Tokenize every text (given as chunks of strings) into `bin_path` (+ `.offsets.npy`), or
        reuse them if present."""
        off_path = bin_path.with_name(bin_path.name + ".offsets.npy")
        dtype = _dtype_for(tokenizer.vocab_size)
        if not (bin_path.exists() and off_path.exists()):
            lengths = []

            def chunks():
                for texts in texts_in_chunks:
                    encoded = tokenizer.encode_batch(texts)
                    lengths.extend(len(e) for e in encoded)
                    yield [i for ids in encoded for i in ids]

            _write_atomically(bin_path, chunks(), dtype)
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            tmp = off_path.with_name(off_path.name + f".tmp{os.getpid()}.npy")
            np.save(tmp, offsets)
            os.replace(tmp, off_path)
        offsets = np.load(off_path)
        ids = np.memmap(bin_path, dtype=dtype, mode="r") if offsets[-1] > 0 else np.zeros(0, dtype)
        return cls(ids, offsets)


def count_lines(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(1 for _ in handle)


def parallel_text(src_path, tgt_path, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer,
                  cache_dir=None) -> tuple[TokenSequences, TokenSequences]:
    """Two line-aligned files -> (source sequences, target sequences); line i translates line i.

    Raises ValueError if either file is empty or their line counts differ (naming both)."""
    src_path, tgt_path = _check_nonempty(src_path), _check_nonempty(tgt_path)
    n_src, n_tgt = count_lines(src_path), count_lines(tgt_path)
    if n_src != n_tgt:
        raise ValueError(f"parallel files must have the same number of lines: {src_path} has {n_src}, "
                         f"{tgt_path} has {n_tgt}")
    cache = Path(cache_dir or default_cache_dir())
    out = []
    for path, tok in ((src_path, src_tokenizer), (tgt_path, tgt_tokenizer)):
        key = _cache_key([path], tok, "lines")
        chunks = ([line.strip() for line in lines] for lines in _line_chunks(path))
        out.append(TokenSequences.build(chunks, tok, cache / f"{path.stem}{path.suffix}-{key}.bin"))
    return out[0], out[1]


@dataclass(frozen=True)
class TSVRows:
    texts: list[str]
    labels: np.ndarray  # (N,) int64 class index into `label_names`
    label_names: list[str]


def read_tsv(path, label_names: list[str] | None = None, header: bool | None = None,
             text_column: int = 0, label_column: int = -1) -> TSVRows:
    """A TSV of (text, label) rows -> texts and integer labels. No quoting: a tab separates fields.

    `label_names`: the allowed labels, in class-index order; None learns them from this file
    (sorted). `header`: None = auto, the first row is a header if its label is not a label of the
    other rows. Raises ValueError for an empty file, a row with too few fields, or a label outside
    `label_names` (naming the file, line and allowed labels).
    """
    path = _check_nonempty(path)
    rows = [(n, r) for n, r in enumerate(csv.reader(text_lines(path, newline=""), delimiter="\t",
                                                    quoting=csv.QUOTE_NONE), 1)
            if r and any(f.strip() for f in r)]
    if not rows:
        raise ValueError(f"{path} is empty: there is nothing to train on")
    for n, r in rows:
        if len(r) < 2:
            raise ValueError(f"{path}:{n}: expected text<TAB>label, found {len(r)} field(s): {r!r}")
    if header is None:
        others = {r[label_column].strip() for _, r in rows[1:1001]}
        known = set(label_names) if label_names is not None else others
        header = rows[0][1][label_column].strip() not in known
    if header:
        rows = rows[1:]
    if not rows:
        raise ValueError(f"{path} has a header but no rows")
    if label_names is None:
        label_names = sorted({r[label_column].strip() for _, r in rows})
    index = {name: i for i, name in enumerate(label_names)}
    texts, labels = [], []
    for n, r in rows:
        label = r[label_column].strip()
        if label not in index:
            raise ValueError(f"{path}:{n}: unknown label {label!r}; allowed labels are "
                             f"{', '.join(repr(l) for l in label_names)}")
        texts.append(r[text_column].strip())
        labels.append(index[label])
    return TSVRows(texts, np.asarray(labels, dtype=np.int64), list(label_names))


def classification_data(path, tokenizer: Tokenizer, label_names=None, header=None,
                        cache_dir=None) -> tuple[TokenSequences, np.ndarray, list[str]]:
    """`read_tsv`, then the texts tokenized into `TokenSequences`: (sequences, labels, label_names)."""
    rows = read_tsv(path, label_names=label_names, header=header)
    path = Path(path)
    cache = Path(cache_dir or default_cache_dir())
    key = _cache_key([path], tokenizer, "tsv", repr(header), ",".join(rows.label_names))
    chunks = (rows.texts[i:i + _LINES_PER_CHUNK] for i in range(0, len(rows.texts), _LINES_PER_CHUNK))
    seqs = TokenSequences.build(chunks, tokenizer, cache / f"{path.stem}-{key}.bin")
    return seqs, rows.labels, rows.label_names


class EpochBatches:
    """Batches of example indices: each epoch a fresh permutation of seed (seed, epoch).

    With `bucket` > 1, the permutation is cut into pools of `bucket` global batches, each pool is
    sorted by length and cut into batches, and the batches are shuffled: similar lengths share a
    batch, so less of it is padding. Global batch k is `batch_size * world_size` examples, and
    rank r takes slice r of it. The last incomplete global batch of an epoch is dropped.
    """

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1, bucket: int = 1):
        self.lengths = np.asarray(lengths)
        self.global_batch = batch_size * world_size
        if len(self.lengths) < self.global_batch:
            raise ValueError(f"{len(self.lengths)} examples are fewer than one global batch "
                             f"({batch_size} x {world_size} ranks)")
        self.batch_size, self.seed, self.rank, self.bucket = batch_size, seed, rank, bucket
        self.per_epoch = len(self.lengths) // self.global_batch
        self._epoch, self._order = None, None

    def _epoch_order(self, epoch: int) -> np.ndarray:
        """(per_epoch, global_batch) indices for `epoch`; cached for the current epoch."""
        if self._epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            perm = rng.permutation(len(self.lengths))[: self.per_epoch * self.global_batch]
            if self.bucket > 1:
                pool = self.bucket * self.global_batch
                perm = np.concatenate([p[np.argsort(self.lengths[p], kind="stable")]
                                       for p in np.split(perm, range(pool, len(perm), pool))])
                order = perm.reshape(self.per_epoch, self.global_batch)
                order = order[rng.permutation(self.per_epoch)]
            else:
                order = perm.reshape(self.per_epoch, self.global_batch)
            self._epoch, self._order = epoch, order
        return self._order

    def indices(self, k: int) -> np.ndarray:
        """This rank's example indices for the k-th batch of training (k counts micro-batches)."""
        epoch, j = divmod(k, self.per_epoch)
        row = self._epoch_order(epoch)[j]
        return row[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]


def seq2seq_batch(src: list[np.ndarray], tgt: list[np.ndarray], pad_id: int, bos_id: int, eos_id: int,
                  max_src_len: int, max_tgt_len: int) -> dict[str, torch.Tensor]:
    """Teacher forcing: the decoder reads <SOS> y1..yn and must predict y1..yn <EOS>.

    Returns src_ids (B, S), src_padding_mask (B, S), tgt_ids (B, T), tgt_padding_mask (B, T) and
    labels (B, T) with IGNORE_INDEX at padding. Sources and targets are cut to fit the model."""
    src = [s[:max_src_len] for s in src]
    tgt = [t[:max_tgt_len - 1] for t in tgt]
    src_ids, src_mask = pad_batch(src, pad_id)
    tgt_in, tgt_mask = pad_batch([np.concatenate([[bos_id], t]) for t in tgt], pad_id)
    labels, label_mask = pad_batch([np.concatenate([t, [eos_id]]) for t in tgt], pad_id)
    labels[~label_mask] = IGNORE_INDEX
    return {"src_ids": src_ids, "src_padding_mask": src_mask, "tgt_ids": tgt_in,
            "tgt_padding_mask": tgt_mask, "labels": labels}


def drop_tokens(seqs: list[np.ndarray], p: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Word dropout (Iyyer et al., 2015, "Deep Unordered Composition Rivals Syntactic Methods"):
    each token of each text is deleted with probability `p`, independently, and a text that would
    lose every token keeps its first:

        keep_t ~ Bernoulli(1 - p),   x' = (x_t : keep_t)

    A training phrase then never comes back twice the same, so the model cannot learn it by heart
    from one token sequence; at evaluation every token is read."""
    kept = []
    for s in seqs:
        keep = rng.random(len(s)) >= p
        kept.append(s[keep] if keep.any() else s[:1])
    return kept


def classify_batch(seqs: list[np.ndarray], labels: np.ndarray, pad_id: int, bos_id: int, eos_id: int,
                   max_len: int) -> dict[str, torch.Tensor]:
    """<SOS>/[CLS] text <EOS>/[SEP], cut to `max_len`: input_ids (B, T), padding_mask (B, T), labels (B,)."""
    wrapped = [np.concatenate([[bos_id], s[:max_len - 2], [eos_id]]) for s in seqs]
    ids, mask = pad_batch(wrapped, pad_id)
    return {"input_ids": ids, "padding_mask": mask, "labels": torch.as_tensor(labels, dtype=torch.long)}
