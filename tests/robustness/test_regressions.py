"""One regression test per failure class of issue 12 (bad input, faults, interruption).

Each test builds the exact input that used to give a wrong number, a traceback, a blow-up or a
hang, and pins the one-line error (word for word where the text is ours) or the corrected result.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import ep_trace
from ep_trace.errors import EpTraceError, RankConflictError, ResourceLimitError, TraceFormatError
from ep_trace.parsers import read_trace_dir, validate
from ep_trace.parsers.parquet_io import ingest, output_lock, read_parquet

ROOT = Path(__file__).resolve().parents[2]
BALANCED = ROOT / "sample_traces" / "balanced"
BASE = 1_700_000_000_000_000_000


def write_trace(path: Path, events: list[dict[str, Any]], **header: Any) -> Path:
    doc: dict[str, Any] = {"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}}
    doc.update(header)
    doc["traceEvents"] = events
    doc.setdefault("baseTimeNanoseconds", BASE)
    text = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(text) if path.name.endswith(".gz") else text)
    return path


def x(name: str, ts: Any, dur: Any, **kw: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, **kw}


def steps(n: int = 2) -> list[dict[str, Any]]:
    return [x(f"ProfilerStep#{i}", 1000 * i, 900) for i in range(n)] + [
        x("aten::mm", 1000 * i + 10, 500) for i in range(n)
    ]


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    d = tmp_path / "demo"
    shutil.copytree(BALANCED, d, ignore=shutil.ignore_patterns("README.md"))
    return d


def rewrite_sidecar(p: Path, fn: Any) -> None:
    recs = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    fn(recs)
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))


def meta_of(recs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in recs if r["type"] == "meta")


# --- silent wrong answers --------------------------------------------------------------------


def test_sidecar_of_another_run_is_an_error_naming_both_files(demo: Path) -> None:
    sc = demo / "rank2.ep.jsonl"
    rewrite_sidecar(sc, lambda recs: meta_of(recs).update(job_id="other-run"))
    trace = demo / "rank2.pt.trace.json.gz"
    with pytest.raises(RankConflictError) as exc:
        read_trace_dir(demo)
    assert str(exc.value) == (
        f"{sc}: sidecar job id 'other-run' differs from its trace {trace} ('b27ef6dbaedb45d39ebcd7d6b4a88446'); "
        "the sidecar is from another run: remove it or re-capture (--keep-going leaves it out)"
    )
    t = read_trace_dir(demo, on_error="skip")  # --keep-going: the sidecar is left out and named
    left_out = [i for i in t.load_report if i.level == "error"]
    assert [(i.file, i.rank) for i in left_out] == [(str(sc), 2)]
    assert left_out[0].message.startswith("sidecar left out: ")
    assert t.ranks.filter(pl.col("rank") == 2)["has_sidecar"].to_list() == [False]


def test_sidecar_world_size_mismatch(demo: Path) -> None:
    rewrite_sidecar(demo / "rank1.ep.jsonl", lambda recs: meta_of(recs).update(world_size=8))
    with pytest.raises(RankConflictError, match=r"rank1.ep.jsonl: sidecar world size '8' differs from its trace"):
        read_trace_dir(demo)


def test_killed_rerun_sidecar_outside_the_trace_window(demo: Path) -> None:
    """A rerun killed early leaves new sidecars beside the old finished trace: days apart."""

    def shift(recs: list[dict[str, Any]]) -> None:
        meta_of(recs).pop("job_id")
        for r in recs:
            if "start_ns" in r:
                r["start_ns"] += 3 * 86_400 * 10**9
                r["end_ns"] += 3 * 86_400 * 10**9

    rewrite_sidecar(demo / "rank0.ep.jsonl", shift)
    with pytest.raises(RankConflictError, match=r"rank0.ep.jsonl: sidecar records \(\d+\.\.\d+ ns\) lie outside"):
        read_trace_dir(demo)


def test_missing_base_time_on_one_rank(tmp_path: Path) -> None:
    write_trace(tmp_path / "rank0.json", steps())
    doc = {"distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2}, "traceEvents": steps()}
    (tmp_path / "rank1.json").write_text(json.dumps(doc))  # relative ts, no baseTimeNanoseconds
    with pytest.raises(RankConflictError) as exc:
        read_trace_dir(tmp_path)
    assert str(exc.value) == (
        f"{tmp_path / 'rank0.json'} (rank 0) starts 19,675.9 days after {tmp_path / 'rank1.json'} (rank 1); "
        "one of them has a missing or shifted baseTimeNanoseconds or is from another job: fix or remove it "
        "(--keep-going does not mix clocks)"
    )


@pytest.mark.parametrize("base", [2**63 - 1000, 2**63 - 10**15, -(2**62) - 5])
def test_times_near_int64_limits_are_refused(tmp_path: Path, base: int) -> None:
    p = write_trace(tmp_path / "rank0.json", steps(), baseTimeNanoseconds=base)
    with pytest.raises(TraceFormatError, match="time out of range|negative duration|timestamp out of range"):
        read_trace_dir(p)


def test_63_year_duration(tmp_path: Path) -> None:
    p = write_trace(tmp_path / "rank0.json", steps() + [x("aten::long", 100, 2.0e15)])
    with pytest.raises(TraceFormatError) as exc:
        read_trace_dir(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}: event 4: events span 23,148.1 days (more than 7 days); this one lies outside")
    assert msg.endswith("its ts / dur or the file's baseTimeNanoseconds is corrupt; re-export the trace")


@pytest.mark.parametrize("ts", [True, "12", [1], {"a": 1}])
def test_ts_of_the_wrong_type(tmp_path: Path, ts: Any) -> None:
    p = write_trace(tmp_path / "rank0.json", steps() + [x("aten::odd", ts, 5)])
    with pytest.raises(TraceFormatError, match=r"traceEvents\[4\]"):
        read_trace_dir(p)


def test_negative_rank(tmp_path: Path) -> None:
    p = write_trace(tmp_path / "t.json", steps(), distributedInfo={"rank": -1, "world_size": 2})
    with pytest.raises(TraceFormatError) as exc:
        read_trace_dir(p)
    assert str(exc.value) == (
        f"{p}: ranks[0]: rank -1 is outside [0, 1048576); the rank metadata is corrupt or from another job; "
        "pass rank_map to set the rank"
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda r: r["type"] == "routing" and r["expert_counts"].__setitem__(3, -7),
            r"line 2: 'expert_counts' holds a negative value \(-7\)",
        ),
        (
            lambda r: r["type"] == "a2a" and r["direction"] == "dispatch" and r["send_splits"].__setitem__(1, -2),
            r"line 4: 'send_splits' holds a negative value \(-2\)",
        ),
        (
            lambda r: r["type"] == "meta" and r.__setitem__("placement", [[0], [9]] + r["placement"][2:]),
            r"meta: 'placement\[1\]' holds 9, outside \[0, 4\)",
        ),
    ],
    ids=["negative_counts", "negative_splits", "placement_beyond_world"],
)
def test_sidecar_values_out_of_range(demo: Path, edit: Any, message: str) -> None:
    def fn(recs: list[dict[str, Any]]) -> None:
        for r in recs:
            edit(r)

    sc = demo / "rank1.ep.jsonl"
    rewrite_sidecar(sc, fn)
    with pytest.raises(TraceFormatError, match=message) as exc:
        read_trace_dir(demo)
    assert str(exc.value).startswith(f"{sc}: ")


def test_duplicated_events_are_dropped_and_counted(tmp_path: Path) -> None:
    evs = steps(2) + [x("aten::mm", 20, 100)] * 51  # one span and 50 copies
    p = write_trace(tmp_path / "rank0.json", evs)
    t = read_trace_dir(p)
    assert t.events.filter(pl.col("name") == "aten::mm").height == 3  # two distinct + one of the copies
    dup = [i.message for i in t.load_report if "duplicate" in i.message]
    assert dup == [
        "50 duplicate events (same rank, name, stream, start and end) dropped; their time would have been counted twice"
    ]


def test_duplicates_in_a_demo_trace_keep_waits_within_the_step(demo: Path) -> None:
    p = demo / "rank1.pt.trace.json.gz"
    doc = json.loads(gzip.decompress(p.read_bytes()))
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    doc["traceEvents"] += [dict(e) for e in xs[:50]]
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    s = ep_trace.load(demo).summary()
    for r in s["ranks"]:
        assert 0 <= r["barrier_wait_ns"] <= r["step_time_ns"]


def test_trace_path_that_is_a_directory(demo: Path) -> None:
    victim = demo / "rank3.pt.trace.json.gz"
    victim.unlink()
    victim.mkdir()
    with pytest.raises(TraceFormatError) as exc:
        read_trace_dir(demo)
    assert (
        str(exc.value)
        == f"{victim}: is a directory, not a regular file; pass the trace file itself (--keep-going skips it)"
    )
    t = read_trace_dir(demo, on_error="skip")
    assert [(i.file, i.level) for i in t.load_report if i.level == "error"] == [(str(victim), "error")]


# --- tracebacks that became one-line errors ----------------------------------------------------


@pytest.mark.parametrize(
    "event",
    [
        x("c10d::allreduce_", 10, 5, args=[1, 2]),
        x("aten::mm", 10, 5, args="text"),
        x("aten::mm", 10, 5, pid=2**70),
        x("aten::mm", 10, 5, args={"correlation": "abc"}),
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "ts": 10,
            "dur": 5,
            "pid": 2**40,
            "tid": 7,
            "args": {"device": 2**40},
        },
    ],
    ids=["args_list", "args_text", "pid_beyond_int64", "text_for_number", "device_beyond_int32"],
)
def test_odd_values_give_our_error(tmp_path: Path, event: dict[str, Any]) -> None:
    p = write_trace(tmp_path / "rank0.json", steps() + [event])
    try:
        read_trace_dir(p)
    except EpTraceError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(p))


@pytest.mark.parametrize(
    "header",
    [
        {"distributedInfo": {"rank": 2**40, "world_size": 2}},
        {"distributedInfo": {"rank": 0, "world_size": 2**40}},
        {"distributedInfo": {"rank": 0, "world_size": 0}},
        {"baseTimeNanoseconds": 2**70},
        {"baseTimeNanoseconds": "soon"},
    ],
)
def test_header_values_beyond_their_type(tmp_path: Path, header: dict[str, Any]) -> None:
    p = write_trace(tmp_path / "rank0.json", steps(), **header)
    with pytest.raises(EpTraceError) as exc:
        read_trace_dir(p)
    assert "\n" not in str(exc.value) and str(exc.value).startswith(str(p))


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: r.__setitem__("expert_counts", "many") if r["type"] == "routing" else None,
        lambda r: r.__setitem__("send_splits", {"a": 1}) if r["type"] == "a2a" else None,
        lambda r: r.__setitem__("world_size", "four") if r["type"] == "meta" else None,
        lambda r: r.__setitem__("start_ns", "now") if r["type"] == "a2a" else None,
    ],
    ids=["counts_text", "splits_object", "world_size_text", "start_text"],
)
def test_sidecar_fields_of_the_wrong_type(demo: Path, edit: Any) -> None:
    sc = demo / "rank0.ep.jsonl"
    rewrite_sidecar(sc, lambda recs: [edit(r) for r in recs])
    try:
        t = read_trace_dir(demo)
    except EpTraceError as exc:
        assert "\n" not in str(exc)
    else:  # a field the merge does not use may pass; the numbers must still be valid
        t.validate()
    t = read_trace_dir(demo, on_error="skip")  # never a traceback with --keep-going
    assert t.ranks.height == 4


def _nsys_copy(tmp_path: Path) -> Path:
    src = ROOT.parent / "shared" / "external" / "nsys" / "flameox" / "nsight-2025.5.2.sqlite"
    if not src.exists():
        pytest.skip("../shared/external is not beside the checkout")
    dst = tmp_path / "run.sqlite"
    shutil.copy(src, dst)
    return dst


def test_nsys_duplicate_string_ids(tmp_path: Path) -> None:
    import sqlite3

    db = _nsys_copy(tmp_path)
    con = sqlite3.connect(db)
    con.executescript(
        "CREATE TABLE S2 AS SELECT * FROM StringIds; DROP TABLE StringIds;"
        "CREATE TABLE StringIds (id INTEGER, value TEXT); INSERT INTO StringIds SELECT * FROM S2;"
        "INSERT INTO StringIds SELECT id, value || '_dup' FROM S2 WHERE id = (SELECT min(id) FROM S2);"
    )
    con.commit()
    con.close()
    with pytest.raises(TraceFormatError, match=r"run.sqlite: StringIds: id \d+ appears 2 times; the export is corrupt"):
        read_trace_dir(db)


def test_nsys_huge_string_is_refused_before_the_join(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    monkeypatch.setenv("EP_TRACE_MAX_STRING_BYTES", "4096")
    db = _nsys_copy(tmp_path)
    con = sqlite3.connect(db)
    con.execute("UPDATE StringIds SET value = ? WHERE id = (SELECT min(id) FROM StringIds)", ("s" * 5000,))
    con.commit()
    con.close()
    with pytest.raises(
        ResourceLimitError,
        match=r"StringIds: string id \d+ is 5,000 bytes long \(cap 4,096\); set EP_TRACE_MAX_STRING_BYTES=10000",
    ):
        read_trace_dir(db)


@pytest.mark.parametrize("kind", ["bad_utf8", "text_for_number", "missing_column"])
def test_nsys_odd_content(tmp_path: Path, kind: str) -> None:
    import sqlite3

    db = _nsys_copy(tmp_path)
    con = sqlite3.connect(db)
    if kind == "bad_utf8":
        con.execute("UPDATE StringIds SET value = CAST(X'FFFE80C3' AS TEXT)")
    elif kind == "text_for_number":
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'abc' WHERE rowid = 1")
    else:
        con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN gridX")
    con.commit()
    con.close()
    try:
        read_trace_dir(db)
    except EpTraceError as exc:
        assert "\n" not in str(exc)


def test_damaged_ingest_cache_is_rebuilt(tmp_path: Path) -> None:
    out = tmp_path / "tables"
    first, cached = ingest(BALANCED, out)
    assert not cached
    ev = out / "events" / "part-000000.parquet"  # partitioned layout (docs/scale.md)
    ev.write_bytes(ev.read_bytes()[: ev.stat().st_size // 2])  # damaged, manifest still matching
    again, cached = ingest(BALANCED, out)
    assert not cached and again.events.height == first.events.height
    assert read_parquet(out).events.height == first.events.height


def test_damaged_parquet_input_is_our_error(tmp_path: Path) -> None:
    out = tmp_path / "tables"
    ingest(BALANCED, out)
    rc = out / "routing_counts" / "part-000000.parquet"  # partitioned layout (docs/scale.md)
    pl.read_parquet(rc).with_columns(pl.lit(-3, pl.Int64).alias("count")).write_parquet(rc)
    with pytest.raises(TraceFormatError, match=r"routing_counts\[0\]: negative expert count"):
        read_parquet(out)
    (out / "ranks" / "part-000000.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(TraceFormatError, match=r"ranks/part-000000.parquet: damaged Parquet file"):
        read_parquet(out)


# --- OS errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dangling", "loop", "fifo", "devzero", "sidecar_dir"])
def test_os_level_inputs_are_refused_before_reading(demo: Path, kind: str) -> None:
    victim = demo / ("rank1.ep.jsonl" if kind == "sidecar_dir" else "rank1.pt.trace.json.gz")
    victim.unlink()
    expected = {
        "dangling": f"{victim}: dangling symlink ('{demo / 'gone.json.gz'}'); point the link at the trace file or remove it",
        "loop": f"{victim}: symlink loop; point the link at a real file or remove it",
        "fifo": f"{victim}: is a FIFO (named pipe), not a regular file; pass the trace file itself (--keep-going skips it)",
        "devzero": f"{victim}: is a character device, not a regular file; pass the trace file itself (--keep-going skips it)",
        "sidecar_dir": f"{victim}: is a directory, not a regular file; pass the trace file itself (--keep-going skips it)",
    }[kind]
    if kind == "dangling":
        victim.symlink_to(demo / "gone.json.gz")
    elif kind == "loop":
        victim.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(victim)
    elif kind == "devzero":
        victim.symlink_to("/dev/zero")
    else:
        victim.mkdir()
    with pytest.raises(TraceFormatError) as exc:
        read_trace_dir(demo)
    assert str(exc.value).replace("dangling symlink (to ", "dangling symlink (") == expected
    t = read_trace_dir(demo, on_error="skip")  # --keep-going: skipped and named, whatever the cause
    assert str(victim) in [i.file for i in t.load_report if i.level == "error"]


@pytest.mark.parametrize("err", [errno.EACCES, errno.EIO])
def test_permission_denied_and_eio_while_reading(demo: Path, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    victim = demo / "rank2.pt.trace.json.gz"
    real_open = open

    def failing_open(file: Any, *a: Any, **k: Any) -> Any:
        if str(file) == str(victim):
            raise OSError(err, os.strerror(err), str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr("builtins.open", failing_open)

    def read_bytes(self: Path) -> bytes:
        with failing_open(self, "rb") as fh:
            return fh.read()

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.raises(TraceFormatError) as exc:
        read_trace_dir(demo)
    assert str(exc.value).startswith(f"{victim}: cannot read ({os.strerror(err)}, errno {err}); ")
    t = read_trace_dir(demo, on_error="skip")
    assert [i.file for i in t.load_report if i.level == "error"] == [str(victim)]


def test_permission_check_before_reading(demo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = demo / "rank0.pt.trace.json.gz"
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(victim) else real(p, mode))
    with pytest.raises(TraceFormatError) as exc:
        validate.check_input_path(victim)
    assert str(exc.value) == (
        f"{victim}: cannot read (Permission denied, errno 13); check the file's permissions (chmod) or run as its owner; "
        "--keep-going skips it"
    )


# --- resources ----------------------------------------------------------------------------------


def test_gzip_bomb_is_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EP_TRACE_MAX_INFLATE_BYTES", str(8 << 20))
    p = tmp_path / "rank0.pt.trace.json.gz"
    text = json.dumps({"traceEvents": steps()}).encode()
    p.write_bytes(gzip.compress(text[:-1] + b" " * (32 << 20) + b"}"))
    with pytest.raises(ResourceLimitError) as exc:
        read_trace_dir(p)
    assert str(exc.value) == (
        f"{p}: decompresses to more than 8,388,608 bytes (cap: 20x the compressed size, at most 4 GiB); "
        "if the trace is genuine, set EP_TRACE_MAX_INFLATE_BYTES=8589934592 (bytes) to raise the cap"
    )


def test_inflate_limit_default() -> None:
    assert validate.inflate_limit(BALANCED / "rank0.pt.trace.json.gz") == 256 << 20  # floor for small files


def test_deeply_nested_name(tmp_path: Path) -> None:
    p = write_trace(tmp_path / "rank0.json", steps() + [x("__NEST__", 10, 5)])
    p.write_text(p.read_text().replace('"__NEST__"', "[" * 1000 + "]" * 1000))  # (json.dumps stops at ~990)
    with pytest.raises(TraceFormatError) as exc:
        read_trace_dir(p)
    assert str(exc.value) == (  # (the JSON guard refuses it before any decoder: issue 40)
        f"{p}: byte 566: JSON nested more than 64 levels deep; the file is damaged or not a trace; if it is genuine, "
        "set EP_TRACE_MAX_JSON_DEPTH=128 (at most 200) to raise the cap (--keep-going skips it)"
    )


def test_long_host_name_is_shortened_in_report_and_summary(demo: Path, tmp_path: Path) -> None:
    from ep_trace.cli.outputs import DISPLAY_CHARS, for_display

    p = demo / "rank0.pt.trace.json.gz"
    doc = json.loads(gzip.decompress(p.read_bytes()))
    doc["host_name"] = "h" * 300_000
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    a = ep_trace.load(demo)
    assert a.tables.ranks["host"].str.len_chars().max() == 300_000  # the tables keep the full name
    shown = for_display(a)
    assert shown.tables.ranks["host"].str.len_chars().max() == DISPLAY_CHARS
    assert max(len(json.dumps(shown.summary())), 0) < 200_000
    assert "…" in shown.tables.ranks["host"][0]


def test_overlong_decoded_string_is_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EP_TRACE_MAX_STRING_BYTES", "1000")
    p = write_trace(tmp_path / "rank0.json", steps() + [x("k" * 2000, 10, 5)])
    with pytest.raises(
        ResourceLimitError, match=r"name is 2,000 bytes long \(cap 1,000\); set EP_TRACE_MAX_STRING_BYTES=4000"
    ):
        read_trace_dir(p)


# --- outputs ----------------------------------------------------------------------------------


def test_second_writer_waits_then_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "tables"
    monkeypatch.setenv("EP_TRACE_LOCK_TIMEOUT", "0.3")
    with output_lock(out):
        with pytest.raises(EpTraceError) as exc:
            ingest(BALANCED, out)
    assert str(exc.value) == (
        f"{out}: another ep-trace process is writing this directory (lock {out / '.ep-trace.lock'} held for 0 s); "
        "wait for it to finish or choose another -o"
    )
    tables, cached = ingest(BALANCED, out)  # released: works, and leaves no lock file behind
    assert not cached and not (out / ".ep-trace.lock").exists()


def test_interrupted_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ep_trace.cli import outputs

    target = tmp_path / "summary.json"
    target.write_text("old")

    def boom(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        outputs.write_atomic(target, b"new" * 1000)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_cupti_record_a_month_away_is_refused(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import attacks

    (tmp_path / "a").mkdir()
    good = attacks.write_cupti(tmp_path / "a")
    ev = pl.read_parquet(good)
    assert read_trace_dir(good).events.height == ev.height  # the golden file reads
    (tmp_path / "b").mkdir()
    shifted = ev.with_columns(
        pl.when(pl.int_range(pl.len()) == 3).then(pl.col(c) + 30 * 86_400 * 10**9).otherwise(pl.col(c)).alias(c)
        for c in ("start_ns", "end_ns")
    )
    bad = attacks.write_cupti(tmp_path / "b", shifted)
    with pytest.raises(TraceFormatError, match=r"rank0.ep-events.parquet: event \d+: events span 30.0 days"):
        read_trace_dir(bad)
