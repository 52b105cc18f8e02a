"""Generate a many-rank Kineto directory by renumbering the ranks of a real small trace set.

Output rank ``r`` is source file ``r % n`` (default: the 8 ranks of
``../shared/external/kineto/param_dlrm_8rank``, 0.92 MB / 3,290 events each) with
``distributedInfo.rank = r`` and ``world_size = R``; the events are unchanged (so the per-rank cost
measured is the per-file fixed cost of small real files, not data volume). Files are gzip level 1,
named ``rank<r>.pt.trace.json.gz``. Output goes under ``benchmarks/data/`` (git-ignored).

Usage::

    python benchmarks/make_many_ranks.py --ranks 1024 --out benchmarks/data/dlrm1024
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import orjson

_DEFAULT_SRC = Path(__file__).resolve().parents[1].parent / "shared" / "external" / "kineto" / "param_dlrm_8rank"


def _load(path: Path) -> dict:
    raw = path.read_bytes()
    return orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=_DEFAULT_SRC)
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    sources = sorted(p for p in args.source.iterdir() if p.name.endswith((".json", ".json.gz")))
    docs = [_load(p) for p in sources]
    # the event array is the same bytes for every copy of a source: encode it once
    bodies = [orjson.dumps(d["traceEvents"]) for d in docs]
    args.out.mkdir(parents=True, exist_ok=True)
    for r in range(args.ranks):
        k = r % len(docs)
        head = {key: v for key, v in docs[k].items() if key != "traceEvents"}
        head["distributedInfo"] = dict(head.get("distributedInfo") or {}, rank=r, world_size=args.ranks)
        text = orjson.dumps(head)[:-1] + b',"traceEvents":' + bodies[k] + b"}"
        (args.out / f"rank{r}.pt.trace.json.gz").write_bytes(gzip.compress(text, compresslevel=1))
    print(f"{args.out}: {args.ranks} ranks from {len(docs)} files of {args.source}")


if __name__ == "__main__":
    main()
