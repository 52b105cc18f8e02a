"""How often the native slice scanner (``ep_trace.parsers._kscan``) gives up, per Kineto file.

Each file is cut into the slices and pieces ingest uses (``kineto_stream.stream_pieces``, the
default slice size) and every slice is scanned; a slice the scanner gives up on is decoded by the
slower paths, so on real traces this should print 0 everywhere. Prints one line per file (slices
given up / slices, and the reasons) and the totals.

Usage::

    python benchmarks/native_bails.py ../shared/external/kineto sample_traces benchmarks/data/nccl1_50mb
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

from ep_trace.parsers import kineto, kineto_columnar, kineto_json, kineto_native, kineto_stream


def _files(roots: list[Path]) -> list[Path]:
    out: list[Path] = []
    for r in roots:
        found = [r] if r.is_file() else sorted(r.rglob("*"))
        out += [f for f in found if f.is_file() and f.name.endswith((".json", ".json.gz"))]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path, help="Kineto files or directories (searched recursively)")
    args = ap.parse_args(argv)
    if not kineto_native.available():
        raise SystemExit("ep_trace.parsers._kscan is not built (pip install -e . with a C compiler)")
    from ep_trace.parsers import _kscan

    prefixes = tuple(p.encode() for p in kineto.ARG_KEEP_PREFIXES)
    piece = kineto_json.CHUNK_BYTES // kineto_columnar._PARTS
    slices = bails = 0
    for f in _files(args.paths):
        n, why = 0, collections.Counter[str]()
        try:
            for sl in kineto_stream.stream_pieces(f, {}, piece_bytes=piece):
                n += 1
                got = _kscan.scan(sl.pieces, prefixes)
                if isinstance(got, str):
                    why[got] += 1
        except kineto_stream.Fallback as exc:  # not streamable (not a Kineto trace): not the scanner's
            print(f"{f}: not streamed ({exc})")
            continue
        slices += n
        bails += sum(why.values())
        print(f"{sum(why.values())}/{n} {f} {dict(why) if why else ''}")
    print(f"total: {bails} of {slices} slices given up")


if __name__ == "__main__":
    main()
