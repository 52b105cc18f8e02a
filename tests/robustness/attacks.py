"""Seeded mutations of real trace sets (what an attacker or an unlucky user hands ep-trace).

Each mutation class is ``fn(case_dir, rng) -> None``: it edits a copy of a trace set in place.
:data:`CLASSES` maps the class name to ``(source set, fn)``; the source sets are
``sample_traces/balanced`` (demo: Kineto + sidecars), an external Kineto pair, an external Nsight
SQLite, ep-trace's CUPTI events file and an ingest output directory (Parquet). Used by the regression tests and the fuzz suite.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
EXTERNAL = ROOT.parent / "shared" / "external"
SOURCES = {
    "demo": SAMPLES / "balanced",
    "kineto_ext": EXTERNAL / "kineto" / "hta_torchrec_pair",
    "nsys_ext": EXTERNAL / "nsys" / "flameox",
}

Mutation = Callable[[Path, random.Random], None]


# --- helpers -----------------------------------------------------------------------------------


def traces(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.name.endswith((".json.gz", ".json")))


def sidecars(d: Path) -> list[Path]:
    return sorted(d.glob("rank*.ep.jsonl"))


def load_doc(p: Path) -> dict[str, Any]:
    raw = p.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def save_doc(p: Path, doc: Any) -> None:
    text = json.dumps(doc).encode()
    p.write_bytes(gzip.compress(text, compresslevel=1) if p.name.endswith(".gz") else text)


def edit_doc(d: Path, rng: random.Random, fn: Callable[[dict[str, Any], random.Random], None]) -> None:
    p = rng.choice(traces(d))
    doc = load_doc(p)
    fn(doc, rng)
    save_doc(p, doc)


def x_events(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]


def edit_sidecar(d: Path, rng: random.Random, fn: Callable[[list[dict[str, Any]], random.Random], None]) -> None:
    p = rng.choice(sidecars(d))
    recs = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    fn(recs, rng)
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))


WEIRD: list[Any] = [
    True,
    None,
    "x",
    "",
    [],
    {},
    [1, 2],
    {"a": 1},
    -1,
    0,
    2**31,
    2**63,
    2**64 + 5,
    -(2**63) - 1,
    1e308,
    -1e308,
    3.5,
    "12",
    "١٢",
    "\x1b[2J",
]


# --- Kineto ------------------------------------------------------------------------------------


def truncate(d: Path, rng: random.Random) -> None:
    p = rng.choice(traces(d))
    raw = p.read_bytes()
    p.write_bytes(raw[: rng.randrange(0, len(raw))])


def flip_compressed(d: Path, rng: random.Random) -> None:
    p = rng.choice(traces(d))
    raw = bytearray(p.read_bytes())
    for _ in range(rng.randint(1, 8)):
        raw[rng.randrange(len(raw))] = rng.randrange(256)
    p.write_bytes(bytes(raw))


def flip_json(d: Path, rng: random.Random) -> None:
    p = rng.choice(traces(d))
    raw = bytearray(gzip.decompress(p.read_bytes()))
    for _ in range(rng.randint(1, 16)):
        raw[rng.randrange(len(raw))] = rng.choice(b'{}[],:"0123456789-.eE \\ntrufalsn')
    p.write_bytes(gzip.compress(bytes(raw), compresslevel=1))


def event_field(d: Path, rng: random.Random) -> None:
    def fn(doc: dict[str, Any], rng: random.Random) -> None:
        for e in rng.sample(x_events(doc), k=rng.randint(1, 3)):
            key = rng.choice(["ts", "dur", "pid", "tid", "name", "cat", "args", "ph"])
            e[key] = rng.choice(WEIRD)

    edit_doc(d, rng, fn)


def event_args(d: Path, rng: random.Random) -> None:
    def fn(doc: dict[str, Any], rng: random.Random) -> None:
        evs = [e for e in x_events(doc) if isinstance(e.get("args"), dict)] or x_events(doc)
        for e in rng.sample(evs, k=min(len(evs), rng.randint(1, 4))):
            a = e.setdefault("args", {})
            if not isinstance(a, dict):
                continue
            key = rng.choice(
                ["correlation", "External id", "bytes", "In split size", "Out split size", "Group size", "Seq"]
                + list(a)
            )
            a[key] = rng.choice(WEIRD)

    edit_doc(d, rng, fn)


def time_extremes(d: Path, rng: random.Random) -> None:
    def fn(doc: dict[str, Any], rng: random.Random) -> None:
        e = rng.choice(x_events(doc))
        choice = rng.randrange(4)
        if choice == 0:
            e["dur"] = 2.0e15  # 63 years in µs
        elif choice == 1:
            e["ts"] = rng.choice([9.2e15, -9.0e15, 8.9e15, 1e12])
        elif choice == 2:
            doc["baseTimeNanoseconds"] = rng.choice([2**63 - 1, 2**63 - 10**12, -(2**62), 9 * 10**18])
        else:
            e["ts"] = e.get("ts", 0) + rng.choice([1, -1]) * 3.6e9 * 24 * 30  # a month away

    edit_doc(d, rng, fn)


def header(d: Path, rng: random.Random) -> None:
    def fn(doc: dict[str, Any], rng: random.Random) -> None:
        dist = doc.setdefault("distributedInfo", {})
        key = rng.choice(["rank", "world_size", "backend", "baseTimeNanoseconds", "pg_config", "ep_trace", "host"])
        if key == "baseTimeNanoseconds":
            if rng.random() < 0.5:
                doc.pop(key, None)  # one rank without base: relative ts next to epoch ranks
            else:
                doc[key] = rng.choice(WEIRD + [doc.get(key, 0) + 19 * 365 * 86_400 * 10**9])
        elif key == "ep_trace":
            doc["ep_trace"] = rng.choice(WEIRD + [{"job_id": "another-run"}])
        elif key == "host":
            doc["host_name"] = rng.choice(WEIRD)
        else:
            dist[key] = rng.choice(WEIRD)

    edit_doc(d, rng, fn)


def duplicate_events(d: Path, rng: random.Random) -> None:
    def fn(doc: dict[str, Any], rng: random.Random) -> None:
        xs = x_events(doc)
        doc["traceEvents"].extend(dict(e) for e in rng.choices(xs, k=rng.randint(1, 50)))

    edit_doc(d, rng, fn)


def shuffle_events(d: Path, rng: random.Random) -> None:
    edit_doc(d, rng, lambda doc, rng: rng.shuffle(doc["traceEvents"]))


def nested_name(d: Path, rng: random.Random) -> None:
    p = rng.choice(traces(d))
    doc = load_doc(p)
    depth = rng.choice([50, 500, 1000, 5000])
    e = rng.choice(x_events(doc))
    e[rng.choice(["name", "cat"])] = "__NEST__"
    text = json.dumps(doc).replace('"__NEST__"', "[" * depth + "]" * depth).encode()  # json.dumps stops at ~990
    p.write_bytes(gzip.compress(text, compresslevel=1) if p.name.endswith(".gz") else text)


def long_strings(d: Path, rng: random.Random) -> None:
    def fn(doc: dict[str, Any], rng: random.Random) -> None:
        n = rng.choice([5_000, 200_000, 2_000_000])
        if rng.random() < 0.5:
            doc["host_name"] = "h" * n
        else:
            rng.choice(x_events(doc))["name"] = "k" * n

    edit_doc(d, rng, fn)


def gzip_bomb(d: Path, rng: random.Random) -> None:
    p = rng.choice(traces(d))
    doc = load_doc(p)
    pad = " " * (rng.choice([300, 600]) << 20)  # whitespace: legal JSON, inflates ~1000x
    text = json.dumps(doc).encode()
    p.write_bytes(gzip.compress(text[:-1] + pad.encode() + text[-1:], compresslevel=9))


# --- sidecars ----------------------------------------------------------------------------------


def sidecar_identity(d: Path, rng: random.Random) -> None:
    def fn(recs: list[dict[str, Any]], rng: random.Random) -> None:
        meta = next(r for r in recs if r.get("type") == "meta")
        key = rng.choice(["job_id", "world_size", "rank", "time"])
        if key == "job_id":
            meta["job_id"] = "another-run-" + str(rng.randrange(1000))
        elif key == "world_size":
            meta["world_size"] = rng.choice([2, 8, 3])
        elif key == "rank":
            meta["rank"] = (meta.get("rank", 0) + 1) % 4
        else:
            for r in recs:
                if "start_ns" in r:
                    r["start_ns"] += 30 * 86_400 * 10**9
                    r["end_ns"] += 30 * 86_400 * 10**9

    edit_sidecar(d, rng, fn)


def sidecar_values(d: Path, rng: random.Random) -> None:
    def fn(recs: list[dict[str, Any]], rng: random.Random) -> None:
        for r in rng.sample(recs, k=min(len(recs), rng.randint(1, 4))):
            key = rng.choice([k for k in r if k not in ("type", "v")] or ["type"])
            v = r.get(key)
            if isinstance(v, list) and v and rng.random() < 0.6:
                i = rng.randrange(len(v))
                v[i] = rng.choice([-5, -(2**40), 2**63, 99, "x", None, [1]])
            else:
                r[key] = rng.choice(WEIRD)

    edit_sidecar(d, rng, fn)


def sidecar_bytes(d: Path, rng: random.Random) -> None:
    p = rng.choice(sidecars(d))
    raw = bytearray(p.read_bytes())
    if rng.random() < 0.5:
        raw = raw[: rng.randrange(len(raw))]
    else:
        for _ in range(rng.randint(1, 10)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
    p.write_bytes(bytes(raw))


# --- the filesystem ----------------------------------------------------------------------------


def filesystem(d: Path, rng: random.Random) -> None:
    kind = rng.choice(["dangling", "loop", "dir_trace", "dir_sidecar", "fifo", "devzero", "empty"])
    victim = rng.choice(traces(d)) if kind != "dir_sidecar" else rng.choice(sidecars(d))
    victim.unlink()
    if kind == "dangling":
        victim.symlink_to(d / "does-not-exist.json.gz")
    elif kind == "loop":
        victim.symlink_to(victim)
    elif kind in ("dir_trace", "dir_sidecar"):
        victim.mkdir()
    elif kind == "fifo":
        os.mkfifo(victim)
    elif kind == "devzero":
        victim.symlink_to("/dev/zero")
    else:
        victim.write_bytes(b"")


# --- Nsight SQLite -----------------------------------------------------------------------------


def _sqlite(d: Path) -> Path:
    return next(d.glob("*.sqlite"))


def nsys_strings(d: Path, rng: random.Random) -> None:
    con = sqlite3.connect(_sqlite(d))
    kind = rng.choice(["bad_utf8", "dup_id", "huge"])
    if kind == "bad_utf8":
        con.execute(
            "UPDATE StringIds SET value = CAST(X'FFFE80C3' AS TEXT) WHERE id IN (SELECT id FROM StringIds ORDER BY random() LIMIT 3)"
        )
    elif kind == "dup_id":
        con.execute("CREATE TABLE S2 AS SELECT * FROM StringIds")
        con.execute("DROP TABLE StringIds")
        con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
        con.execute("INSERT INTO StringIds SELECT * FROM S2")
        con.execute("INSERT INTO StringIds SELECT id, value || '_dup' FROM S2 LIMIT 5")
        con.execute("DROP TABLE S2")
    else:
        con.execute("UPDATE StringIds SET value = ? WHERE id = (SELECT min(id) FROM StringIds)", ("s" * (3 << 20),))
    con.commit()
    con.close()


def nsys_values(d: Path, rng: random.Random) -> None:
    con = sqlite3.connect(_sqlite(d))
    tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'CUPTI_%'")]
    t = rng.choice(tables)
    cols = [c[1] for c in con.execute(f"PRAGMA table_info({t})")]
    col = rng.choice(
        [
            c
            for c in cols
            if c
            in (
                "start",
                "end",
                "deviceId",
                "streamId",
                "correlationId",
                "globalPid",
                "shortName",
                "demangledName",
                "bytes",
            )
        ]
        or cols
    )
    val = rng.choice(["abc", -1, 2**63 - 1, -(2**63), 1e300, None, b"\xff\x00"])
    con.execute(
        f"UPDATE OR IGNORE {t} SET {col} = ? WHERE rowid IN (SELECT rowid FROM {t} ORDER BY random() LIMIT 3)", (val,)
    )
    con.commit()
    con.close()


def nsys_schema(d: Path, rng: random.Random) -> None:
    con = sqlite3.connect(_sqlite(d))
    tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    t = rng.choice([x for x in tables if x.startswith(("CUPTI_", "StringIds", "TARGET_INFO", "META", "PROCESSES"))])
    if rng.random() < 0.4:
        con.execute(f"DROP TABLE {t}")
    else:
        cols = [c[1] for c in con.execute(f"PRAGMA table_info({t})")]
        if len(cols) > 1:
            con.execute(f"ALTER TABLE {t} DROP COLUMN {rng.choice(cols)}")
    con.commit()
    con.close()


def nsys_bytes(d: Path, rng: random.Random) -> None:
    p = _sqlite(d)
    raw = bytearray(p.read_bytes())
    if rng.random() < 0.5:
        raw = raw[: rng.randrange(len(raw))]
    else:
        for _ in range(rng.randint(1, 20)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
    p.write_bytes(bytes(raw))


# --- Parquet (ingest output read back) ---------------------------------------------------------


def parquet_damage(d: Path, rng: random.Random) -> None:
    """``d`` holds an ingest output directory ``tables/``: damage one of its files."""
    import polars as pl

    t = d / "tables"
    victim = rng.choice(sorted(t.glob("*.parquet")) + [t / "load_report.json", t / "manifest.json"])
    kind = rng.choice(["truncate", "flip", "values"])
    if kind == "values" and victim.suffix == ".parquet":
        df = pl.read_parquet(victim)
        ints = [c for c, dt in df.schema.items() if dt.is_integer()]
        if df.height and ints:
            c = rng.choice(ints)
            lo = -1 if not dt_unsigned(df.schema[c]) else 0
            df = df.with_columns(
                pl.when(pl.int_range(pl.len()) == 0).then(pl.lit(lo)).otherwise(pl.col(c)).cast(df.schema[c]).alias(c)
            )
            df.write_parquet(victim)
            return
    raw = bytearray(victim.read_bytes())
    if kind == "truncate" or not raw:
        victim.write_bytes(bytes(raw[: rng.randrange(max(len(raw), 1))]))
    else:
        for _ in range(rng.randint(1, 10)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        victim.write_bytes(bytes(raw))


# --- CUPTI events files (ep-trace's own GPU capture format) -----------------------------------

CUPTI_META = {"rank": 0, "world_size": 2, "host": "gpu-node-1", "device": "cuda:0", "backend": "nccl", "job_id": "j"}


def write_cupti(d: Path, events: Any = None, meta: dict[str, Any] | None = None) -> Path:
    """``d/rank0.ep-events.parquet`` from the committed CUPTI golden records (tests/data/cupti)."""
    from ep_trace.capture.cupti.convert import records_to_events
    from ep_trace.capture.cupti.writer import EventsWriter

    if events is None:
        doc = json.loads((ROOT / "tests" / "data" / "cupti" / "moe_step_records.json").read_text())
        events = records_to_events(doc["records"], rank=0, ranges=doc["ranges"], clock_offset_ns=doc["clock_offset_ns"])
    w = EventsWriter(d / "rank0.ep-events.parquet", meta or CUPTI_META)
    w.write(events)
    return w.close(steps=1)


def cupti_values(d: Path, rng: random.Random) -> None:
    import polars as pl

    p = d / "rank0.ep-events.parquet"
    ev = pl.read_parquet(p)
    kind = rng.choice(["time", "dup", "name", "meta", "ids"])
    meta = dict(CUPTI_META)
    row = pl.int_range(pl.len()) == rng.randrange(ev.height)
    if kind == "time":
        # the writer refuses end < start: move both ends (a 63-year or clock-wrapping record)
        shift = rng.choice([2 * 10**18, -(2 * 10**18), 30 * 86_400 * 10**9, 2**62])
        ev = ev.with_columns(
            pl.when(row).then(pl.col(c) + shift).otherwise(pl.col(c)).alias(c) for c in ("start_ns", "end_ns")
        )
    elif kind == "dup":
        ev = pl.concat([ev, ev.sample(rng.randint(1, 20), with_replacement=True, seed=rng.randrange(1000))])
    elif kind == "name":
        ev = ev.with_columns(
            pl.when(row).then(pl.lit("n" * rng.choice([10, 2_000_000]))).otherwise(pl.col("name")).alias("name")
        )
    elif kind == "ids":
        col = rng.choice(["correlation", "device", "stream", "launch_id"])
        val = rng.choice([-1, None, 2**31 - 1])
        ev = ev.with_columns(pl.when(row).then(pl.lit(val)).otherwise(pl.col(col)).cast(ev.schema[col]).alias(col))
    else:
        meta[rng.choice(list(meta))] = rng.choice(WEIRD)
    p.unlink()
    write_cupti(d, ev, meta)


def cupti_bytes(d: Path, rng: random.Random) -> None:
    p = d / "rank0.ep-events.parquet"
    raw = bytearray(p.read_bytes())
    if rng.random() < 0.5:
        raw = raw[: rng.randrange(len(raw))]
    else:
        for _ in range(rng.randint(1, 10)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
    p.write_bytes(bytes(raw))


def dt_unsigned(dt: Any) -> bool:
    return str(dt).startswith("UInt")


CLASSES: dict[str, tuple[str, Mutation]] = {
    "truncate": ("demo", truncate),
    "flip_compressed": ("demo", flip_compressed),
    "flip_json": ("demo", flip_json),
    "event_field": ("demo", event_field),
    "event_args": ("kineto_ext", event_args),
    "time_extremes": ("demo", time_extremes),
    "header": ("demo", header),
    "duplicate_events": ("demo", duplicate_events),
    "shuffle_events": ("kineto_ext", shuffle_events),
    "nested_name": ("demo", nested_name),
    "long_strings": ("demo", long_strings),
    "gzip_bomb": ("demo", gzip_bomb),
    "sidecar_identity": ("demo", sidecar_identity),
    "sidecar_values": ("demo", sidecar_values),
    "sidecar_bytes": ("demo", sidecar_bytes),
    "filesystem": ("demo", filesystem),
    "nsys_strings": ("nsys_ext", nsys_strings),
    "nsys_values": ("nsys_ext", nsys_values),
    "nsys_schema": ("nsys_ext", nsys_schema),
    "nsys_bytes": ("nsys_ext", nsys_bytes),
    "parquet_damage": ("parquet", parquet_damage),
    "cupti_values": ("cupti", cupti_values),
    "cupti_bytes": ("cupti", cupti_bytes),
}
