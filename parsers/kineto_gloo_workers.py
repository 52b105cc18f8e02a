"""gloo worker ranges -> the collective calls they carry out (a CPU backend launches no kernel).

ProcessGroupGloo runs a call's transfer on its worker threads (torch 2.x: the ``gloo:*`` ranges of
``kind = comm_worker``); the caller thread holds the ``c10d::*`` op. Each range is paired, per file
and collective family, with the issued calls that launched no kernel (see :func:`pair_workers`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from ep_trace.parsers.collective_names import normalise_collective
from ep_trace.parsers.kineto_coll_fields import FILE, CallRows, fields_from
from ep_trace.parsers.splits import prod

if TYPE_CHECKING:
    from ep_trace.parsers.kineto_collectives import FileContext

__all__ = ["pair_workers"]


#: How far down the queue of issued calls a gloo worker range may be paired out of order.
#: ProcessGroupGloo runs async work on 2 worker threads (torch default) that pop one FIFO queue, so
#: two calls issued back to back can start within microseconds of each other on different threads,
#: in either order (seen in the chunked demo under load: a 2 ms dispatch and a 20 ms combine both
#: starting at the same microsecond); order alone then pairs them crosswise.
_REORDER_WINDOW = 4


def _worker_nelems(args: dict[str, Any] | None) -> int | None:
    """Elements of a gloo worker range's input tensor (its ``Input Dims``, record_shapes=True)."""
    dims = (args or {}).get("Input Dims") or []
    return prod(dims[0]) if dims and isinstance(dims[0], list) and dims[0] else None


def pair_workers(
    ev: pl.DataFrame,
    rows: CallRows,
    with_kernels: set[int],
    members: pl.DataFrame,
    files: Sequence[FileContext],
) -> pl.DataFrame:
    """Pair gloo worker ranges with the calls that launched no kernel: in start order per file and
    family, each with the first of the next :data:`_REORDER_WINDOW` issued calls whose input size
    equals the range's ``Input Dims`` (the oldest call when sizes are unknown or none agrees).

    One pass over column lists (the queue of issued calls makes each step depend on the previous)."""
    workers = ev.select(FILE, "event_id", "name", "start_ns").filter(ev.get_column("kind") == "comm_worker")
    if workers.height == 0:
        return members
    fam = {"all_to_allv": "all_to_all"}
    family: dict[str, str] = {}  # worker / call name -> family, memoised (few distinct names)
    in_nelems = [rows.field(i, "in_nelems") for i in range(len(rows.sig))]
    # the calls a worker may carry out, by file, in call order (one pass over the calls, not one per file)
    issued: dict[int, list[int]] = {}
    for i in range(len(rows.sig)):
        if i not in with_kernels and rows.field(i, "backend") != "nccl":
            issued.setdefault(rows.file[i], []).append(i)
    pairs = []
    for w_file in workers.partition_by(FILE, maintain_order=True):
        fi = w_file[FILE][0]
        kept = files[fi].kept
        pending: dict[str, deque[int]] = {}
        for i in sorted(issued.get(fi, []), key=lambda i: rows.cpu_start_ns[i] or 0):
            c = rows.field(i, "collective")
            pending.setdefault(fam.get(c, c), deque()).append(i)
        w_sorted = w_file.sort("start_ns")
        for eid, name in zip(w_sorted["event_id"].to_list(), w_sorted["name"].cast(pl.Utf8).to_list(), strict=True):
            fm = family.get(name)
            if fm is None:
                f = normalise_collective(name)
                fm = family[name] = fam.get(f, f)
            queue = pending.get(fm)
            if queue:
                want = _worker_nelems(kept.get(eid))
                j = (
                    0  # the oldest call: sizes unknown, or it agrees (the usual case, tested first)
                    if want is None or in_nelems[queue[0]] == want
                    else next((k for k in range(1, min(len(queue), _REORDER_WINDOW)) if in_nelems[queue[k]] == want), 0)
                )
                i = queue[j]
                del queue[j]
                rows.gloo.add(i)
            else:
                w = {"name": name, "event_id": eid}
                fields = fields_from({}, w, {"title": w}, kept, {}, None, "")
                fields["backend"] = "gloo"
                i = rows.add(fields, fi, name)
                in_nelems.append(fields["in_nelems"])
            pairs.append((fi, eid, i))
    wk = pl.DataFrame(pairs, schema={FILE: members.schema[FILE], "event_id": pl.Int64, "_call": pl.Int64}, orient="row")
    return pl.concat([members, wk])
