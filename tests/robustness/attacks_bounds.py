"""Mutations that attack the parsers' bounds (issue 40): deep nesting in a trace or a sidecar, gzip
bombs made of many small events under the inflate cap, NUL padding or a second document after the
trace, Nsight SQLite tables replaced by views over recursive CTEs.

Each ``fn(case_dir, rng) -> plan`` edits a copy of its source set in place (see :mod:`campaign`).
The expected outcome is a one-line error (or, for shapes the readers accept, sane numbers) within
the per-case time and memory caps.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import sqlite3
import threading
from pathlib import Path
from typing import Any

from attacks import load_doc, sidecars, traces, x_events

ANY: dict[str, Any] = {"mode": "load", "expect": "any"}
REFUSE: dict[str, Any] = {"mode": "load", "expect": "refuse"}


def nesting(d: Path, rng: random.Random) -> dict[str, Any]:
    """A timestamp / duration / arg nested 50 to 100,000 lists deep, in a trace or a sidecar."""
    depth = rng.choice([50, 1_000, 10_000, 100_000])
    nest = "[" * depth + "5" + "]" * depth
    if rng.random() < 0.7:
        p = rng.choice(traces(d))
        doc = load_doc(p)
        e = rng.choice(x_events(doc))
        key = rng.choice(["ts", "dur", "args"])
        e[key] = "__NEST__"
        text = json.dumps(doc).replace('"__NEST__"', nest)  # json.dumps stops at ~990 levels
        p.write_bytes(gzip.compress(text.encode(), compresslevel=1) if p.name.endswith(".gz") else text.encode())
    else:
        p = rng.choice(sidecars(d))
        lines = p.read_text().splitlines()
        i = rng.randrange(len(lines))
        rec = json.loads(lines[i])
        key = rng.choice([k for k in rec if k not in ("type", "v")] or ["type"])
        rec[key] = "__NEST__"
        lines[i] = json.dumps(rec).replace('"__NEST__"', nest)
        p.write_text("\n".join(lines) + "\n")
    return dict(ANY, variant=f"depth {depth}")


def _event_bomb(workdir: Path, n_events: int) -> bytes:
    """A gzip'd Kineto trace of ``n_events`` tiny identical-shape CPU ops (about 1,000:1), made once
    per campaign and size (the per-case copy is cheap)."""
    cache = workdir / f"_bomb_{n_events}.json.gz"
    if not cache.exists():  # (two lanes may build it at once: each writes its own temporary file)
        head = b'{"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": ['
        ev = b'{"ph":"X","cat":"cpu_op","name":"aten::add","pid":1,"tid":1,"ts":%d,"dur":1},'
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with gzip.open(tmp, "wb", compresslevel=9) as fh:
            fh.write(head)
            block = b"".join(ev % (i * 2) for i in range(10_000))  # the same ts pattern per block
            for _ in range(n_events // 10_000):
                fh.write(block)
            fh.write(b'{"ph":"X","cat":"cpu_op","name":"ProfilerStep#1","pid":1,"tid":1,"ts":0,"dur":99}]}')
        tmp.rename(cache)
    return cache.read_bytes()


def small_event_bomb(d: Path, rng: random.Random) -> dict[str, Any]:
    """One rank replaced by a gzip of 1 to 12 million small events (0.1 to 1 MB compressed, 80 MB to
    1 GB inflated): under a byte-ratio cap, over any memory budget unless bounded."""
    n = rng.choice([1_000_000, 4_000_000, 12_000_000])
    for p in list(d.iterdir()):  # one rank of one job
        p.unlink()
    (d / "rank0.pt.trace.json.gz").write_bytes(_event_bomb(d.parents[1], n))  # the campaign's workdir
    return dict(ANY, variant=f"{n} events")


def trailing_data(d: Path, rng: random.Random) -> dict[str, Any]:
    """A trace followed by NUL padding (a preallocated file), a second document or garbage: refused
    in linear time (110 KB of NULs in a .json.gz took 140 s: a quadratic scan)."""
    kind = rng.choice(["nul", "nul", "second_doc", "garbage"])
    p = rng.choice(traces(d))
    raw = gzip.decompress(p.read_bytes())
    if kind == "nul":
        tail = b"\0" * rng.choice([1, 4096, 110_000, 2_000_000])
    elif kind == "second_doc":
        tail = b'\n{"traceEvents": []}'
    else:
        tail = bytes(rng.randrange(256) for _ in range(rng.choice([1, 100, 10_000])))
        if not tail.strip(b" \t\r\n"):  # JSON whitespace after the document is valid JSON, not garbage
            tail = b"x" + tail
    data = raw + tail
    if rng.random() < 0.5:
        p.write_bytes(gzip.compress(data, compresslevel=1))
    else:
        p.unlink()
        p.with_name(p.name.removesuffix(".gz")).write_bytes(data)
    return dict(REFUSE, variant=f"{kind} {len(tail)} B")


_CTE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c)"


def sqlite_views(d: Path, rng: random.Random) -> dict[str, Any]:
    """An Nsight export whose ``StringIds``, ``CUPTI_ACTIVITY_KIND_RUNTIME`` or kernel table is a view:
    over a recursive CTE (endless rows, the file stays small), a cross join (a billion rows), or a
    plain copy (a view the readers may accept or refuse)."""
    db = next(d.glob("*.sqlite"))
    con = sqlite3.connect(db)
    table = rng.choice(["StringIds", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL"])
    kind = rng.choice(["recursive", "recursive", "cross_join", "copy"])
    cols = [c[1] for c in con.execute(f"PRAGMA table_info({table})")]
    con.execute(f"ALTER TABLE {table} RENAME TO _orig")
    if kind == "recursive":
        sel = ", ".join("x" if i == 0 else "1" for i in range(len(cols)))
        body = f"{_CTE} SELECT {sel} FROM c"
    elif kind == "cross_join":
        body = "SELECT a.* FROM _orig a, _orig b, _orig c"
    else:
        body = "SELECT * FROM _orig"
    con.execute(f"CREATE VIEW {table} ({', '.join(cols)}) AS {body}")
    con.commit()
    con.close()
    return dict(ANY, variant=f"{table} {kind}")
