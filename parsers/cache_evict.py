"""Size cap of the ingest cache (``~/.cache/ep-trace`` or ``$EP_TRACE_CACHE_DIR``).

``ep-trace analyze`` keeps the parsed tables of every trace directory it reads (``parquet_io.
load_trace_dir``), so a re-analysis takes seconds. A week of traces of a large job would fill the
disk, so after each new entry the least recently used entries (by their ``manifest.json``'s
mtime, touched on every hit) are removed until the cache holds at most
``EP_TRACE_CACHE_MAX_BYTES`` (default 20 GiB). The entry just written is never removed, even when it
alone is larger than the cap; temporary directories of writes in progress (``.<key>-*``) are not
counted.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from ep_trace.parsers.input_guard import env_bytes

__all__ = ["CACHE_MAX_BYTES", "cache_limit", "touch", "evict"]

log = logging.getLogger(__name__)

#: Default cap of the ingest cache, bytes.
CACHE_MAX_BYTES = 20 << 30
_MANIFEST = "manifest.json"


def cache_limit() -> int:
    """``EP_TRACE_CACHE_MAX_BYTES`` or :data:`CACHE_MAX_BYTES`."""
    return env_bytes("EP_TRACE_CACHE_MAX_BYTES", CACHE_MAX_BYTES)


def touch(entry: Path) -> None:
    """Mark ``entry`` as used now (a cache hit)."""
    try:
        os.utime(entry / _MANIFEST)
    except OSError:  # a read-only cache still serves hits
        pass


def _size(d: Path) -> int:
    total = 0
    for root, _, files in os.walk(d):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _last_used(d: Path) -> float:
    try:
        return (d / _MANIFEST).stat().st_mtime
    except OSError:
        return 0.0  # no manifest: an incomplete entry, the first to go


def evict(root: Path, keep: Path, limit: int | None = None) -> list[Path]:
    """Remove the least recently used entries of ``root`` (never ``keep``) until it holds at most
    ``limit`` bytes; returns the removed entries."""
    limit = cache_limit() if limit is None else limit
    try:
        entries = [d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")]
    except OSError:
        return []
    sizes = {d: _size(d) for d in entries}
    total = sum(sizes.values())
    removed: list[Path] = []
    for d in sorted(entries, key=lambda d: (_last_used(d), d.name)):
        if total <= limit:
            break
        if d == keep:
            continue
        shutil.rmtree(d, ignore_errors=True)
        total -= sizes[d]
        removed.append(d)
    if removed:
        log.info("ingest cache %s: removed %d least recently used entries (cap %d bytes)", root, len(removed), limit)
    return removed
