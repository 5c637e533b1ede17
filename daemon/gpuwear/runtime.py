"""The daemon process's tuning of its runtime: glibc's malloc arenas and Python's cyclic collector, each set once
(the wiring calls them: :mod:`gpuwear.service`, :mod:`gpuwear.cli`)."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable

M_ARENA_MAX = -8  # glibc malloc.h: the mallopt parameter that caps the number of malloc arenas
MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process (as MALLOC_ARENA_MAX does); call before starting threads.

    glibc gives a thread that allocates while the others hold their arenas an arena of its own, up to 8 per
    core, and keeps each one's pages. The HTTP server's thread per connection then grew the daemon's RSS by
    about 1 MiB over its first few thousand scrapes (33.2 -> 34.3 MiB at 8 GPUs; with 2 arenas +0.45 MiB, flat
    after 500). Threads that mostly sleep need no more than two. False where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_ARENA_MAX, arenas))


GC_YOUNG_THRESHOLD = 10_000  # net container allocations between two collections of the youngest generation


def settle_collector() -> None:
    """Tune Python's cyclic garbage collector for the daemon, once start-up is done.

    What start-up made (modules, the ledger's history) lives as long as the daemon, so it is frozen out of the
    collector's view and a full collection no longer walks it (one took 107 ms in a 64-GPU scrape). The youngest
    generation is collected every 10,000 net allocations of containers instead of 700. The daemon's values are
    acyclic and are freed by their reference counts, so these collections find almost nothing: 100 ticks and scrapes
    at 64 GPUs left 42 objects in cycles. At 700, each such scrape ran 1.5 collections (0.7 ms) over the views and
    lines it was building; at 10,000, none (bench/README.md)."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), middle, old)


def _malloc_trim() -> Callable[[], object] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has none)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


_TRIM = _malloc_trim()


def give_back_freed_memory() -> bool:
    """Hand the pages malloc holds free back to the kernel (glibc's ``malloc_trim(0)``: every arena, the free
    pages inside the heap too, not only its top). False where the C library has no such call.

    What a tick, a scrape and a save free goes back to malloc, which keeps it: the resident memory then holds each
    arena's high-water (bench/scrape_outside.md). Called once start-up is done and after each ledger save (once a
    minute): about 0.1 ms each."""
    if _TRIM is None:
        return False
    _TRIM()
    return True
