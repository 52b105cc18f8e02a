"""Decoder table: JSON bytes per CPU-second of ep-trace's Kineto ingest vs plain JSON decoders.

Each contender decodes the same (uncompressed) rank file in a fresh subprocess, ``--repeat``
times; the median CPU time (``time.process_time``: user + system of all threads of the process,
so a multi-threaded reader pays for every thread) gives MB (1e6 bytes) per CPU-second:

* ``ep-trace``      -- ``ep_trace.parsers.kineto.read_kineto_file`` (all tables: events with links,
  collectives, ranks; the whole ingest of one rank), the first file this process reads;
* ``ep-trace-warm`` -- the same, timed on a second read of the file in the same process: the
  steady state of a directory of big ranks (the first read also pays one-off costs: the heap's
  first growth, polars' and the allocator's first use);
* ``ep-decode-warm`` -- only the per-file decode (``kineto._decode``: slices to column frames, the
  native scanner unless ``EP_TRACE_NATIVE=0``, no links / collectives / sort), on a second read;
* ``polars-read``   -- only the reader ep-trace's decode is built on: the file streamed in its
  ~256 KB ``traceEvents`` pieces and ``pl.read_json`` with its schema over each
  (``kineto_columnar._read``), no checks, no tables: the floor of ep-trace's own decode;
* ``orjson``        -- ``orjson.loads`` of the whole text (Python objects, nothing else);
* ``msgspec``       -- ``msgspec.json.decode`` untyped (Python objects);
* ``msgspec-typed`` -- ``msgspec.json.decode`` into typed ``Struct`` s of the 8 fields the parser uses;
* ``simdjson``      -- ``simdjson.Parser().parse`` (pysimdjson; the parse to its tape only, lazy
  objects: the tokenizer limit, no Python object per event).

The msgspec and simdjson contenders are not ep-trace dependencies: ``pip install 'ep-trace[bench]'``
(msgspec 0.22.0, pysimdjson 7.0.2) or leave them out with ``--modes``.

Usage::

    python benchmarks/make_large_traces.py --source ../shared/external/kineto/hta_nccl_metadata \\
        --ranks 1 --mb 50 --out benchmarks/data/nccl1_50mb
    python benchmarks/decoder_bench.py benchmarks/data/nccl1_50mb/rank0.pt.trace.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import sys, time
mode, path = sys.argv[1], sys.argv[2]
from pathlib import Path
raw = Path(path).read_bytes()
if mode in ("ep-trace", "ep-trace-warm"):
    from ep_trace.parsers.kineto import read_kineto_file
    if mode == "ep-trace-warm":
        read_kineto_file(path)
    t = time.process_time(); read_kineto_file(path); dt = time.process_time() - t
elif mode == "ep-decode-warm":
    from ep_trace.parsers import kineto
    kineto._decode(Path(path))
    t = time.process_time(); kineto._decode(Path(path)); dt = time.process_time() - t
elif mode == "polars-read":
    from ep_trace.parsers import kineto_columnar, kineto_json, kineto_stream
    piece = kineto_json.CHUNK_BYTES // kineto_columnar._PARTS
    t = time.process_time()
    for sl in kineto_stream.stream_pieces(Path(path), {}, piece_bytes=piece):
        kineto_columnar._read(sl)
    dt = time.process_time() - t
elif mode == "orjson":
    import orjson
    t = time.process_time(); orjson.loads(raw); dt = time.process_time() - t
elif mode == "msgspec":
    import msgspec
    t = time.process_time(); msgspec.json.decode(raw); dt = time.process_time() - t
elif mode == "msgspec-typed":
    import msgspec
    from typing import Optional, Union
    Num = Union[int, float, None]
    class Args(msgspec.Struct):
        correlation: Num = None
        bytes: Num = None
    class Ev(msgspec.Struct):
        ph: Optional[str] = None
        cat: Optional[str] = None
        name: Union[str, int, float, None] = None
        pid: Union[int, str, None] = None
        tid: Union[int, str, None] = None
        ts: Num = None
        dur: Num = None
        args: Optional[Args] = None
    class Doc(msgspec.Struct):
        traceEvents: list[Ev]
    dec = msgspec.json.Decoder(Doc)
    t = time.process_time(); dec.decode(raw); dt = time.process_time() - t
elif mode == "simdjson":
    import simdjson
    p = simdjson.Parser()
    t = time.process_time(); doc = p.parse(raw); dt = time.process_time() - t
print(dt)
"""

MODES = ("orjson", "ep-trace", "ep-trace-warm", "ep-decode-warm", "polars-read", "msgspec", "msgspec-typed", "simdjson")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument(
        "--polars-threads",
        type=int,
        default=1,
        help="POLARS_MAX_THREADS of the child (default 1: what `ep-trace ingest|analyze --jobs 1` gives polars,"
        " parsers/polars_threads.py; 0: polars' default, every CPU)",
    )
    args = ap.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k != "POLARS_MAX_THREADS"}
    if args.polars_threads > 0:
        env["POLARS_MAX_THREADS"] = str(args.polars_threads)
    size = args.file.stat().st_size
    print(
        f"{args.file}: {size / 1e6:.1f} MB; polars threads {args.polars_threads or 'default'}; load {os.getloadavg()}"
    )
    base = None
    for mode in args.modes:
        cpu = []
        for _ in range(args.repeat):
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, mode, str(args.file)],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            cpu.append(float(out.stdout.strip().splitlines()[-1]))
        med = statistics.median(cpu)
        base = med if mode == "orjson" else base
        rel = f"{med / base:.2f}x orjson" if base else ""
        print(f"| {mode} | {med:.3f} | {size / 1e6 / med:.0f} | {rel} |", flush=True)


if __name__ == "__main__":
    main()
