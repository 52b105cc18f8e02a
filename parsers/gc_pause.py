"""Python's cyclic garbage collector held off while one Kineto ingest runs.

A Kineto read keeps the whole ``args`` of every collective marker event (``record_param_comms``,
``gloo:*``, ``c10d::*`` ...; :mod:`ep_trace.parsers.kineto_columnar`) as orjson dicts and lists
until the collective table is built: ~47,000 container objects for the 1,976 calls of the 51 MB
``gloo1_50mb`` rank file. Each 700 container allocations start a young collection, every tenth of
those an older one, and enough long-lived newcomers (over a quarter of the objects already there)
a full collection of the interpreter's ~43,000 objects; measured in one process, thread CPU, the
collector took 5-23 ms of a 0.42 s read (a full collection in 2 of 3 reads). None of those objects
is garbage while the read runs (they are dropped by reference count when it ends), and the read
makes no reference cycles of its own, so collecting during it finds nothing: :func:`paused` turns
the collector off for the read and back on after it, when no other read in the process is still
running and it was on before the first one began.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["paused"]

_LOCK = threading.Lock()
_depth = 0  # reads running in this process (threads may run reads side by side)
_resume = False  # whether the collector was on when the first of them began


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector for the ``with`` block (reference counting still
    frees everything that is not in a cycle); re-entrant and thread-safe.

    The collector is turned back on when the last block running in the process ends, if it was on
    when the first one began; a program that turned it off itself keeps it off."""
    global _depth, _resume
    with _LOCK:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _LOCK:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
