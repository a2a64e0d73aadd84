"""One run folder, one writer: an exclusive lock held for the whole run.

Two `anatomy train --out R` at once would interleave their records in metrics.jsonl and leave
train_args.json from one run beside the checkpoints of the other. So a run holds `R/.lock` before
it writes anything, and until it ends; a second run finds it held and stops, naming the first
one's process id. The lock is

    written whole before it has its name: the owner's pid goes into a fresh file, flocked, which
        is then hard-linked as `.lock` (link fails if `.lock` exists), so whoever finds `.lock`
        finds its owner in it, never an empty file;
    held by an exclusive `fcntl.flock`, which the kernel releases when its process ends, however
        it ends (kill -9 included): a `.lock` whose flock is free is a dead run's, and the next
        run removes it (while holding that flock, so that two runs cannot both do it) and takes
        its place; only then does it remove the temporary files the dead run's writers left;
    removed when the run ends.

Locks are per machine: on a network file system without flock support, do not share run folders.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path

LOCK = ".lock"
ATTEMPTS = 50  # tries to take a lock that keeps changing hands (each a few system calls, or 10 ms)


class RunFolderInUse(ValueError):
    """Another process holds the run folder's lock."""


class RunLock:
    """`with RunLock(run_dir):` holds the exclusive lock on `run_dir` (created if missing).

    Raises RunFolderInUse, naming the holder's process id, when another process holds it."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # no ".tmp" in the name: checkpoint.remove_temporaries, run by the holder, leaves it alone
        fd, pending = tempfile.mkstemp(dir=self.path.parent, prefix=f"{LOCK}-")
        try:
            os.write(fd, f"{os.getpid()}\n".encode())
            os.fchmod(fd, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
            for _ in range(ATTEMPTS):
                try:
                    os.link(pending, self.path)
                except FileExistsError:
                    self._refuse_or_clear()
                    continue
                self.fd = fd
                return self
            raise RunFolderInUse(f"{self.path.parent} keeps changing hands between other runs: choose another --out")
        except BaseException:
            os.close(fd)
            raise
        finally:
            os.unlink(pending)

    def _refuse_or_clear(self) -> None:
        """`.lock` exists: RunFolderInUse if a live process holds it; a dead run's is removed."""
        try:
            other = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:  # released meanwhile
            return
        try:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(other, 32).decode(errors="replace").strip()
                if self._names(other) and _alive(holder):
                    raise RunFolderInUse(f"{self.path.parent} is in use by another run (process {holder}): wait "
                                         "for it to finish, or choose another --out") from None
                time.sleep(0.01)  # another run is clearing a dead run's lock, or just released it
                return
            if self._names(other):  # a dead run's: its flock is ours now, so only we remove it
                os.unlink(self.path)
        finally:
            os.close(other)

    def _names(self, fd: int) -> bool:
        """Whether `.lock` is still the file open as `fd` (not removed or replaced since)."""
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove `.lock` (while still holding it), then let it go."""
        if self.fd is not None:
            if self._names(self.fd):
                os.unlink(self.path)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _alive(pid: str) -> bool:
    """Whether process `pid` (as the lock file spells it) exists; True when that cannot be told."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, OverflowError):
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True
