"""The process's host memory: what it holds now, and handing glibc's free pages back to the system.

On CPU (and for every host buffer on an accelerator) XLA allocates through the C allocator. Under
glibc, buffers below the (dynamic, up to 32 MiB) mmap threshold live in malloc's arenas, and pages
that are free again stay mapped there: a run that alternates a rollout (thousands of small,
variously shaped executions) with an update (a few large ones) keeps the free pages of each and its
resident memory ratchets up step after step though nothing leaks. Measured on the full 2-Agent
SmolLM2 run (docs/results/methods_smollm2.md): early in step 5's update the arenas held 5.4 GiB of
which 1.9 GiB was in use; one `malloc_trim(0)` took the process from 14.1 to 10.7 GiB resident.

`release()` calls `malloc_trim(0)` (glibc ≥ 2.8 returns every wholly free page of every arena, not
only the heap's top) between a run's stages; `stats()` reports current and peak resident memory and
the allocator's in-use and free bytes for the metrics. Both do nothing (and report only what the
platform gives) off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import resource
import sys


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (2.33+): every field a size_t, summed over all arenas."""
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@functools.lru_cache(maxsize=1)
def _libc():
    """The process's C library when it is glibc (has malloc_trim), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "malloc_trim"):
        return None  # musl and others
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    if hasattr(libc, "mallinfo2"):
        libc.mallinfo2.argtypes, libc.mallinfo2.restype = [], _MallInfo2
    return libc


def release() -> bool:
    """Return the C allocator's wholly free pages to the system (glibc `malloc_trim(0)`). True when
    some memory was released; False when none was or the platform has no such call."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0))


def current_rss_mib() -> float | None:
    """Resident memory now (Linux /proc/self/statm), or None where unavailable."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * resource.getpagesize() / 2 ** 20


def stats() -> dict:
    """`memory/…` metrics: peak resident memory so far, resident memory now, and (glibc 2.33+) the
    allocator's bytes in use (arena chunks + mmapped blocks) and the free bytes in its arenas (resident
    until `release`, which returns their pages but keeps them as free chunks: the count stays)."""
    out = {"memory/peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    now = current_rss_mib()
    if now is not None:
        out["memory/rss_mib"] = now
    libc = _libc()
    if libc is not None and hasattr(libc, "mallinfo2"):
        mi = libc.mallinfo2()
        out["memory/malloc_in_use_mib"] = (mi.uordblks + mi.hblkhd) / 2 ** 20
        out["memory/malloc_free_mib"] = mi.fordblks / 2 ** 20
    return out
