"""Issue 40, items 2 and 4: bounded parsing (nesting depth, data after the document, events per byte,
SQLite views and step budget) and an ingest cache that cannot go stale.

Each test builds the input that used to blow up, hang or return a stale analysis, and pins the
one-line error word for word (or the corrected result).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest

from ep_trace.errors import ResourceLimitError, TraceFormatError
from ep_trace.parsers import json_guard, kineto_json, read_trace_dir, sqlite_guard
from ep_trace.parsers.parquet_io import ingest, load_trace_dir

ROOT = Path(__file__).resolve().parents[2]
BALANCED = ROOT / "sample_traces" / "balanced"
NSYS = ROOT.parent / "shared" / "external" / "nsys" / "flameox" / "nsight-2025.5.2.sqlite"
BASE = 1_700_000_000_000_000_000
DEPTH_FIX = (
    "the file is damaged or not a trace; if it is genuine, set EP_TRACE_MAX_JSON_DEPTH=128 (at most 200) "
    "to raise the cap (--keep-going skips it)"
)
VIEW_FIX = "re-export the report with 'nsys export --type sqlite' (an export holds plain tables only)"


def trace_text(events: list[dict[str, Any]], rank: int = 0) -> bytes:
    doc = {"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 1}, "traceEvents": events}
    doc["baseTimeNanoseconds"] = BASE
    return json.dumps(doc).encode()


def x(name: str, ts: Any, dur: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def steps() -> list[dict[str, Any]]:
    return [x(f"ProfilerStep#{i}", 1000 * i, 900) for i in range(2)] + [
        x("aten::mm", 1000 * i + 10, 500) for i in range(2)
    ]


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    d = tmp_path / "demo"
    shutil.copytree(BALANCED, d, ignore=shutil.ignore_patterns("README.md"))
    return d


# --- nesting depth ----------------------------------------------------------------------------


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("field", ["ts", "dur"])
def test_time_nested_1000_lists_deep(demo: Path, monkeypatch: pytest.MonkeyPatch, native: str, field: str) -> None:
    """Used to abort the process (polars' Series builder ran out of memory on the nested value)."""
    monkeypatch.setenv("EP_TRACE_NATIVE", native)
    p = demo / "rank1.pt.trace.json.gz"
    text = gzip.decompress(p.read_bytes())
    key = f'"{field}": '.encode()
    at = text.index(key, len(text) // 2) + len(key)
    old_end = at + len(text[at:].split(b",", 1)[0])
    text = text[:at] + b"[" * 1000 + b"1" + b"]" * 1000 + text[old_end:]
    p.write_bytes(gzip.compress(text, 1))
    with pytest.raises(ResourceLimitError) as exc:
        read_trace_dir(demo)
    assert str(exc.value) == f"{p}: byte {at + 61:,}: JSON nested more than 64 levels deep; {DEPTH_FIX}"
    t = read_trace_dir(demo, on_error="skip")  # --keep-going: the rank is left out and named
    assert sorted(t.ranks["rank"].to_list()) == [0, 2, 3]


def test_depth_cap_is_raised_by_the_environment_up_to_the_hard_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "rank0.json"
    p.write_bytes(
        trace_text(steps() + [{**x("aten::a", 5, 1), "args": {"deep": "__N__"}}]).replace(
            b'"__N__"', b"[" * 80 + b"]" * 80
        )
    )
    with pytest.raises(ResourceLimitError, match="JSON nested more than 64 levels deep"):
        read_trace_dir(p)
    monkeypatch.setenv("EP_TRACE_MAX_JSON_DEPTH", "128")
    assert read_trace_dir(p).events.height == 5
    monkeypatch.setenv("EP_TRACE_MAX_JSON_DEPTH", "100000")
    assert json_guard.json_depth_limit() == json_guard.HARD_MAX_JSON_DEPTH == 200


def test_sidecar_line_nested_too_deep(demo: Path) -> None:
    sc = demo / "rank2.ep.jsonl"
    lines = sc.read_bytes().splitlines(keepends=True)
    lines.insert(2, b'{"type": "note", "v": 1, "x": ' + b"[" * 500 + b"]" * 500 + b"}\n")
    sc.write_bytes(b"".join(lines))
    with pytest.raises(ResourceLimitError) as exc:
        read_trace_dir(demo)
    assert str(exc.value) == f"{sc}: line 3: JSON nested more than 64 levels deep; {DEPTH_FIX}"


def _reference(text: bytes, max_depth: int, max_events: int) -> tuple[int, ...]:
    """The guard's rules, one byte at a time (json_guard's module doc): the oracle of both scans."""
    depth, end, events, ev_depth, in_str, esc = 0, -1, 0, 0, False, False
    for i, c in enumerate(text):
        if end >= 0:
            if c in b" \t\n\r":
                continue
            return (2, i)
        if esc:
            esc = False
        elif c == 92:
            esc = True
        elif in_str:
            in_str = c != 34
        elif c == 34:
            in_str = True
        elif c in b"[{":
            depth += 1
            if depth > max_depth:
                return (1, i)
            if depth == 1:
                ev_depth = 3 if c == 123 else 2
            if c == 123 and depth == ev_depth:
                events += 1
                if events > max_events:
                    return (3, i)
        elif c in b"]}" and depth > 0:
            depth -= 1
            end = i + 1 if depth == 0 else -1
    return (0, depth, end, events)


def test_c_and_numpy_guards_agree_with_the_reference() -> None:
    from ep_trace.parsers import kineto_native

    scans = [json_guard.guard_numpy] + ([json_guard._kscan.guard] if kineto_native.available() else [])
    rng = random.Random(40)
    alphabet = b'{}[]"\\ \n,:a0\x00'
    for _ in range(3000):
        text = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        max_depth, max_events = rng.randint(1, 5), rng.randint(0, 4)
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 3))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        want = _reference(text, max_depth, max_events)
        for scan in scans:
            state, got = json_guard._START, None
            for piece in pieces:
                state, code, at = scan(piece, state, max_depth, max_events)
                if code:
                    got = (code, at)
                    break
            assert (got or (0, state[1], state[2], state[3])) == want, (scan, text, pieces)


# --- data after the document ------------------------------------------------------------------


@pytest.mark.parametrize("native", ["1", "0"])
def test_nul_padding_after_the_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str) -> None:
    """A 110 KB .json.gz of this shape took 140 s (each ']' from the end was tried, copying the tail)."""
    monkeypatch.setenv("EP_TRACE_NATIVE", native)
    text = gzip.decompress((BALANCED / "rank0.pt.trace.json.gz").read_bytes())
    p = tmp_path / "rank0.pt.trace.json.gz"
    p.write_bytes(gzip.compress(text + b"\n" + b"\x00" * (8 << 20), 6))
    with pytest.raises(TraceFormatError) as exc:
        read_trace_dir(p)
    n = len(text)
    assert str(exc.value) == (
        f"{p}: NUL padding from byte {n + 1:,}, after the end of the JSON document (its first {n:,} bytes); "
        f"re-export the trace, or keep only the first {n:,} bytes of its text (--keep-going skips it)"
    )


@pytest.mark.parametrize(("tail", "what"), [(b"{}", "a second JSON document"), (b"xyz", "other data (b'x')")])
def test_data_after_the_document(tmp_path: Path, tail: bytes, what: str) -> None:
    text = trace_text(steps())
    p = tmp_path / "rank0.json"
    p.write_bytes(text + b"\r\n" + tail)
    with pytest.raises(TraceFormatError) as exc:
        read_trace_dir(p)
    n = len(text)
    assert str(exc.value) == (
        f"{p}: {what} from byte {n + 2:,}, after the end of the JSON document (its first {n:,} bytes); "
        f"re-export the trace, or keep only the first {n:,} bytes of its text (--keep-going skips it)"
    )
    with pytest.raises(TraceFormatError, match=what.replace("(", r"\(").replace(")", r"\)")):
        kineto_json.read_bytes(p)  # the whole-buffer path says the same


def test_array_end_search_is_bounded() -> None:
    """A tail of many '],' after traceEvents: each candidate copied the tail (quadratic); now bounded."""
    text = b'{"traceEvents": [{"ph": "X"}], "x": [' + b"[1]," * 300_000 + b"[1]]}"
    assert kineto_json._array_end(text, text.index(b"[") + 1) in (None, text.index(b"}]") + 1)


# --- events per byte (gzip bomb of tiny events) --------------------------------------------------


def test_gzip_bomb_of_tiny_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """0.9 MB of gzip holding 4.4 M tiny events stayed under the 256 MiB inflate floor and blew past 4 GB."""
    monkeypatch.setattr(json_guard, "EVENTS_FLOOR", 1000)  # (the real floor, 1,048,576, needs a large file)
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(gzip.compress(trace_text(steps() + [x("k", 5, 1)] * 5000), 9))
    limit = max(1000, p.stat().st_size)  # (a few KB of gzip for 5,000 events)
    with pytest.raises(ResourceLimitError) as exc:
        read_trace_dir(p)
    text = trace_text(steps() + [x("k", 5, 1)] * 5000)
    at = [i for i in range(len(text)) if text.startswith(b'{"ph"', i)][limit]  # the first event past the cap
    assert str(exc.value) == (
        f"{p}: byte {at:,}: holds more than {limit:,} events (cap: one per byte of the file, at least 1,000; "
        f"a gzip bomb?); if the trace is genuine, set EP_TRACE_MAX_EVENTS={2 * limit} to raise the cap"
    )
    monkeypatch.setenv("EP_TRACE_MAX_EVENTS", "10000")
    assert read_trace_dir(p).events.height == 5  # (the 5000 copies are one event)


def test_event_cap_of_real_traces() -> None:
    """The densest real trace holds one event per 12.7 bytes of .json.gz: far from the cap."""
    assert json_guard.event_limit(BALANCED / "rank0.pt.trace.json.gz") == json_guard.EVENTS_FLOOR == 1 << 20


# --- SQLite ----------------------------------------------------------------------------------


def _nsys_copy(tmp_path: Path, name: str = "run.sqlite") -> Path:
    if not NSYS.exists():
        pytest.skip("../shared/external is not beside the checkout")
    dst = tmp_path / name
    shutil.copy(NSYS, dst)
    dst.chmod(0o644)
    return dst


@pytest.mark.parametrize("table", ["StringIds", "CUPTI_ACTIVITY_KIND_RUNTIME"])
def test_sqlite_view_over_a_recursive_cte_is_refused(tmp_path: Path, table: str) -> None:
    """Used to hang: the view never ends, in a 0.5 MB file."""
    db = _nsys_copy(tmp_path)
    con = sqlite3.connect(db)
    cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
    sel = ", ".join(f"x AS {c}" for c in cols)
    con.executescript(
        f"DROP TABLE {table}; CREATE VIEW {table} AS WITH RECURSIVE c(x) AS "
        f"(SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT {sel} FROM c;"
    )
    con.close()
    with pytest.raises(TraceFormatError) as exc:
        read_trace_dir(db)
    assert str(exc.value) == f"{db}: {table}: is a view, not a table (reading it would run its query); {VIEW_FIX}"


def test_sqlite_generated_column_is_refused(tmp_path: Path) -> None:
    db = _nsys_copy(tmp_path)
    con = sqlite3.connect(db)
    con.executescript(
        "ALTER TABLE StringIds RENAME TO S0; CREATE TABLE StringIds (id INTEGER, "
        "value TEXT GENERATED ALWAYS AS (hex(zeroblob(100000000))) VIRTUAL); "
        "INSERT INTO StringIds (id) SELECT id FROM S0;"
    )
    con.close()
    with pytest.raises(TraceFormatError) as exc:
        read_trace_dir(db)
    assert str(exc.value) == (
        f"{db}: StringIds: column 'value' is generated (computed on every read), not stored; {VIEW_FIX}"
    )


def test_sqlite_virtual_table_is_refused(tmp_path: Path) -> None:
    db = _nsys_copy(tmp_path)
    con = sqlite3.connect(db)
    con.executescript(
        "ALTER TABLE StringIds RENAME TO S0; CREATE VIRTUAL TABLE StringIds USING fts5(id, value); "
        "INSERT INTO StringIds SELECT id, value FROM S0;"
    )
    con.close()
    with pytest.raises(TraceFormatError) as exc:
        read_trace_dir(db)
    assert str(exc.value) == f"{db}: StringIds: is a virtual table (reading it would run its module); {VIEW_FIX}"


def test_sqlite_step_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = _nsys_copy(tmp_path)
    monkeypatch.setattr(sqlite_guard, "MIN_STEPS", 1000)
    monkeypatch.setattr(sqlite_guard, "STEPS_PER_BYTE", 0)
    monkeypatch.setattr(sqlite_guard, "_EVERY", 100)
    with pytest.raises(TraceFormatError) as exc:
        read_trace_dir(db)
    table = str(exc.value).split(": ")[1]
    assert str(exc.value) == (
        f"{db}: {table}: reading {table} took more than 1,000 SQLite steps (0 per byte of the file); "
        f"the file is damaged or not an nsys export; {VIEW_FIX}"
    )


@pytest.mark.parametrize("name", ["run?mode=rw.sqlite", "a#b%20c.sqlite"])
def test_sqlite_name_with_uri_characters_is_opened_read_only(tmp_path: Path, name: str) -> None:
    """A '?' ended the path of the file: URI (and its mode=ro went with it)."""
    db = _nsys_copy(tmp_path, name)
    before = (db.read_bytes(), db.stat().st_mtime_ns, db.stat().st_ctime_ns)
    t = read_trace_dir(db)
    assert t.events.height > 0
    assert (db.read_bytes(), db.stat().st_mtime_ns, db.stat().st_ctime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no journal, WAL or new file beside it


def test_sqlite_in_a_read_only_directory(tmp_path: Path) -> None:
    db = _nsys_copy(tmp_path)
    db.chmod(0o444)
    tmp_path.chmod(0o555)
    try:
        assert read_trace_dir(db).events.height > 0
    finally:
        tmp_path.chmod(0o755)


# --- the ingest cache ----------------------------------------------------------------------------


def _swap_counts(sc: Path) -> None:
    """Edit a sidecar keeping its size: the first routing record's first two counts swapped."""
    lines = sc.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if rec.get("type") == "routing":
            c = rec["expert_counts"]
            j = next(k for k in range(1, len(c)) if len(str(c[k])) == len(str(c[0])) and c[k] != c[0])
            c[0], c[j] = c[j], c[0]
            new = json.dumps(rec, separators=(",", ":")) + "\n"
            assert len(new) == len(line)
            lines[i] = new
            break
    sc.write_text("".join(lines))


@pytest.mark.parametrize("frozen", [False, True], ids=["ctime", "racy_digest"])
def test_edit_keeping_size_and_mtime_is_seen(
    demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, frozen: bool
) -> None:
    """cp -p / rsync --times of a regenerated file: same size, same mtime; the cache returned the old analysis.

    ``ctime``: the edit's new ctime changes the key; ``racy_digest``: the file is statted as if its
    ctime and inode had not moved (an edit within one tick of the kernel's clock) and was changed
    within 2 s of the read, so the SHA-256 kept in the manifest must see it.
    """
    from ep_trace.parsers import cache_key

    sc = demo / "rank0.ep.jsonl"
    monkeypatch.setattr(cache_key, "RACY_NS", 10**15 if frozen else 0)  # every input racy / none
    if frozen:
        st0 = sc.stat()
        real = cache_key._stat

        def stat(f: Path) -> Any:
            st = real(f)
            if f != sc:
                return st
            return SimpleNamespace(
                st_mode=st.st_mode,
                st_size=st.st_size,
                st_mtime_ns=st.st_mtime_ns,
                st_ctime_ns=st0.st_ctime_ns,
                st_ino=st0.st_ino,
            )

        monkeypatch.setattr(cache_key, "_stat", stat)
    out = tmp_path / "tables"
    first, cached = ingest(demo, out)
    assert not cached
    cache = tmp_path / "cache"
    a = load_trace_dir(demo, cache_dir=cache)
    st = sc.stat()
    _swap_counts(sc)
    os.utime(sc, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (sc.stat().st_size, sc.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    again, cached = ingest(demo, out)
    assert not cached
    key = ["step", "layer", "expert"]
    r0 = pl.col("rank") == 0
    assert not again.routing_counts.filter(r0).sort(key).equals(first.routing_counts.filter(r0).sort(key))
    b = load_trace_dir(demo, cache_dir=cache)
    assert b.routing_counts.sort([*key, "rank"]).equals(again.routing_counts.sort([*key, "rank"]))
    assert not b.routing_counts.sort([*key, "rank"]).equals(a.routing_counts.sort([*key, "rank"]))


def test_racy_digest_is_dropped_once_settled(demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import orjson

    from ep_trace.parsers import cache_key

    out = tmp_path / "tables"
    ingest(demo, out)  # the copy is fresh: every input is racy
    man = out / "manifest.json"
    assert all("sha256" in e for e in orjson.loads(man.read_bytes())["inputs"])
    monkeypatch.setattr(cache_key, "RACY_NS", 0)  # (as if 2 s had passed)
    assert ingest(demo, out)[1] is True
    assert not any("sha256" in e for e in orjson.loads(man.read_bytes())["inputs"])
    assert ingest(demo, out)[1] is True


# --- the independent campaign's classes (tests/robustness/campaign.py, written by another branch) -----


def test_the_campaign_classes_of_these_checks_pass_one_case_each(tmp_path: Path) -> None:
    """One seeded case of each campaign class that the checks of issue 40 items 1, 2 and 4 keep.

    (``cache_stale`` is left out here: its trace variant reaches a what-if figure the invariants pass
    owns, a negative ``bound_full_overlap`` saving on a fresh analysis too, not a stale cache.)
    """
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import campaign
    import fuzz

    classes = sorted(campaign.NEEDS_PARSER_CHECKS - {"cache_stale"})
    result = fuzz.run_campaign(1, tmp_path, classes=classes, seed0=3, workers=1)
    assert result["violations"] == [], fuzz.table(result) + "\n" + json.dumps(result["violations"], indent=1)
    assert result["cases"] == len(classes)
