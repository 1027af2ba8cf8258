"""Keep request-sized buffers in the heap: glibc's malloc thresholds, raised once a process.

Theory of operation
-------------------
glibc serves an allocation above its mmap threshold (128 KiB at first, moved up to 32 MiB
by what the process frees) with fresh pages from mmap, and gives freed memory at the top of
the heap back to the kernel past its trim threshold. A buffer of about a mebibyte (a
produce request, its protobuf, a fetch answer) then costs a page fault per 4 KiB page each
time it is made: about 0.8 ms for 1 MB here, where the copy itself takes 20-50 us.
bench/PROFILE.md measured 80% system time on the broker under produce load, and the same
pattern in the producer's sender building a 1 MB ProduceRequest (upb's arena: 0.8 ms a
request, 0.05 ms with the thresholds raised).

`keep_large_buffers_in_the_heap(threshold_bytes)` raises both thresholds to
`threshold_bytes` with mallopt (through ctypes; no compiler): allocations below it come
from the heap, and freed memory below it stays for the next one, as the JVM keeps its heap.
The process's peak memory is unchanged; what changes is that it is not handed back and
faulted in again on every request.

- Once a process: the first call sets the thresholds, later calls change nothing. The
  broker calls it as it starts, each Producer and Consumer as it is made; in a process that
  holds both (the demo's embedded broker, tests) whichever comes first decides.
- The operator's choice stands: with MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ in the
  environment, or either threshold in GLIBC_TUNABLES, nothing is changed.
- Not glibc (musl, macOS): nothing is changed.
"""
from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("eos.allocator")

MIB = 1024 * 1024
# The broker's: socket.request.max.bytes is 100 MiB.
BROKER_THRESHOLD_BYTES = 256 * MIB
# The clients': a consumer's fetch.max.bytes is 50 MiB, a producer's request 1 MiB by default.
CLIENT_THRESHOLD_BYTES = 64 * MIB

_M_TRIM_THRESHOLD = -1      # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
_OPERATOR_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_OPERATOR_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")

_lock = threading.Lock()
_done = False


def operator_chose(environ=os.environ) -> bool:
    """Whether the environment sets glibc's malloc thresholds itself (other malloc
    settings, such as a container's glibc.malloc.arena_max, do not count)."""
    if any(name in environ for name in _OPERATOR_VARIABLES):
        return True
    tunables = environ.get("GLIBC_TUNABLES", "")
    return any(name in tunables for name in _OPERATOR_TUNABLES)


def keep_large_buffers_in_the_heap(threshold_bytes: int) -> bool:
    """Raise glibc's mmap and trim thresholds to `threshold_bytes`, the first time a
    process asks; returns whether this call set them (see the module doc)."""
    global _done
    with _lock:
        if _done:
            return False
        _done = True
        if operator_chose():
            log.debug("malloc thresholds set by the environment; keeping them")
            return False
        try:
            import ctypes
            libc = ctypes.CDLL("libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):   # not glibc: the allocator's defaults stay
            log.debug("mallopt is not available; keeping the allocator's defaults")
            return False
        # (mallopt returns 1 on success)
        return bool(mallopt(_M_MMAP_THRESHOLD, threshold_bytes)) and bool(mallopt(_M_TRIM_THRESHOLD, threshold_bytes))
