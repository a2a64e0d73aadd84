"""Reading the files of a Hugging Face-format checkpoint directory (writing them: writing.py).

    config.json                         the architecture (model_type, sizes, flags)
    model.safetensors                   the weights, or
    pytorch_model.bin                   the weights, pickled (read with weights_only=True), or
    model.safetensors.index.json        a weight_map {tensor name: shard file}, for sharded weights
    pytorch_model.bin.index.json

A `Weights` object opens a checkpoint lazily: names and shapes are read from the headers, so that
every problem can be reported before a single tensor is loaded. Every failure is a CheckpointError.
"""

from __future__ import annotations

import json
import math
import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class CheckpointError(ValueError):
    """A checkpoint cannot be read or does not fit the model it describes."""


def shorten(text: str, limit: int = 120) -> str:
    """`text` cut to `limit` characters (a name inside a message: a tensor name may be megabytes)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def listing(items, limit: int = 5) -> str:
    """The first `limit` items, each shortened, then how many more: a message stays a few hundred
    characters whatever a file holds."""
    items = list(items)
    shown = ", ".join(shorten(str(item)) for item in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def read_json(path: Path, what: str, kind: type = dict):
    """The JSON file at `path`, which must hold a `kind` (an object by default).

    Raises CheckpointError naming the file when it is missing, not JSON, nested too deeply to read,
    or of another type. A byte-order mark, which Windows editors write, is skipped."""
    if not path.is_file():
        raise CheckpointError(f"{what} {str(path)!r} is missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{what} {str(path)!r} is not valid JSON: {error}") from None
    except RecursionError:
        raise CheckpointError(f"{what} {str(path)!r} is nested too deeply to be a real configuration") from None
    if not isinstance(data, kind):
        names = {dict: "an object", list: "a list"}
        raise CheckpointError(f"{what} {str(path)!r} must hold {names.get(kind, kind.__name__)}, got {type(data).__name__}")
    return data


def check_finite(data, what: str) -> None:
    """Raise CheckpointError naming the first NaN or Infinity anywhere in a config (JSON has no
    such values; Python's json reads and writes them), by its path: "rope_parameters.factor"."""
    pending = [("", data)]
    while pending:  # a loop, not recursion: read_json has bounded the depth, not this
        path, value = pending.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:  # a path is spelled only for containers and for the culprit
            if isinstance(item, float) and not math.isfinite(item) or isinstance(item, (dict, list)):
                where = f"{path}[{key}]" if isinstance(value, list) else f"{path}.{key}" if path else str(key)
                if isinstance(item, float):
                    raise CheckpointError(f"{what} gives {shorten(where, 80)} = {item}; every number in a config "
                                          "must be finite")
                pending.append((where, item))


# safetensors' dtype names -> torch dtypes (the header says which; no tensor is read to know it)
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}


# The longest header safetensors itself accepts.
MAX_HEADER_BYTES = 100_000_000
# The most tensors one weights file may name. The largest checkpoints keep a few thousand per shard
# (DeepSeek-V3's 163 shards hold about 95,000 tensors, 600 each); a header naming more (200,000
# empty tensors, 16 MB of JSON) is refused by counting its entries, before it is parsed or walked.
MAX_FILE_TENSORS = 65_536


def read_safetensors_header(path: Path) -> dict[str, tuple[torch.dtype | None, tuple[int, ...]]]:
    """name -> (dtype, shape) of every tensor of a .safetensors file, from its header alone.

    The format: 8 bytes, the header's length n (little-endian); n bytes of JSON, each tensor's
    {"dtype", "shape", "data_offsets": [begin, end]} with begin and end counted from the header's
    end. Nothing else is read or mapped, so that sizes can be checked against the memory available
    before the data is touched. Every offset is checked in exact integers: end - begin must be the
    shape's bytes, and end within the file. A dtype anatomy does not know maps to None.
    Raises CheckpointError naming the file (and the tensor) when the header is malformed."""
    where = f"weights file {shorten(str(path))!r}"
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            prefix = file.read(8)
            length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
                raise CheckpointError(f"{where} is corrupt or truncated: it does not start with the length of a "
                                      f"safetensors header (of at most {MAX_HEADER_BYTES} bytes, within the file)")
            raw = file.read(length)
            entries = raw.count(b'"data_offsets"')  # each entry's key, once: a name's own quotes are escaped
            if entries > MAX_FILE_TENSORS:
                raise CheckpointError(f"{where} names {entries:,} tensors; anatomy reads at most {MAX_FILE_TENSORS:,} "
                                      "per file (real checkpoints hold a few thousand per shard)")
            header = json.loads(raw, object_pairs_hook=_once_each)
    except OSError as error:
        raise CheckpointError(f"{where} cannot be read: {shorten(str(error))}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise CheckpointError(f"{where} is corrupt or truncated: its header is not JSON") from None
    except _Twice as twice:  # json keeps the last, a reader may keep the first: two views of one file
        raise CheckpointError(f"{where} is corrupt: its header names {shorten(repr(twice.args[0]))} twice") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{where} is corrupt: its header is not a JSON object")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{where} is corrupt: its __metadata__ must map names to strings (the format's rule)")
    data_bytes = size - 8 - length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        problem = _entry_problem(entry, data_bytes)
        if problem:
            raise CheckpointError(f"{where} is corrupt or truncated: tensor {shorten(name)!r} {problem}")
        tensors[name] = (SAFETENSORS_DTYPES.get(entry["dtype"]), tuple(entry["shape"]))
    return dict(sorted(tensors.items()))  # in safetensors' own order, by name


class _Twice(ValueError):
    """A JSON object naming one key twice."""


def _once_each(pairs: list[tuple[str, object]]) -> dict:
    """json's object_pairs_hook: the object, or _Twice naming a key it gives twice."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen = set()
        raise _Twice(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return found


def _entry_problem(entry, data_bytes: int) -> str | None:
    """Why a header entry is malformed (None when it is not): types, then offsets in exact integers."""
    if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
        return "has no dtype"
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        return "has a shape that is not a list of sizes"
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(n) is int for n in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        return "has data_offsets that are not [begin, end]"
    if offsets[1] > data_bytes:
        return f"needs bytes up to {offsets[1]} of the data, the file holds {data_bytes}"
    dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
    if dtype is not None and offsets[1] - offsets[0] != math.prod(shape) * dtype.itemsize:
        return f"has {offsets[1] - offsets[0]} bytes for a {entry['dtype']} tensor of shape {shape}"
    return None


class _SafetensorsShard:
    """One .safetensors file: names, dtypes and shapes from its header at once; the file is
    memory-mapped when a first tensor is asked for, after every check has passed.

    safetensors stores no checksum: a flipped byte inside a tensor's data loads silently (only NaN
    or Inf values are caught, by the engine). Compare the file's sha256 with the publisher's if it
    matters; the Hugging Face Hub cache names each file by its hash."""

    def __init__(self, path: Path):
        self.path = path
        header = read_safetensors_header(path)
        self._keys = list(header)
        self._dtypes = {key: dtype for key, (dtype, _) in header.items()}
        self._shapes = {key: shape for key, (_, shape) in header.items()}
        self._file = None
        unknown = sorted(k for k, d in self._dtypes.items() if d is None)
        if unknown:
            raise CheckpointError(f"weights file {shorten(str(path))!r} holds tensors of a dtype anatomy does not "
                                  f"read: {listing(unknown)}")

    def keys(self) -> list[str]:
        return self._keys

    def shape(self, key: str) -> tuple[int, ...]:
        return self._shapes[key]

    def dtype(self, key: str) -> torch.dtype:
        return self._dtypes[key]

    def get(self, key: str) -> torch.Tensor:
        where = shorten(str(self.path))
        if self._file is None:
            try:
                self._file = safe_open(str(self.path), framework="pt")
            except (SafetensorError, OSError, ValueError) as error:
                raise CheckpointError(f"weights file {where!r} is corrupt or truncated: {shorten(str(error))}"
                                      ) from None
            except MemoryError:
                raise CheckpointError(f"weights file {where!r} cannot be memory-mapped: this process has not the "
                                      "address space for it") from None
        try:
            return self._file.get_tensor(key)
        except Exception as error:  # safetensors reports truncated data only when a tensor is read
            raise CheckpointError(f"tensor {shorten(key)!r} of {where!r} cannot be read: {shorten(str(error))}"
                                  ) from None


class _PickleShard:
    """One pytorch_model.bin, read with weights_only=True (tensors and plain containers only, never
    arbitrary objects) and memory-mapped where the file's format allows."""

    def __init__(self, path: Path):
        self.path = path
        try:
            state = _torch_load(path)
        except pickle.UnpicklingError as error:
            raise CheckpointError(
                f"weights file {str(path)!r} holds something other than tensors, or is corrupt; "
                f"anatomy never unpickles arbitrary objects ({str(error).splitlines()[0][:200]})"
            ) from None
        except Exception as error:  # torch.load raises many types for bytes that are not a checkpoint
            raise CheckpointError(f"weights file {str(path)!r} is corrupt or truncated, or not a PyTorch weights file: "
                                  f"{type(error).__name__}: {str(error)[:200]}") from None
        if not isinstance(state, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()):
            raise CheckpointError(f"weights file {str(path)!r} must hold a dict of tensors (a state dict)")
        self._state = state

    def keys(self) -> list[str]:
        return list(self._state)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._state[key].shape)

    def dtype(self, key: str) -> torch.dtype:
        return self._state[key].dtype

    def get(self, key: str) -> torch.Tensor:
        return self._state[key]


def _torch_load(path: Path):
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as error:
        if "mmap" not in str(error):  # the legacy (pre-zip) format cannot be memory-mapped
            raise
        return torch.load(str(path), map_location="cpu", weights_only=True)


def _is_shard_name(value) -> bool:
    """A weight file's name as an index may give it: a string ending in .safetensors or .bin, with
    no control character (a NUL byte cannot be in a path) and no longer than a file name may be."""
    return (isinstance(value, str) and value.endswith((".safetensors", ".bin")) and len(value) <= 4096
            and value.isprintable())


def _open_shard(path: Path, real_root: Path, what: str = "weights file"):
    """The shard at `path`, after checking that it stays inside `real_root` (resolved) and exists:
    its path is resolved once (`inside`)."""
    real = inside(path, real_root, what, resolved=True)
    try:
        found = real.is_file()
    except OSError as error:  # a name too long for the file system
        raise CheckpointError(f"weights file {shorten(str(path))!r} cannot be opened: {error.strerror}") from None
    if not found:
        raise CheckpointError(f"weights file {shorten(str(path))!r} " + ("is not a file" if real.exists() else "is missing"))
    return _SafetensorsShard(path) if path.suffix == ".safetensors" else _PickleShard(path)


def inside(path: Path, root: Path, what: str, *, resolved: bool = False) -> Path:
    """`path` with symlinks resolved; CheckpointError unless it stays inside `root` (also resolved,
    unless `resolved` says it is already: an index of many shards resolves its folder once)."""
    real = path.resolve()
    real_root = root if resolved else root.resolve()
    if not real.is_relative_to(real_root):
        raise CheckpointError(f"{what} {shorten(str(path))!r} leads outside the checkpoint folder {shorten(str(root))!r} "
                              f"(to {shorten(str(real))!r}); anatomy reads weights only from inside it")
    return real


class Weights:
    """The tensors of a checkpoint, by name, over one file or several shards.

    Every file opened must resolve (symlinks followed) inside `root` (default: the folder itself;
    a Hub snapshot passes its repository's cache folder, where the snapshot's links point)."""

    def __init__(self, directory: Path, root: Path | None = None):
        root = root or directory
        self._where: dict[str, object] = {}
        for name in WEIGHT_FILES:
            if (directory / name).is_file():
                shard = _open_shard(directory / name, root.resolve())
                self._where = {key: shard for key in shard.keys()}
                self.source = str(directory / name)
                return
        for name in INDEX_FILES:
            if (directory / name).is_file():
                self._where = self._read_index(directory, directory / name, root)
                self.source = str(directory / name)
                return
        raise CheckpointError(
            f"no weights in {str(directory)!r}: expected one of {', '.join(WEIGHT_FILES + INDEX_FILES)}"
        )

    @staticmethod
    def _read_index(directory: Path, path: Path, root: Path) -> dict[str, object]:
        weight_map = read_json(path, "shard index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"shard index {str(path)!r} has no 'weight_map' object")
        if not weight_map:
            raise CheckpointError(f"shard index {str(path)!r} maps no tensors: its 'weight_map' is empty")
        wrong = [f"{k!r}: {v!r}" for k, v in weight_map.items() if not _is_shard_name(v)]
        if wrong:
            raise CheckpointError(f"shard index {shorten(str(path))!r} maps tensors to things that are not weight file "
                                  f"names: {listing(wrong)}")
        real_root = root.resolve()
        # each shard resolved once and opened at once: the first missing one (of 50,000) is refused first
        shards = {file: _open_shard(directory / file, real_root, f"shard {shorten(file)!r} of {shorten(str(path))!r}:")
                  for file in sorted(set(weight_map.values()))}
        problems = [f"{key} (listed in {file})" for key, file in weight_map.items() if key not in shards[file].keys()]
        if problems:
            raise CheckpointError(f"shard index {path.name} lists tensors its shards lack: {listing(problems)}")
        return {key: shards[file] for key, file in weight_map.items()}

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def shape(self, key: str) -> tuple[int, ...]:
        return self._where[key].shape(key)

    def dtype(self, key: str) -> torch.dtype:
        return self._where[key].dtype(key)

    def get(self, key: str) -> torch.Tensor:
        return self._where[key].get(key)


def cache_root() -> Path:
    """Where anatomy keeps what it can compute again (GGUF files dequantized, texts tokenized, the
    benchmark's SAELens environment): $ANATOMY_CACHE, else $XDG_CACHE_HOME/anatomy, else
    ~/.cache/anatomy."""
    if os.environ.get("ANATOMY_CACHE"):
        return Path(os.environ["ANATOMY_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "anatomy"
