"""Freed buffers: handed back to the system, or kept for the next use (glibc's malloc; elsewhere nothing to do).

glibc serves a buffer below its mmap threshold from its heap, and keeps freed heap memory for reuse: a
process whose large temporaries come and go keeps the high-water mark of their fragments resident. The
threshold starts at 128 kB and rises with every mapped buffer freed, up to 32 MB, so buffers of a few
MB to 32 MB end up on the heap. Setting it fixes it: from `threshold` bytes up, a buffer gets a mapping
of its own and its memory goes back when it is freed (at the cost of a page fault per page on first
touch). Two users:

- `anatomy explore` (1 MB): the server's heap kept the high-water mark of every job; the soak's memory
  ended 14% above its start after five minutes, 2% below it with 1 MB.
- `anatomy circuits` and the bench's graph worker (16 MB): a long prompt's freed buffers of 16-32 MB
  stayed on the heap (the sweep's own temporaries are kept, frozen.Scratch; what else allocates them,
  oneDNN's bfloat16 products among it, was not traced). The 1,024-token graph peaked at 8.13 GB in
  float32 and 8.98 GB with its rows crossing attention in bfloat16; with 16 MB, 7.42 and 7.99 GB, at
  about the same speed (before the scratch, in bfloat16: 480 s without a threshold, 583 s with 16 MB and
  643 s with explore's 1 MB, every small buffer a mapping).

Training wants the opposite (`keep_freed_buffers`, set by `anatomy train`): every step allocates and frees
the same temporaries, and a buffer that got a mapping of its own, or heap memory that was trimmed and
then reused, costs a page fault per page at every step. The char LM's Muon recipe took about 1,800
page faults a step (its AdamW twin 800); with the threshold fixed at 32 MB and the heap's top trimmed
only above 256 MB, none. Measured over 300 steps, one thread, two runs each way: Muon 22.2-22.7 CPU s
against 23.7-24.2, AdamW unchanged within its noise (19.4-20.7 against 19.6-20.2), and the same losses
to the last digit (the arithmetic is the same; only where the memory comes from changes).
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
EXPLORE_THRESHOLD = 2**20
GRAPH_THRESHOLD = 16 * 2**20
LARGEST_THRESHOLD = 32 * 2**20  # glibc's ceiling for the mmap threshold on 64-bit machines
KEPT_TOP = 256 * 2**20  # free memory at the heap's top kept before any is trimmed


def return_large_buffers(threshold: int) -> None:
    """Buffers of `threshold` bytes or more in mappings of their own, handed back to the system when
    freed (the module docstring). Not glibc: nothing to do."""
    _mallopt((M_MMAP_THRESHOLD, threshold))


def keep_freed_buffers() -> None:
    """Buffers below 32 MB kept on the heap when freed and the heap's top kept up to 256 MB, so that a
    loop reuses its memory instead of faulting it in again (the module docstring). Not glibc: nothing
    to do."""
    _mallopt((M_MMAP_THRESHOLD, LARGEST_THRESHOLD), (M_TRIM_THRESHOLD, KEPT_TOP))


def _mallopt(*settings: tuple[int, int]) -> None:
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    for parameter, value in settings:
        mallopt(parameter, value)
