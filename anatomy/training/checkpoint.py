"""Checkpoints that survive a kill at any instant.

A checkpoint is a directory `checkpoints/step-00001200/` holding

    model.safetensors   the weights (safetensors: tensors only, nothing executes on load)
    optimizer.pt        optimizer, LR scheduler and grad-scaler state, torch RNG states;
                        loaded with torch.load(weights_only=True): tensors and plain containers only
    state.json          the step, python and numpy RNG states, the data sampler position
    manifest.json       size and sha256 of the three files above, written last

How a save stays atomic: everything is written into a hidden temp directory beside the final
one, each file fsync'd, then the directory is renamed into place (`os.replace`, atomic on POSIX)
and the parent fsync'd. Only then is the `latest` pointer (a one-line text file) rewritten, by the
same write-temp-fsync-replace dance. A kill before the rename leaves only a temp directory, which
is never read; a kill before the pointer moves leaves it on the previous good checkpoint.

How a load stays safe: `find_checkpoint` follows `latest`, checks the manifest (every file
present, sizes and hashes match); if that fails (a disk that lied, a file truncated by hand) it
warns and falls back to the newest checkpoint that does verify, and raises CheckpointError,
listing what was wrong with each, when none does.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from ..checkpoints.files import CheckpointError

LATEST = "latest"
FILES = ("model.safetensors", "optimizer.pt", "state.json")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def write_text_atomically(path: Path, text: str) -> None:
    """Write `text` to a temp file in the same directory, fsync, rename over `path`."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---- RNG states as JSON (no pickles) ------------------------------------------------------------
def rng_state_json() -> dict:
    version, state, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(state), gauss],
            "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


def restore_rng_json(states: dict) -> None:
    version, state, gauss = states["python"]
    random.setstate((version, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


# ---- save ---------------------------------------------------------------------------------------
def save_checkpoint(run_dir: str | os.PathLike, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler, scaler=None, state: dict | None = None,
                    keep: int = 2) -> Path:
    """Write checkpoint `step` atomically, move `latest` to it, and delete all but the newest `keep`.

    `state` (JSON-serialisable: the sampler position, metrics) is stored in state.json beside the
    step and the RNG states. Returns the checkpoint directory."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}"
    final = root / name
    tmp = root / f".{name}.tmp{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()

    save_model(model, str(tmp / "model.safetensors"))  # handles tied (shared) weights
    blob = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state()}
    if scaler is not None and scaler.is_enabled():
        blob["scaler"] = scaler.state_dict()
    if torch.cuda.is_available():
        blob["cuda_rng"] = torch.cuda.get_rng_state_all()
    torch.save(blob, tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "rng": rng_state_json(), **(state or {})}))
    for f in FILES:
        _fsync_file(tmp / f)
    manifest = {f: {"bytes": (tmp / f).stat().st_size, "sha256": _sha256(tmp / f)} for f in FILES}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    _fsync_file(tmp / "manifest.json")
    _fsync_dir(tmp)

    if final.exists():  # re-saving the same step (a resumed run): move the old one aside first
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    write_text_atomically(root / LATEST, name + "\n")  # the pointer moves last

    for old in sorted(root.glob("step-*"))[:-keep] if keep > 0 else []:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


# ---- find and load ------------------------------------------------------------------------------
def verify_checkpoint(path: Path) -> str | None:
    """None if `path` is a complete checkpoint, else the reason it is not."""
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        return "no manifest.json (the save did not finish)"
    try:
        manifest = json.loads(manifest_path.read_text())
    except ValueError:
        return "manifest.json is not valid JSON"
    for f in FILES:
        entry = manifest.get(f)
        p = path / f
        if entry is None or not p.is_file():
            return f"{f} is missing"
        if p.stat().st_size != entry["bytes"]:
            return f"{f} has {p.stat().st_size} bytes, the manifest says {entry['bytes']}"
        if _sha256(p) != entry["sha256"]:
            return f"{f} does not match its sha256 in the manifest"
    return None


def find_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint to resume from: `latest` if it verifies, else the newest one that does.

    None when the run has no checkpoint yet; CheckpointError when it has some but none verifies."""
    root = Path(run_dir) / "checkpoints"
    candidates = sorted(root.glob("step-*"), reverse=True) if root.is_dir() else []
    pointer = root / LATEST
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        candidates = [named] + [c for c in candidates if c != named]
    if not candidates:
        return None
    problems = []
    for i, path in enumerate(candidates):
        reason = verify_checkpoint(path) if path.is_dir() else "does not exist"
        if reason is None:
            if i > 0:
                warnings.warn(f"skipped damaged checkpoints ({'; '.join(problems)}); resuming from {path.name}")
            return path
        problems.append(f"{path.name}: {reason}")
    raise CheckpointError(f"no loadable checkpoint in {root}: " + "; ".join(problems))


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer=None, scheduler=None, scaler=None) -> dict:
    """Restore weights (and, when given, optimizer, scheduler, scaler) and all RNG states from a
    verified checkpoint; returns state.json (with "step"). Raises CheckpointError if it does not verify."""
    reason = verify_checkpoint(path)
    if reason is not None:
        raise CheckpointError(f"{path}: {reason}")
    missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=True)
    blob = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    if optimizer is not None:
        optimizer.load_state_dict(blob["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(blob["scheduler"])
    if scaler is not None and "scaler" in blob:
        scaler.load_state_dict(blob["scaler"])
    torch.set_rng_state(blob["torch_rng"])
    if "cuda_rng" in blob and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(blob["cuda_rng"])
    state = json.loads((path / "state.json").read_text())
    restore_rng_json(state["rng"])
    return state


# ---- the trained model, for use after training ------------------------------------------------

def save_trained(model: torch.nn.Module, tokenizer, directory: str | os.PathLike) -> Path:
    """Write the trained model and its tokenizer to `directory`.

    `anatomy.save_pretrained` writes Hugging Face format (loadable by transformers too) when a
    supported architecture expresses the config, and anatomy's own format otherwise;
    `anatomy.from_pretrained` and `load_trained` read either."""
    from anatomy.checkpoints import save_pretrained

    out = save_pretrained(model, directory)
    tokenizer.save(out)
    return out


def load_trained(directory: str | os.PathLike):
    """(model in eval mode, Tokenizer) from a directory written by `save_trained`."""
    import anatomy

    from .tokenizers import Tokenizer

    return anatomy.from_pretrained(directory), Tokenizer.load(directory)
