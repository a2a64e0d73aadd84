"""Checkpoints that survive a kill at any instant, a full disk, and damaged or hostile files.

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
is never read and is removed when the next run takes the run folder (`remove_temporaries`); a
kill before the pointer moves leaves it on the previous good checkpoint. A save that fails (a full
disk) removes its temp directory and says so; the previous checkpoint stays in charge.

How a load stays safe: `load_newest` tries `latest`, then the other checkpoints, newest first.
One is used only if its manifest verifies (every file present, sizes and hashes match) *and*
every file reads back as what it should be: a pickle planted in optimizer.pt (with a manifest
to match) is refused by weights_only=True, a state.json whose step is not a number is refused.
Each one skipped is named in a warning; when none loads, CheckpointError lists what was wrong
with each.
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

from ..checkpoints import from_pretrained, save_pretrained
from ..checkpoints.files import CheckpointError
from .tokenizers import Tokenizer

LATEST = "latest"
FILES = ("model.safetensors", "optimizer.pt", "state.json")
FILE_MODE = 0o644  # readable by everyone, like any file a program writes under the usual umask


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def make_readable(path: Path) -> None:
    """Mode 0644 for a file, or for every file under a folder (some writers create files 0600)."""
    path = Path(path)
    for f in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
        os.chmod(f, FILE_MODE)


def write_text_atomically(path: Path, text: str) -> None:
    """Write `text` to a temp file in the same directory, fsync, rename over `path`."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    make_readable(tmp)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def remove_temporaries(run_dir: str | os.PathLike) -> list[Path]:
    """Delete what killed writers left behind: `checkpoints/.step-*.tmpPID` folders and `.NAME.tmpPID`
    files. Only safe while holding the run folder's lock (rundir.RunLock): no writer is alive."""
    run_dir = Path(run_dir)
    found = sorted(run_dir.glob(".*.tmp*")) + sorted((run_dir / "checkpoints").glob(".step-*.tmp*"))
    for path in found:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return found


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
    step and the RNG states. Returns the checkpoint directory. Raises CheckpointError, saying why
    and how much disk is free, when the files cannot be written (the previous checkpoint is kept)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}"
    final = root / name
    tmp = root / f".{name}.tmp{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir()
        _write_files(tmp, step, model, optimizer, scheduler, scaler, state)
    except (OSError, RuntimeError) as error:  # torch.save reports a full disk as a RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(root).free / 2**20
        kept = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else "none yet"
        reason = " ".join(str(error).split()) or type(error).__name__
        raise CheckpointError(f"could not save checkpoint {name} in {root} ({reason}); {free:.0f} MB free "
                              f"on that disk; the previous checkpoint ({kept}) is kept") from error

    if final.exists():  # re-saving the same step (a resumed run): move the old one aside first
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    write_text_atomically(root / LATEST, name + "\n")  # the pointer moves last

    for old in sorted(root.glob("step-*"))[:-keep] if keep > 0 else []:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _write_files(tmp: Path, step: int, model, optimizer, scheduler, scaler, state: dict | None) -> None:
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
    make_readable(tmp)
    _fsync_dir(tmp)


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
    if not isinstance(manifest, dict):
        return "manifest.json is not a JSON object"
    for f in FILES:
        entry = manifest.get(f)
        p = path / f
        if not isinstance(entry, dict) or not p.is_file():
            return f"{f} is missing"
        if p.stat().st_size != entry.get("bytes"):
            return f"{f} has {p.stat().st_size} bytes, the manifest says {entry.get('bytes')}"
        if _sha256(p) != entry.get("sha256"):
            return f"{f} does not match its sha256 in the manifest"
    return None


def checkpoint_candidates(run_dir: str | os.PathLike) -> list[Path]:
    """The run's checkpoints in the order to try them: `latest` first, then newest first."""
    root = Path(run_dir) / "checkpoints"
    candidates = sorted(root.glob("step-*"), reverse=True) if root.is_dir() else []
    pointer = root / LATEST
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        candidates = [named] + [c for c in candidates if c != named]
    return candidates


def find_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest checkpoint whose manifest verifies; None when the run has none yet.
    Raises CheckpointError when it has some but none verifies."""
    problems = []
    for path in checkpoint_candidates(run_dir):
        reason = verify_checkpoint(path) if path.is_dir() else "does not exist"
        if reason is None:
            if problems:
                warnings.warn(f"skipped damaged checkpoints ({'; '.join(problems)}); using {path.name}")
            return path
        problems.append(f"{path.name}: {reason}")
    if problems:
        raise CheckpointError(f"no loadable checkpoint in {Path(run_dir) / 'checkpoints'}: " + "; ".join(problems))
    return None


def _check_state(state) -> None:
    """state.json must hold a step (an integer >= 0) and both RNG states, or nothing is restored."""
    if not isinstance(state, dict):
        raise CheckpointError("state.json is not a JSON object")
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"state.json has step {step!r}, not an integer >= 0")
    rng = state.get("rng")
    if not isinstance(rng, dict) or not isinstance(rng.get("python"), list) or not isinstance(rng.get("numpy"), list):
        raise CheckpointError("state.json lacks the python and numpy RNG states")


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer=None, scheduler=None, scaler=None) -> dict:
    """Restore weights (and, when given, optimizer, scheduler, scaler) and all RNG states from one
    checkpoint; returns state.json (with "step"). Raises CheckpointError naming what is wrong.

    Every file is read and checked before anything is restored, except the weights' shapes, which
    load_model checks as it loads (a caller trying the next checkpoint overwrites them again)."""
    reason = verify_checkpoint(path)
    if reason is not None:
        raise CheckpointError(f"{path}: {reason}")
    # A damaged or hostile file fails inside json, torch's restricted unpickler, safetensors or an
    # optimizer's load_state_dict, each with its own exception type: all mean "not this checkpoint".
    try:
        state = json.loads((path / "state.json").read_text())
        _check_state(state)
        blob = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
        if not isinstance(blob, dict) or not {"optimizer", "scheduler", "torch_rng"} <= blob.keys():
            raise CheckpointError("optimizer.pt lacks the optimizer, scheduler or RNG state")
        load_model(model, str(path / "model.safetensors"), strict=True)
        if optimizer is not None:
            optimizer.load_state_dict(blob["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(blob["scheduler"])
        if scaler is not None and "scaler" in blob:
            scaler.load_state_dict(blob["scaler"])
        torch.set_rng_state(blob["torch_rng"])
        if "cuda_rng" in blob and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(blob["cuda_rng"])
        restore_rng_json(state["rng"])
    except Exception as error:  # noqa: BLE001 - see above; KeyboardInterrupt still goes through
        if isinstance(error, CheckpointError):
            raise CheckpointError(f"{path.name}: {error}") from None
        raise CheckpointError(f"{path.name}: {type(error).__name__}: {' '.join(str(error).split())[:200]}") from None
    return state


def load_newest(run_dir: str | os.PathLike, model, optimizer=None, scheduler=None, scaler=None) -> tuple[Path, dict] | None:
    """Restore the newest checkpoint that loads (see load_checkpoint), warning about each one skipped.

    Returns (its path, its state.json), None when the run has no checkpoint yet, and raises
    CheckpointError listing each checkpoint and what is wrong with it when none loads."""
    problems = []
    for path in checkpoint_candidates(run_dir):
        try:
            state = load_checkpoint(path, model, optimizer, scheduler, scaler)
        except CheckpointError as error:
            problems.append(str(error))
            continue
        if problems:
            warnings.warn(f"skipped damaged checkpoints ({'; '.join(problems)}); resuming from {path.name}")
        return path, state
    if problems:
        raise CheckpointError(f"no loadable checkpoint in {Path(run_dir) / 'checkpoints'}: " + "; ".join(problems))
    return None


# ---- the trained model, for use after training ------------------------------------------------

def save_trained(model: torch.nn.Module, tokenizer, directory: str | os.PathLike) -> Path:
    """Write the trained model and its tokenizer to `directory`, every file mode 0644.

    `anatomy.save_pretrained` writes Hugging Face format (loadable by transformers too) when a
    supported architecture expresses the config, and anatomy's own format otherwise;
    `anatomy.from_pretrained` and `load_trained` read either."""
    out = save_pretrained(model, directory)
    tokenizer.save(out)
    make_readable(out)
    return out


def load_trained(directory: str | os.PathLike):
    """(model in eval mode, Tokenizer) from a directory written by `save_trained`."""
    return from_pretrained(directory), Tokenizer.load(directory)
