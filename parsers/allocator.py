"""Memory allocator settings that keep ingest's peak memory near its live data.

polars (1.x-2.x wheels) allocates through its own statically linked jemalloc, configured by the
``_RJEM_MALLOC_CONF`` environment variable, which jemalloc reads once, when polars' library loads.
``polars/__init__.py`` (2.1; pola-rs/polars#18088, #21829) sets it to
``dirty_decay_ms:500,muzzy_decay_ms:1000`` followed by any value already in the environment, so a
later option wins. Those defaults suit a query engine, not a parser that builds and drops ~100 MB
of slice frames per rank file: jemalloc gives threads separate arenas (4 per CPU), so pages freed
by the two decode threads are not reused by the thread that links the tables, and freed pages stay
resident for up to 1.5 s. Measured on a 2 x 103 MB Kineto directory (``benchmarks/README.md``,
kineto-ingest): peak RSS growth 1.85x (largest file + tables) with polars' defaults, 1.36x with
:data:`POLARS_JEMALLOC_CONF`, same wall time (decay 0 would give 1.24x at 2.5x the time).

:func:`configure` puts :data:`POLARS_JEMALLOC_CONF` in the environment when ``import ep_trace``
runs before anything imported polars and the user has not set the variable (a value of their own,
even empty, is kept: that is the opt-out). It cannot act once polars is loaded;
:func:`jemalloc_configured` says whether it took effect. Worker processes inherit the variable.

:func:`release_free_heap` returns the glibc heap's free pages to the OS (``malloc_trim``): the
gzip reads and JSON slices are Python ``bytes`` of 0.1-3 MB, above glibc's mmap threshold at first
but served from the heap once the threshold has adapted upwards, and the freed ones stay mapped.
"""

from __future__ import annotations

import ctypes
import os
import sys
from functools import cache

__all__ = ["POLARS_JEMALLOC_CONF", "configure", "jemalloc_configured", "release_free_heap"]

#: One arena (pages freed by any thread are reused by the next allocation of any thread), freed
#: pages purged over ~0.2 s and never parked as "muzzy" (MADV_FREE pages count in RSS until the
#: kernel reclaims them).
POLARS_JEMALLOC_CONF = "narenas:1,dirty_decay_ms:200,muzzy_decay_ms:0"
_VAR = "_RJEM_MALLOC_CONF"


def configure() -> bool:
    """Set polars' jemalloc options unless polars is loaded or the user set them.

    Returns:
        True when this call set :data:`POLARS_JEMALLOC_CONF`.
    """
    if "polars" in sys.modules or _VAR in os.environ:
        return False
    os.environ[_VAR] = POLARS_JEMALLOC_CONF
    return True


def jemalloc_configured() -> bool:
    """Whether :func:`configure` set polars' allocator options in this process (or its parent).

    Read from the variable itself: ours, or ours after the defaults polars prepends on import."""
    return os.environ.get(_VAR, "").endswith(POLARS_JEMALLOC_CONF)


@cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        # the process's own symbols: ctypes.util.find_library would fork ldconfig
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # musl and other libcs have no malloc_trim
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_free_heap() -> None:
    """Give the C heap's free pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    About 1 ms on a 100 MB heap; called once per rank file after its decode."""
    fn = _malloc_trim()
    if fn is not None:
        fn(0)
