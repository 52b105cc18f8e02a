"""Generate large, realistic Kineto trace directories by replicating real trace events.

Every source rank file (default: ``sample_traces/balanced``, the gloo demo; any Kineto directory
works, e.g. ``../shared/external/kineto/hta_nccl_metadata`` for NCCL/GPU events) is replicated
until its uncompressed JSON reaches ``--mb`` MB (the same number of copies on every rank): copy k of
the events is shifted by k x (the largest trace span of the source ranks + 1 ms) in time, and its ids (``External id``, ``correlation``, flow ``id``, ``Ev Idx``) by k x
(largest id + 1), so links stay one-to-one and ``ProfilerStep#N`` numbers keep increasing. Output
ranks 0..R-1 reuse source rank ``r % n_sources`` with ``distributedInfo.rank`` rewritten. The
header is written with ``"rank": r`` (with a space) so HTA's rank regex reads it. Output goes to
``benchmarks/data/`` (git-ignored).

Usage::

    python benchmarks/make_large_traces.py --ranks 8 --mb 100 --out benchmarks/data/large8
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

import orjson

_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _load(path: Path) -> dict:
    raw = path.read_bytes()
    return orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def span_us(doc: dict) -> float:
    """The document's trace span + 1 ms, µs: the time shift between two copies."""
    timed = [e for e in doc["traceEvents"] if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    return (t1 - t0) + 1000.0


def copies_for(doc: dict, target_bytes: int) -> int:
    """Copies of the document's events that make about ``target_bytes`` of JSON."""
    per_copy = sum(len(orjson.dumps(e)) + 2 for e in doc["traceEvents"])
    return max(1, -(-target_bytes // per_copy))


def replicate(doc: dict, rank: int, world: int, copies: int, span: float) -> bytes:
    """One rank's document, its events replicated ``copies`` times, copy k shifted by k x ``span`` µs.

    Every rank of a job takes the same ``span`` and ``copies`` (the largest over its source ranks): with
    each rank's own span, copy k of rank r's collectives drifts k x (span_r - span_s) from its peers' (the
    8 param_dlrm ranks replicated to 20 MB ended their matched calls 21 ms apart, which the clock check
    rightly refuses as calls paired with the wrong calls)."""
    events = doc["traceEvents"]
    ids = [
        v
        for e in events
        for v in ((e.get("args") or {}).get("External id"), (e.get("args") or {}).get("correlation"), e.get("id"))
        if isinstance(v, int)
    ]
    id_step = max(ids, default=0) + 1
    steps = [int(m.group(1)) for e in events if (m := _STEP.match(str(e.get("name", ""))))]
    step_step = (max(steps) - min(steps) + 1) if steps else 0
    header = {k: v for k, v in doc.items() if k not in ("traceEvents", "baseTimeNanoseconds", "traceName")}
    dist = dict(header.get("distributedInfo") or {})
    dist.update(rank=rank, world_size=world)
    header["distributedInfo"] = dist
    if isinstance(header.get("ep_trace"), dict):
        header["ep_trace"] = dict(header["ep_trace"], rank=rank, world_size=world)
    out = [json.dumps(header, indent=2)[:-2].encode(), b',\n  "traceEvents": [\n']
    first = True
    for k in range(copies):
        shift, dk = span * k, id_step * k
        for e in events:
            if k:
                e = dict(e)
                if "ts" in e and isinstance(e["ts"], (int, float)):
                    e["ts"] = round(e["ts"] + shift, 3)
                if isinstance(e.get("id"), int):
                    e["id"] += dk
                a = e.get("args")
                if a:
                    a = dict(a)
                    for key in ("External id", "correlation", "Ev Idx"):
                        if isinstance(a.get(key), int):
                            a[key] += dk
                    e["args"] = a
                m = _STEP.match(str(e.get("name", "")))
                if m:
                    e["name"] = f"ProfilerStep#{int(m.group(1)) + step_step * k}"
            out.append((b"" if first else b",\n") + b"  " + orjson.dumps(e))
            first = False
    tail = {"traceName": f"rank{rank}.pt.trace.json"}
    if "baseTimeNanoseconds" in doc:
        tail["baseTimeNanoseconds"] = doc["baseTimeNanoseconds"]
    out.append(b"\n  ],\n" + json.dumps(tail, indent=2)[2:].encode())
    return b"".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=Path(__file__).resolve().parents[1] / "sample_traces" / "balanced")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mb", type=float, default=100.0, help="uncompressed MB per rank file")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data" / "large8")
    ap.add_argument("--gzip", action="store_true", help="write .json.gz (level 1) instead of .json")
    args = ap.parse_args(argv)
    sources = sorted(p for p in args.source.iterdir() if p.name.endswith((".json", ".json.gz")))
    if not sources:
        raise SystemExit(f"{args.source}: no Kineto files")
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("rank*.pt.trace.json*"):
        old.unlink()
    docs = [_load(p) for p in sources]
    used = [docs[r % len(docs)] for r in range(args.ranks)]
    sources_used = docs[: min(len(docs), args.ranks)]  # each source once, however many ranks reuse it
    span = max(span_us(d) for d in sources_used)
    copies = max(copies_for(d, int(args.mb * 1e6)) for d in sources_used)
    for r in range(args.ranks):
        data = replicate(used[r], r, args.ranks, copies, span)
        name = f"rank{r}.pt.trace.json" + (".gz" if args.gzip else "")
        (args.out / name).write_bytes(gzip.compress(data, compresslevel=1) if args.gzip else data)
        print(f"{args.out / name}: {len(data) / 1e6:.1f} MB uncompressed")


if __name__ == "__main__":
    main()
