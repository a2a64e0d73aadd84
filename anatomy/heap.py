"""Large buffers handed back to the system when freed (glibc's malloc; elsewhere nothing to do).

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
"""

from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
EXPLORE_THRESHOLD = 2**20
GRAPH_THRESHOLD = 16 * 2**20


def return_large_buffers(threshold: int) -> None:
    """Buffers of `threshold` bytes or more in mappings of their own, handed back to the system when
    freed (the module docstring). Not glibc: nothing to do."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, threshold)
    except (OSError, AttributeError):
        pass
