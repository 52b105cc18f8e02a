"""CPU of the parts of ``read_kineto_file`` that are not the slice decode, on one rank file.

Modes (each timed ``--repeat`` times in this process, 1 polars thread, after one warm-up read):

* ``post``   -- everything after ``kineto_columnar.decode_columnar`` (concat, times, duplicates,
  kinds, links, collectives, sort, conform): the decode runs once and its result is handed to
  every timed read (the kept args are only read, never changed);
* ``stream`` -- the streaming read alone (``kineto_stream.stream_pieces`` over the file's pieces);
* ``full``   -- a whole warm ``read_kineto_file``.

Prints the median and min CPU seconds (``time.process_time``). For a count that does not depend on
the machine's load, run it under callgrind with 1 and N+1 repeats and take the difference / N
(this VM has no hardware counter for ``perf stat -e instructions``)::

    POLARS_MAX_THREADS=1 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python benchmarks/post_decode_bench.py benchmarks/data/nccl1_50mb/rank0.pt.trace.json --repeat 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("POLARS_MAX_THREADS", "1")

from ep_trace.parsers import kineto, kineto_columnar, kineto_json, kineto_stream  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mode", choices=("post", "stream", "full"), default="post")
    args = ap.parse_args()
    path: Path = args.file
    if args.mode == "post":
        header, kept, frames = kineto_columnar.decode_columnar(path, kineto._chunk_frame, kineto.ARG_KEEP_PREFIXES)

        def cached(p: Path, chunk_frame: object, prefixes: object) -> tuple:
            return dict(header), kept, list(frames)

        kineto_columnar.decode_columnar = cached  # type: ignore[assignment]
    piece = max(1, kineto_json.CHUNK_BYTES // kineto_columnar._PARTS)

    def once() -> None:
        if args.mode == "stream":
            for _ in kineto_stream.stream_pieces(path, {}, piece_bytes=piece):
                pass
        else:
            kineto.read_kineto_file(path)

    once()
    times = []
    for _ in range(args.repeat):
        t = time.process_time()
        once()
        times.append(time.process_time() - t)
    print(
        f"{args.mode} {path.name} ({path.stat().st_size / 1e6:.1f} MB): median {statistics.median(times):.4f} "
        f"min {min(times):.4f} CPU-s over {args.repeat}"
    )


if __name__ == "__main__":
    main()
