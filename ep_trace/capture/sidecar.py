"""Writer of the per-rank sidecar ``rank{r}.ep.jsonl`` (format: docs/sidecar.md).

JSON Lines, one record per line, ``"type"`` and ``"v"`` on every record. Records are buffered in the
file object and flushed (``flush`` + ``os.fsync``) at every step end, so a job killed mid-run keeps
every finished step. No torch here: the capture modules convert tensors to lists before writing.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import orjson

from ep_trace.trace_files import SIDECAR_VERSION, sidecar_path, trace_path

__all__ = ["SIDECAR_VERSION", "SidecarWriter", "active_writer", "sidecar_path", "trace_path"]

logger = logging.getLogger(__name__)


class SidecarWriter:
    """Appends sidecar records for one rank and tracks the step / all-to-all ordinal.

    Args:
        path: The ``rank{r}.ep.jsonl`` file (truncated on open).
        meta: The first ``meta`` record (keys of docs/sidecar.md).
    """

    def __init__(self, path: str | Path, meta: dict[str, Any], first_step: int = 0) -> None:
        self.path = Path(path)
        self.meta = dict(meta)
        # Records made between steps carry the number of the last step begun (first_step before any).
        self.step: int = first_step
        self._open = False
        self._a2a_call = 0
        #: Placement in force per layer after a change (``record_routing``'s ``placement`` records).
        self.placements: dict[int, list[list[int]]] = {}
        self._lock = threading.Lock()  # record_* may be called from a helper thread
        self._fh = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self.write("meta", **self.meta)
        self.flush()

    def write(self, type_: str, **fields: Any) -> None:
        """Append one record ``{"type": type_, "v": SIDECAR_VERSION, **fields}``."""
        line = orjson.dumps({"type": type_, "v": SIDECAR_VERSION, **fields}) + b"\n"
        with self._lock:
            if self._fh.closed:
                logger.warning("sidecar %s is closed; dropped a %s record", self.path, type_)
                return
            self._fh.write(line)

    def update_meta(self, **fields: Any) -> None:
        """Write a ``meta`` update holding only the keys whose value changed."""
        changed = {k: v for k, v in fields.items() if v is not None and self.meta.get(k) != v}
        if changed:
            self.meta.update(changed)
            self.write("meta", **changed)

    def next_a2a_call(self) -> int:
        """The 0-based ordinal of the next all-to-all call within the current step."""
        with self._lock:
            n = self._a2a_call
            self._a2a_call += 1
            return n

    def begin_step(self, step: int) -> None:
        """Start numbering records of ``step`` (the N of ``ProfilerStep#N``)."""
        with self._lock:
            self.step = step
            self._open = True
            self._a2a_call = 0

    def end_step(self, time_ns: int) -> None:
        """Write ``step_end`` for the current step and flush the file to disk."""
        if not self._open:
            return
        self._open = False
        self.write("step_end", step=self.step, time_ns=time_ns)
        self.flush()

    def flush(self) -> None:
        """Flush buffered records to the OS and to disk."""
        with self._lock:
            if not self._fh.closed:
                self._fh.flush()
                os.fsync(self._fh.fileno())

    def close(self) -> None:
        """Flush and close (idempotent)."""
        self.flush()
        with self._lock:
            if not self._fh.closed:
                self._fh.close()


# The writer of the Tracer active in this process (None when none). A process-wide slot rather than
# a ContextVar: record_routing / record_a2a may run on helper threads, which start with an empty
# context.
_ACTIVE: list[SidecarWriter] = []


def active_writer() -> SidecarWriter | None:
    """The sidecar writer of the active :class:`ep_trace.Tracer`, or ``None``."""
    return _ACTIVE[-1] if _ACTIVE else None


def _push(writer: SidecarWriter) -> None:
    _ACTIVE.append(writer)


def _pop(writer: SidecarWriter) -> None:
    if writer in _ACTIVE:
        _ACTIVE.remove(writer)
