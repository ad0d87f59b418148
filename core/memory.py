"""How a server process keeps the memory it frees, for reuse.

A drainer moves megabytes per message (pump responses in, merged batches, consumer responses
out). glibc serves a block above its mmap threshold (128 KiB at start, raised only as such
blocks are freed) with a fresh mapping, and returns the top of its heap to the kernel once more
than its trim threshold is free; either way the next buffer of that size is new memory, and
every 4 KiB page of it faults on first touch. On this project's test VMs that is ~0.5 ms per
MiB, the same order as copying the bytes: measured in a drainer's merge (drainer/columnar.py),
the CPU of the same pops varied 22-128 ms per 300k binlogs with the defaults and 22-34 ms with
freed memory kept and the merged batches taken from this allocator (docs/benchmarks.md).
"""
from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

__all__ = ["retain_freed_memory"]

# mallopt(3) parameters
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20   # glibc's ceiling on 64-bit hosts


def retain_freed_memory(keep_bytes: int = 256 << 20) -> bool:
    """Serve blocks up to 32 MiB from the heap and return free heap to the kernel only above
    `keep_bytes`. False (and nothing changed) where the C library has no mallopt (not glibc).
    The cost: up to `keep_bytes` of freed memory stays in the process's RSS."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt in this C library: freed memory is returned as the library likes")
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = (mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1
          and mallopt(_M_TRIM_THRESHOLD, keep_bytes) == 1)
    if not ok:
        log.warning("mallopt refused the memory settings; freed memory is returned to the kernel "
                    "as glibc's defaults say")
    return ok
