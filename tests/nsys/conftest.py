"""Builder of tiny synthetic nsys SQLite exports (schema 2.9-style or 3.x-style) for exact-answer tests."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SESSION_START = 1_700_000_000_000_000_000


def _create(con: sqlite3.Connection, table: str, cols: list[str], rows: list[tuple[Any, ...]]) -> None:
    con.execute(f"CREATE TABLE {table} ({', '.join(chr(34) + c + chr(34) for c in cols)})")
    if rows:
        con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(cols))})", rows)


def build_export(
    path: Path,
    *,
    style: str = "3.x",
    strings: dict[int, str] | None = None,
    kernels: list[tuple[Any, ...]] | None = None,
    runtime: list[tuple[Any, ...]] | None = None,
    nvtx: list[tuple[Any, ...]] | None = None,
    memcpy: list[tuple[Any, ...]] | None = None,
    session_start: int | None = SESSION_START,
    thread_names: list[tuple[int, int]] | None = None,
    meta: dict[str, str] | None = None,
    system_env: dict[str, str] | None = None,
    streams: list[tuple[int, str, str]] | None = None,
) -> Path:
    """Write an export.

    kernels: (start, end, deviceId, streamId, correlationId, globalPid, nameStringId)
    runtime: (start, end, eventClass, globalTid, correlationId, nameStringId)
    nvtx: (start, end, eventType, text, globalTid, endGlobalTid, textId, domainId)
    memcpy: (start, end, deviceId, streamId, correlationId, globalPid, bytes, copyKind)
    system_env: ``TARGET_INFO_SYSTEM_ENV`` rows (``DeviceEnvironment`` = the recorded environment)
    streams: ``ProcessStreams`` rows (globalPid, file name, content), strings added to ``StringIds``
    ``None`` = table absent (lazy export); ``[]`` = table present and empty.
    """
    strings = dict(strings or {})
    stream_rows = []
    for g, fname, content in streams or []:
        a, b = max(strings, default=0) + 1, max(strings, default=0) + 2
        strings[a], strings[b] = fname, content
        stream_rows.append((g, a, b))
    con = sqlite3.connect(path)
    meta_table = "EXPORT_META_DATA" if style == "2.9" else "META_DATA_EXPORT"
    version = "2.9.1" if style == "2.9" else "3.25.0"
    _create(con, meta_table, ["name", "value"], [("EXPORT_SCHEMA_VERSION", version), *(meta or {}).items()])
    _create(con, "StringIds", ["id", "value"], sorted((strings or {}).items()))
    if session_start is not None:
        cols = ["utcEpochNs", "utcTime", "localTime"] + ([] if style == "2.9" else ["systemClockNs"])
        _create(
            con, "TARGET_INFO_SESSION_START_TIME", cols, [(session_start, "t", "t") + (() if style == "2.9" else (0,))]
        )
    green = [] if style == "2.9" else ["greenContextId"]
    if kernels is not None:
        cols = [
            "start",
            "end",
            "deviceId",
            "contextId",
            *green,
            "streamId",
            "correlationId",
            "globalPid",
            "demangledName",
            "shortName",
            "mangledName",
            "gridId",
        ]
        rows = [(s, e, d, 1, *([None] if green else []), st, c, g, n, n, None, 0) for s, e, d, st, c, g, n in kernels]
        _create(con, "CUPTI_ACTIVITY_KIND_KERNEL", cols, rows)
    if memcpy is not None:
        cols = [
            "start",
            "end",
            "deviceId",
            "contextId",
            *green,
            "streamId",
            "correlationId",
            "globalPid",
            "bytes",
            "copyKind",
        ]
        rows = [(s, e, d, 1, *([None] if green else []), st, c, g, b, k) for s, e, d, st, c, g, b, k in memcpy]
        _create(con, "CUPTI_ACTIVITY_KIND_MEMCPY", cols, rows)
    if runtime is not None:
        _create(
            con,
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            ["start", "end", "eventClass", "globalTid", "correlationId", "nameId", "returnValue", "callchainId"],
            [(*r, 0, None) for r in runtime],
        )
    if nvtx is not None:
        cols = [
            "start",
            "end",
            "eventType",
            "rangeId",
            "category",
            "color",
            "text",
            "globalTid",
            "endGlobalTid",
            "textId",
            "domainId",
        ]
        _create(
            con,
            "NVTX_EVENTS",
            cols,
            [(s, e, t, None, None, None, x, g, eg, tx, d) for s, e, t, x, g, eg, tx, d in nvtx],
        )
    if system_env is not None:
        _create(con, "TARGET_INFO_SYSTEM_ENV", ["name", "value"], list(system_env.items()))
    if streams is not None:
        _create(con, "ProcessStreams", ["globalPid", "filenameId", "contentId"], stream_rows)
    if thread_names is not None:
        _create(con, "ThreadNames", ["nameId", "priority", "globalTid"], [(n, 0, g) for n, g in thread_names])
    con.commit()
    con.close()
    return path


@pytest.fixture
def make_export(tmp_path: Path) -> Callable[..., Path]:
    """``make_export(name, **kwargs)`` -> path of a synthetic export in tmp_path."""

    def _make(name: str = "synthetic.sqlite", **kwargs: Any) -> Path:
        return build_export(tmp_path / name, **kwargs)

    return _make
