"""A GGUF file dequantized once, then memory-mapped: the cache that makes a second start fast.

Reading a GGUF file means parsing its metadata (SmolLM2's tokenizer alone is 49,152 strings and
48,900 merges) and dequantizing every tensor: 4–9 s for SmolLM2-135M on this project's CPU. The
first load writes what it built, in anatomy's own format (anatomy_config.json, model.safetensors
in float32, the tokenizer's files), into

    <cache>/gguf/<sha256 of the file>/        <cache>: $ANATOMY_CACHE, else $XDG_CACHE_HOME/anatomy,
                                                       else ~/.cache/anatomy

and every later load of the same bytes reads that folder instead, memory-mapped (SmolLM2: 0.3 s).
The key is the file's hash, so an edited or replaced file is read afresh. Files under MIN_BYTES
are not cached (they load fast anyway); ANATOMY_GGUF_CACHE=0 turns the cache off. The folder is
written beside its final place and renamed into it (save_pretrained's staging), so a cache entry
is whole or absent; two processes writing the same entry keep one.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .files import cache_root

MIN_BYTES = 16 * 2**20
COMPLETE = "anatomy_config.json"  # written by save_pretrained(format="anatomy"); its presence = whole


def enabled(path: Path) -> bool:
    """Whether loads of this file go through the cache (on, and the file is large enough)."""
    if os.environ.get("ANATOMY_GGUF_CACHE", "1") in ("0", "false", "no"):
        return False
    try:
        return path.stat().st_size >= MIN_BYTES
    except OSError:
        return False


def entry(path: Path) -> Path:
    """The cache folder of this file's bytes (it may not exist yet)."""
    with open(path, "rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest()
    return cache_root() / "gguf" / digest


def lookup(path: Path) -> Path | None:
    """The cache folder holding this file's model, or None (off, too small, or not written yet)."""
    if not enabled(path):
        return None
    folder = entry(path)
    return folder if (folder / COMPLETE).is_file() else None


def store(path: Path, model) -> Path | None:
    """Write the model loaded from `path` (with its tokenizer) into the cache; None when off. A
    failure to write (a full or read-only disk) costs the next start its speed, nothing else."""
    if not enabled(path):
        return None
    from .save import save_pretrained

    folder = entry(path)
    if (folder / COMPLETE).is_file():
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        save_pretrained(model, folder, format="anatomy")
    except OSError:
        return None
    return folder


__all__ = ["enabled", "entry", "lookup", "store"]
