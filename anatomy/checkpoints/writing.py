"""Writing a checkpoint folder whole: safetensors shards as transformers writes them, the modes open()
gives, and a staging folder beside the target, so that an interrupted save leaves nothing in it; and
any one file written whole, the same way.

    write_safetensors   model.safetensors, or shards of at most max_shard_size with their index
    staged_folder       a hidden folder beside the target, moved into place when the save succeeds
    replacing           a hidden file beside the target, renamed over it when the writer succeeds
    write_atomically    text or bytes written whole through `replacing`
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file

from .files import INDEX_FILES, WEIGHT_FILES


def parse_size(size: int | str) -> int:
    """A shard size: bytes, or a string like "5GB", "500MB", "100KB" (powers of 1000, as transformers)."""
    units = {"GB": 10**9, "MB": 10**6, "KB": 10**3, "GIB": 2**30, "MIB": 2**20, "KIB": 2**10, "B": 1}
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    if isinstance(size, str):
        text = size.strip().upper()
        for unit, factor in units.items():
            number = text.removesuffix(unit)
            if number != text and number.strip().replace(".", "", 1).isdigit() and float(number) > 0:
                return int(float(number) * factor)
    raise ValueError(f"max_shard_size must be a positive number of bytes or a string like '5GB' or '500MB', got {size!r}")


def write_safetensors(tensors: dict[str, torch.Tensor], directory: Path, max_shard_size: int | str = "5GB") -> None:
    """model.safetensors, or model-0000k-of-0000n.safetensors shards of at most max_shard_size bytes
    (a larger tensor gets a shard of its own) with model.safetensors.index.json, as transformers writes."""
    limit = parse_size(max_shard_size)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        n = tensor.numel() * tensor.element_size()
        if shards[-1] and size + n > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += n
    if len(shards) == 1:
        _write_one(shards[0], directory / "model.safetensors")
        return
    weight_map = {}
    for k, shard in enumerate(shards, start=1):
        file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        _write_one(shard, directory / file)
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILES[0]).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _write_one(tensors: dict[str, torch.Tensor], path: Path) -> None:
    # contiguous copies: safetensors refuses views that share memory (a tied matrix, a split)
    save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
    os.chmod(path, _file_mode())  # safetensors creates the file 0600; give it what open() gives config.json


def _file_mode() -> int:
    """0o666 less the process's umask: what open() gives a new file (config.json)."""
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read from /proc without changing it (os.umask would, for every thread)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


@contextmanager
def replacing(path: str | Path, suffix: str = "", durable: bool = False) -> Iterator[Path]:
    """A hidden temporary file beside `path` (.NAME.XXXXXXXX.tmpSUFFIX) for the block to write; when the
    block ends without an error, it becomes `path` by one rename (atomic on POSIX), with the mode open()
    gives a new file, so that a reader never sees a partial file and a failure (an encoding error, a full
    disk, a kill) leaves the previous one whole and no temporary behind. suffix: an ending the writer
    reads the format from (".png"); durable: the file and its folder are fsync'd (a run folder's files).
    An OSError names `path`, never the temporary."""
    path = Path(path)
    try:  # the temporary's name shows whose it is, cut so that it stays within the file system's limit
        handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:100]}.", suffix=".tmp" + suffix)
    except OSError as error:
        raise OSError(error.errno, error.strerror, str(path)) from None
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        if durable:
            _fsync(temporary)
        os.chmod(temporary, _file_mode())  # mkstemp makes it 0600
        os.replace(temporary, path)
        if durable:
            _fsync(path.parent)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno is not None:  # name the user's file, not the temporary
            raise OSError(error.errno, error.strerror, str(path)) from None
        raise


def write_atomically(path: str | Path, data: str | bytes, durable: bool = False) -> Path:
    """Write `data` (text as UTF-8) to `path` all at once, through `replacing`; returns `path`."""
    payload = data.encode("utf-8") if isinstance(data, str) else data  # an encoding error before any file
    with replacing(path, durable=durable) as temporary:
        temporary.write_bytes(payload)
    return Path(path)


def _fsync(path: Path) -> None:
    """Flush a file's or a folder's contents to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# What anatomy's savers write into a checkpoint folder (config, weights, shards): a new save
# replaces them all, so that no file of an earlier save is read with the new ones.
SAVED_FILES = ("config.json", "anatomy_config.json", *WEIGHT_FILES[:1], *INDEX_FILES[:1], "model-*-of-*.safetensors")
STAGING = ".{name}.saving-{pid}-"


@contextmanager
def staged_folder(target: Path, replaces: tuple[str, ...] = SAVED_FILES) -> Iterator[Path]:
    """A hidden folder beside `target` to write a checkpoint into, moved into place when the block
    ends without an error, so that a save that is interrupted leaves nothing in `target`.

    safetensors writes each file through a temporary file of its own (.tmpXXXXXX) in the folder it
    writes to; a save killed halfway left that, hundreds of MB, in the model folder. Here it is
    left in the staging folder, which the next save beside it removes (a staging folder whose
    process is gone). A `target` that does not exist becomes the staging folder, renamed (atomic);
    one that exists gets each new file by os.replace, and loses the files an earlier save wrote
    that this one did not (`replaces`, the patterns of the files a save writes; by default SAVED_FILES: a
    stale model.safetensors would be read before new shards)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_staging(target)
    staging = Path(tempfile.mkdtemp(prefix=STAGING.format(name=target.name, pid=os.getpid()), dir=target.parent))
    try:
        yield staging
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes it 0700; a folder gets what mkdir gives
        if not target.exists():
            os.replace(staging, target)
            return
        written = {path.name for path in staging.iterdir()}
        for pattern in replaces:
            for stale in target.glob(pattern):
                if stale.name not in written and stale.is_file():
                    stale.unlink()
        for name in sorted(written):
            os.replace(staging / name, target / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_abandoned_staging(target: Path) -> None:
    """Delete the staging folders beside `target` whose writing process no longer runs (killed)."""
    for folder in target.parent.glob(STAGING.format(name=glob.escape(target.name), pid="*") + "*"):
        pid = folder.name.removeprefix(f".{target.name}.saving-").split("-", 1)[0]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: asks whether the process exists, sends nothing
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (or a pid beyond the system's): leave its folder alone
    return True


__all__ = ["SAVED_FILES", "parse_size", "staged_folder", "write_safetensors"]
