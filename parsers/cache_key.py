"""The key of the ingest cache: what identifies a trace directory's content without reading it.

A file's *size* and *mtime* are not enough: ``cp -p`` and ``rsync --times`` (or ``os.utime``) put
back the old mtime on a regenerated file of the same size, and the cache returned the previous
analysis (issue 40). The key therefore also holds what no user can set back:

* the **inode** (``st_ino``): ``cp`` to a new file, ``rsync`` (which writes a temporary file and
  renames it) and most editors give the file a new one;
* the **ctime** (``st_ctime_ns``): set by the kernel to the current time on every write, ``chmod``,
  rename and ``utime`` of the file; there is no system call to set it back (only the system clock).

One case remains: a file changed twice within the granularity of the kernel's timestamp clock (a
few ms) keeps its ctime, so an edit that follows our reading of a file changed just before it
would go unseen. A file whose ctime lies within :data:`RACY_NS` of the moment it is statted (or in
the future) is therefore *racy* (git's "racily clean" index entries): its SHA-256 is stored beside
its entry in the manifest (not in the key) and checked again whenever the cache entry is used
(:func:`still_valid`); once a check finds it unchanged at least :data:`RACY_NS` after its ctime,
any later edit must change the ctime, and the digest is dropped from the manifest.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from ep_trace import schema

__all__ = ["RACY_NS", "input_files", "input_key", "still_valid"]

#: A file changed less than this before it is statted is "racy": its content digest is kept (2 s:
#: coarse kernel timestamps tick every 1-10 ms; the margin covers a network filesystem's clock).
RACY_NS = 2 * 10**9


def input_files(path: Path) -> list[Path]:
    """Every file the read of ``path`` uses: trace files (all files of an nsys parquetdir) and sidecars."""
    from ep_trace.parsers.dispatch import discover

    inputs, sidecars = discover(path)
    files: list[Path] = []
    for f, _ in inputs:
        files.extend(sorted(x for x in f.rglob("*") if x.is_file()) if f.is_dir() else [f])
    files.extend(sidecars.values())
    return files


def _digest(f: Path) -> str | None:
    """SHA-256 of a regular file's bytes, read 1 MiB at a time (None when it cannot be read, or is
    no regular file: a FIFO would block the open, a device never end; the reader refuses both)."""
    h = hashlib.sha256()
    try:
        if not stat.S_ISREG(os.stat(f).st_mode):
            return None
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def _stat(f: Path) -> os.stat_result:
    return f.stat()


def _entry(f: Path, root: Path, now_ns: int) -> dict[str, Any]:
    rel = os.path.relpath(f, root)
    try:
        st = _stat(f)
    except OSError as exc:  # a dangling link or a loop: read_trace_dir names it (or skips it)
        return {"path": rel, "size": -1, "mtime_ns": exc.errno}
    entry: dict[str, Any] = {
        "path": rel,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "ino": st.st_ino,
    }
    if st.st_ctime_ns > now_ns - RACY_NS and stat.S_ISREG(st.st_mode):
        entry["sha256"] = _digest(f)
    return entry


def input_key(path: str | Path, options: Mapping[str, Any] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Cache key of a trace directory: SHA-256 of the ep-trace and schema versions, the options, and
    (path, size, mtime, ctime, inode) of each input file; see the module doc.

    Returns:
        ``(hex key, [{path, size, mtime_ns, ctime_ns, ino[, sha256]}, ...])``: the entries go into the
        manifest; ``sha256`` (racy files only) is not part of the key.

    Raises:
        TraceFormatError: the directory cannot be listed.
    """
    from ep_trace import __version__

    p = Path(path)
    root = p.parent if p.is_file() else p
    try:
        files = input_files(p)
    except OSError as exc:
        from ep_trace.parsers.validate import os_error

        raise os_error(exc.filename or p, exc, "cannot list") from None
    now_ns = time.time_ns()
    entries = [_entry(f, root, now_ns) for f in files]
    blob = orjson.dumps(
        {
            "v": __version__,
            "schema": schema.SCHEMA_VERSION,
            "root": str(root.resolve()),
            "opts": {k: str(v) for k, v in sorted((options or {}).items())},
            "files": [{k: v for k, v in e.items() if k != "sha256"} for e in entries],
        }
    )
    return hashlib.sha256(blob).hexdigest(), entries


def still_valid(manifest: dict[str, Any], source_root: Path, manifest_path: Path) -> bool:
    """Whether the racy inputs of a cache entry (those with a ``sha256``) still hold what was read.

    Digests found unchanged :data:`RACY_NS` after their file's ctime are dropped from the manifest
    (best effort: a read-only cache keeps them and checks them again next time).
    """
    entries = manifest.get("inputs") or []
    racy = [e for e in entries if isinstance(e, dict) and "sha256" in e]
    if not racy:
        return True
    now_ns = time.time_ns()
    settled = 0
    for e in racy:
        f = source_root / str(e.get("path"))
        if e["sha256"] is None or _digest(f) != e["sha256"]:
            return False
        settled += int(now_ns - int(e.get("ctime_ns") or now_ns) > RACY_NS)
    if settled == len(racy):
        for e in racy:
            e.pop("sha256")
        tmp = manifest_path.with_name(f".{manifest_path.name}.{os.getpid()}")
        try:
            tmp.write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
            os.replace(tmp, manifest_path)
        except OSError:
            tmp.unlink(missing_ok=True)
    return True
