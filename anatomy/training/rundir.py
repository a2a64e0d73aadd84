"""One run folder, one writer: an exclusive lock held for the whole run.

Two `anatomy train --out R` at once would interleave their records in metrics.jsonl and leave
train_args.json from one run beside the checkpoints of the other. So a run takes an exclusive
`fcntl.flock` on `R/.lock` before it writes anything, and keeps it until it ends; a second run
finds the lock taken and stops with the first one's process id.

Stale locks cannot happen: the kernel releases a flock when its process ends, however it ends
(kill -9 included). The `.lock` file a dead run leaves behind is therefore not a lock: the next run
takes it, and only then removes the temporary files that the dead run's writers left behind.
Locks are per machine: on a network file system without flock support, do not share run folders.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK = ".lock"


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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunFolderInUse(f"{self.path.parent} is in use by another run (process {holder}): wait for it "
                                 f"to finish, or choose another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
