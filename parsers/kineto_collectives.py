"""Collective calls of one Kineto rank: one row per call, from every era's evidence.

A call is an outermost group of collective markers on one thread: the dispatcher op
(``c10d::alltoall_base_``, possibly inside ``_c10d_functional::all_to_all_single``), the
``record_param_comms`` op and the c10d profiling title (``nccl:all_to_all`` / ``gloo:all_to_all``).
Its fields come, in order of trust, from:

1. ``record_param_comms`` metadata (torch >= 2.2; every key variant: ``In msg nelems`` / the older
   ``In msg size``, ``Process Group Name`` / the 2.3-only ``Process Group ID``, ``Seq``, ``Comms Id``,
   ``Process Group Ranks``, ``Global rank start/stride``, ``Src/Dst Rank``);
2. the copy of that metadata Kineto puts on the kernel (kineto#906), used when the CPU op is
   outside the profiled window;
3. the dispatcher op's ``Concrete Inputs`` / ``Input Dims`` (``record_shapes=True``; the only split
   source on gloo, which records no ``record_param_comms``);
4. the title's ``Input Dims`` / ``Input type``.

``record_param_comms`` rows whose ``Collective name`` is ``wait`` (``work.wait()``), and legacy ones
outside any dispatcher op and without a title (TorchRec awaitable waits in ``param_dlrm_8rank``), are
not calls. The collective type comes from this launching evidence, never from the kernel name
(``hta_torchrec16_rank0``: all 80 NCCL kernels are ``SendRecv``, 30 of them serve all_reduce,
all_gather and reduce_scatter).

Device activity: the kernels launched inside the call on its thread (or linked to its ops by
``External id``); when some are communication kernels (``ep_trace.comm_classifier``) only those
count; start = min start, end = max end. gloo calls get the ``gloo:*`` worker-thread range paired by
order per collective family; worker ranges left unpaired become calls of their own. A call with no
device activity keeps its host interval and ``n_kernels = 0``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from ep_trace import schema
from ep_trace.comm_classifier import is_comm_expr
from ep_trace.errors import TraceFormatError
from ep_trace.parsers.collective_names import normalise_collective
from ep_trace.parsers.splits import itemsize, parse_int_list, prod

__all__ = ["FileContext", "build_collectives", "normalise_collective"]

_PREFIXES = ("c10d::", "record_param_comms", "nccl:", "gloo:", "_c10d_functional::")
#: Column of the events frame telling the files of a batch apart (0, 1, ... in input order).
FILE = "_file"


@dataclass(frozen=True)
class FileContext:
    """What the collective builder needs of one file of a batch.

    Attributes:
        kept: ``args`` of the collective-marker events and metadata-carrying kernels, by event_id.
        rank: The file's rank.
        dist: The file's ``distributedInfo`` (may be empty).
        source: File name for error messages.
    """

    kept: dict[int, dict[str, Any]]
    rank: int
    dist: dict[str, Any]
    source: str


def _is_wait(name: str, args: dict[str, Any] | None) -> bool:
    if "wait" in name:
        return True
    return name == "record_param_comms" and args is not None and args.get("Collective name") == "wait"


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _group_ranks(m: dict[str, Any], size: int | None, dist: dict[str, Any], pg_name: str | None) -> list[int] | None:
    parsed = parse_int_list(m.get("Process Group Ranks"), size)
    if parsed is not None and parsed.values and not parsed.truncated:
        return list(parsed.values)  # type: ignore[arg-type]
    start, stride = _int(m.get("Global rank start")), _int(m.get("Global rank stride"))
    if size and start is not None and stride:
        return [start + j * stride for j in range(size)]
    for pg in dist.get("pg_config") or []:
        if isinstance(pg, dict) and pg_name is not None and str(pg.get("pg_name")) == pg_name:
            full = parse_int_list(pg.get("ranks"))
            if full is not None and full.values and not full.truncated:
                return list(full.values)  # type: ignore[arg-type]
    return None


def _splits(v: Any, size: int | None) -> tuple[list[int | None] | None, bool]:
    parsed = parse_int_list(v, size)
    if parsed is None or not parsed.values:
        return None, False
    return list(parsed.values), parsed.truncated


def _call_row(
    members: list[dict[str, Any]], kept: dict[int, dict[str, Any]], dist: dict[str, Any], world: int | None, source: str
) -> dict[str, Any] | None:
    """Fields of one call from its member ops (dicts of event columns), or None if it is no call."""
    by: dict[str, dict[str, Any] | None] = {"c10d": None, "func": None, "rpc": None, "title": None}
    for mb in members:
        n = mb["name"]
        key = (
            "func"
            if n.startswith("_c10d_functional::")
            else "c10d"
            if n.startswith("c10d::")
            else "rpc"
            if n == "record_param_comms"
            else "title"
        )
        if by[key] is None:
            by[key] = mb
    rpc = by["rpc"]
    rpc_args: dict[str, Any] = kept.get(rpc["event_id"], {}) if rpc else {}
    meta = rpc_args if "Collective name" in rpc_args else {}
    if not meta and by["c10d"] is None and by["title"] is None and by["func"] is None:
        return None
    launcher = by["c10d"] or by["func"] or by["title"] or rpc
    assert launcher is not None  # one of them is set: the test above returned otherwise
    row = _fields_from(meta, launcher, by, kept, dist, world, source)
    row.update(
        op_name=launcher["name"],
        op_id=launcher["event_id"],
        cpu_start_ns=launcher["start_ns"],
        cpu_end_ns=launcher["end_ns"],
        _pid=launcher["pid"],
        _tid=launcher["tid"],
        _root_start=members[0]["start_ns"],
        _root_end=members[0]["end_ns"],
        _ext=[mb["external_id"] for mb in members if mb["external_id"] is not None],
    )
    return row


def _fields_from(
    meta: dict[str, Any],
    launcher: dict[str, Any] | None,
    by: dict[str, Any],
    kept: dict[int, dict[str, Any]],
    dist: dict[str, Any],
    world: int | None,
    source: str,
) -> dict[str, Any]:
    ctype = "unknown"
    for cand in (
        meta.get("Collective name"),
        by.get("c10d") and by["c10d"]["name"],
        by.get("title") and by["title"]["name"],
        by.get("func") and by["func"]["name"],
    ):
        if cand and normalise_collective(cand) != "unknown":
            ctype = normalise_collective(cand)
            break
    pg_name = meta.get("Process Group Name")
    if pg_name is None and meta.get("Process Group ID") is not None:
        pg_name = str(meta["Process Group ID"])
    size = _int(meta.get("Group size"))
    in_splits, in_tr = _splits(meta.get("In split size"), size)
    out_splits, out_tr = _splits(meta.get("Out split size"), size)
    splits_source = "kineto" if (in_splits or out_splits) else None
    in_dims = out_dims = None
    dtype = meta.get("dtype")
    c10d_args = kept.get(by["c10d"]["event_id"], {}) if by.get("c10d") else {}
    func_args = kept.get(by["func"]["event_id"], {}) if by.get("func") else {}
    title_args = kept.get(by["title"]["event_id"], {}) if by.get("title") else {}
    dims = c10d_args.get("Input Dims") or []
    types = c10d_args.get("Input type") or []
    if by.get("c10d") and normalise_collective(by["c10d"]["name"]) == "all_to_all":
        ci = c10d_args.get("Concrete Inputs") or []
        if not in_splits and len(ci) > 4:  # (output, input, pg, output_split_sizes, input_split_sizes, ...)
            out_splits, out_tr = _splits(ci[3], size)
            in_splits, in_tr = _splits(ci[4], size)
            splits_source = "concrete_inputs" if (in_splits or out_splits) else None
        if len(dims) > 1:
            out_dims, in_dims = dims[0], dims[1]
        if dtype is None and len(types) > 1 and types[1]:
            dtype = types[1]
    if not in_splits and func_args:
        ci = func_args.get("Concrete Inputs") or []  # (input, output_split_sizes, input_split_sizes, group)
        if len(ci) > 2:
            out_splits, out_tr = _splits(ci[1], size)
            in_splits, in_tr = _splits(ci[2], size)
            splits_source = "concrete_inputs" if (in_splits or out_splits) else None
    for a in (c10d_args, title_args):
        d = a.get("Input Dims") or []
        if in_dims is None and d and prod(d[0]) is not None:
            in_dims = d[0]
            t = a.get("Input type") or []
            if dtype is None and t and t[0]:
                dtype = t[0]
    if ctype == "all_to_all" and (in_splits or out_splits):
        ctype = "all_to_allv"
    if size is None:
        size = len(in_splits) if in_splits and not in_tr else len(out_splits) if out_splits and not out_tr else None
    group_ranks = _group_ranks(meta, size, dist, pg_name)
    if group_ranks is None and size is not None and world is not None and size == world:
        group_ranks = list(range(world))  # the whole world: group-local order is rank order
    in_nelems = _int(meta.get("In msg nelems", meta.get("In msg size"))) or prod(in_dims)
    out_nelems = _int(meta.get("Out msg nelems", meta.get("Out msg size"))) or prod(out_dims)
    isz = itemsize(dtype)
    row_bytes = None
    if isz and in_dims:
        row_bytes = (prod(in_dims[1:]) or 1) * isz if len(in_dims) > 1 else isz
    elif isz and in_nelems and in_splits and not in_tr:
        total = sum(in_splits)  # type: ignore[arg-type]
        if total and in_nelems % total == 0:
            row_bytes = in_nelems // total * isz
    comms_id = meta.get("Comms Id")
    if comms_id is not None and not (isinstance(comms_id, int) and 0 <= comms_id < 2**64):
        ev = launcher["event_id"] if launcher else "?"
        raise TraceFormatError(
            source,
            f"'Comms Id' {str(comms_id)[:30]} is not an unsigned 64-bit integer",
            "the trace is corrupt; re-export it",
            record=f"traceEvents[{ev}]",
        )
    peer = _int(meta.get("Dst Rank")) if ctype == "send" else _int(meta.get("Src Rank")) if ctype == "recv" else None
    title = by.get("title")
    backend = (
        "gloo"
        if title and title["name"].startswith("gloo:")
        else "nccl"
        if (meta or (title and title["name"].startswith("nccl:")))
        else None
    )
    return dict(
        collective=ctype,
        backend=backend,
        pg_name=pg_name,
        pg_desc=meta.get("Process Group Description"),
        group_ranks=group_ranks,
        group_size=size,
        seq=_int(meta.get("Seq")),
        comms_id=comms_id,
        in_splits=in_splits,
        out_splits=out_splits,
        splits_truncated=bool(in_tr or out_tr),
        splits_source=splits_source,
        in_nelems=in_nelems,
        out_nelems=out_nelems,
        dtype=dtype,
        row_bytes=row_bytes,
        peer_rank=peer,
    )


def _group_calls(cands: pl.DataFrame, files: Sequence[FileContext]) -> list[list[dict[str, Any]]]:
    """Outermost-interval groups of collective markers per thread (few rows: a Python pass is fine)."""
    groups: list[list[dict[str, Any]]] = []
    key = None
    end = None
    for r in cands.iter_rows(named=True):
        if _is_wait(r["name"], files[r[FILE]].kept.get(r["event_id"])):
            continue
        k = (r[FILE], r["pid"], r["tid"])
        if k != key or end is None or r["start_ns"] >= end:
            groups.append([r])
            key, end = k, r["end_ns"]
        else:
            groups[-1].append(r)
    return groups


def build_collectives(ev: pl.DataFrame, files: Sequence[FileContext]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Collective calls of the files of a batch (see the module doc); each file is one rank.

    Args:
        ev: Linked events frame of the batch (:data:`FILE`, event_id, kind, name, pid, tid,
            start_ns, end_ns, correlation, external_id, launch_id); ids are per file.
        files: One context per file, indexed by the :data:`FILE` column.

    Returns:
        ``(collectives, coll_of_event)``: the conformed table plus its :data:`FILE` column, in file
        order, and (:data:`FILE`, event_id, coll_id) of the kernels / worker ranges implementing
        each call.
    """
    cols = [FILE, "event_id", "name", "pid", "tid", "start_ns", "end_ns", "external_id"]
    cands = (
        ev.filter(
            pl.col("kind").is_in(["cpu_op", "cpu_annotation"])
            & pl.any_horizontal([pl.col("name").str.starts_with(p) for p in _PREFIXES])
        )
        .select(cols)
        .sort(
            [FILE, "pid", "tid", "start_ns", "end_ns"], descending=[False, False, False, False, True], nulls_last=True
        )
    )
    rows = []
    for g in _group_calls(cands, files):
        f = files[g[0][FILE]]
        row = _call_row(g, f.kept, f.dist, _int(f.dist.get("world_size")), f.source)
        if row is not None:
            row[FILE] = g[0][FILE]
            rows.append(row)
    # Kernels implementing each call: launched inside the call's root interval on its thread ...
    kernels = ev.filter(pl.col("kind") == "gpu_kernel").select(
        FILE, "event_id", "name", "start_ns", "end_ns", "launch_id", "external_id", "correlation"
    )
    launch = ev.filter(pl.col("kind") == "runtime").select(
        FILE, pl.col("event_id").alias("launch_id"), "pid", "tid", pl.col("start_ns").alias("t")
    )
    file_dtype = ev.schema[FILE]
    roots = pl.DataFrame(
        {
            "_call": list(range(len(rows))),
            FILE: [r[FILE] for r in rows],
            "pid": [r["_pid"] for r in rows],
            "tid": [r["_tid"] for r in rows],
            "_rs": [r["_root_start"] for r in rows],
            "_re": [r["_root_end"] for r in rows],
        },
        schema={
            "_call": pl.Int64,
            FILE: file_dtype,
            "pid": pl.Int64,
            "tid": pl.Int64,
            "_rs": pl.Int64,
            "_re": pl.Int64,
        },
    ).sort("_rs")
    k = kernels.join(launch, on=[FILE, "launch_id"], how="left").sort("t", nulls_last=True)
    k_in = k.filter(pl.col("t").is_not_null()).join_asof(
        roots, left_on="t", right_on="_rs", by=[FILE, "pid", "tid"], strategy="backward", check_sortedness=False
    )
    k_in = k_in.filter(pl.col("t") <= pl.col("_re")).select(FILE, "event_id", "_call")
    # ... or linked by External id to one of its ops (kernels without a launch in the window).
    ext = pl.DataFrame(
        {
            FILE: [r[FILE] for r in rows for _ in r["_ext"]],
            "external_id": [e for r in rows for e in r["_ext"]],
            "_call": [i for i, r in enumerate(rows) for _ in r["_ext"]],
        },
        schema={FILE: file_dtype, "external_id": pl.Int64, "_call": pl.Int64},
    )
    k_ext = (
        kernels.filter(pl.col("external_id") != pl.col("correlation"))
        .join(ext, on=[FILE, "external_id"])
        .select(FILE, "event_id", "_call")
    )
    assigned = pl.concat([k_in, k_ext]).unique([FILE, "event_id"], keep="first")
    k = kernels.join(assigned, on=[FILE, "event_id"], how="left")
    # Kernels carrying collective metadata whose CPU op is not in the window: calls of their own.
    kept_ids = pl.DataFrame(
        {
            FILE: [i for i, f in enumerate(files) for _ in f.kept],
            "event_id": [e for f in files for e in f.kept],
        },
        schema={FILE: file_dtype, "event_id": pl.Int64},
    )
    orphan = k.filter(pl.col("_call").is_null()).join(kept_ids, on=[FILE, "event_id"], how="semi")
    if orphan.height:
        orphan = orphan.with_columns(pl.coalesce("external_id", "correlation").alias("_grp"))
        extra = []
        for part in orphan.partition_by([FILE, "_grp"], maintain_order=True):
            first = part.row(0, named=True)
            f = files[first[FILE]]
            world = _int(f.dist.get("world_size"))
            row = _fields_from(f.kept[first["event_id"]], None, {}, f.kept, f.dist, world, f.source)
            row.update(op_name="record_param_comms", op_id=None, cpu_start_ns=None, cpu_end_ns=None, _ext=[])
            row[FILE] = first[FILE]
            extra.append((len(rows), first[FILE], part["event_id"]))
            rows.append(row)
        fill = pl.concat(
            [
                pl.DataFrame(
                    {FILE: [fi] * len(ids), "event_id": ids, "_orph": [i] * len(ids)},
                    schema={FILE: file_dtype, "event_id": pl.Int64, "_orph": pl.Int64},
                )
                for i, fi, ids in extra
            ]
        )
        k = (
            k.join(fill, on=[FILE, "event_id"], how="left")
            .with_columns(pl.coalesce("_call", "_orph").alias("_call"))
            .drop("_orph")
        )
    k = k.filter(pl.col("_call").is_not_null())
    # Only communication kernels count when a call launched some (copies around a collective do not).
    k = k.with_columns(is_comm_expr(pl.col("name")).alias("_comm"))
    k = k.filter(pl.col("_comm") | ~pl.col("_comm").any().over("_call"))
    members = _pair_workers(ev, rows, set(k["_call"].unique().to_list()), k.select(FILE, "event_id", "_call"), files)
    return _finish(rows, members, ev, files)


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


def _pair_workers(
    ev: pl.DataFrame,
    rows: list[dict[str, Any]],
    with_kernels: set[int],
    members: pl.DataFrame,
    files: Sequence[FileContext],
) -> pl.DataFrame:
    """Pair gloo worker ranges with the calls that launched no kernel: in start order per file and
    family, each with the first of the next :data:`_REORDER_WINDOW` issued calls whose input size
    equals the range's ``Input Dims`` (the oldest call when sizes are unknown or none agrees)."""
    workers = ev.filter(pl.col("kind") == "comm_worker")
    if workers.height == 0:
        return members
    fam = {"all_to_allv": "all_to_all"}
    pairs = []
    for w_file in workers.partition_by(FILE, maintain_order=True):
        fi = w_file[FILE][0]
        kept = files[fi].kept
        pending: dict[str, deque[int]] = {}
        for i in sorted(
            (
                i
                for i in range(len(rows))
                if rows[i][FILE] == fi and i not in with_kernels and rows[i].get("backend") != "nccl"
            ),
            key=lambda i: rows[i]["cpu_start_ns"] or 0,
        ):
            pending.setdefault(fam.get(rows[i]["collective"], rows[i]["collective"]), deque()).append(i)
        for w in w_file.sort("start_ns").iter_rows(named=True):
            f = normalise_collective(w["name"])
            queue = pending.get(fam.get(f, f))
            if queue:
                want = _worker_nelems(kept.get(w["event_id"]))
                j = next(
                    (
                        k
                        for k in range(min(len(queue), _REORDER_WINDOW))
                        if want is not None and rows[queue[k]].get("in_nelems") == want
                    ),
                    0,
                )
                i = queue[j]
                del queue[j]
                rows[i]["backend"] = "gloo"
            else:
                i = len(rows)
                row = _fields_from({}, w, {"title": w}, kept, {}, None, "")
                row.update(op_name=w["name"], op_id=None, cpu_start_ns=None, cpu_end_ns=None, backend="gloo", _ext=[])
                row[FILE] = fi
                rows.append(row)
            pairs.append((fi, w["event_id"], i))
    wk = pl.DataFrame(pairs, schema={FILE: members.schema[FILE], "event_id": pl.Int64, "_call": pl.Int64}, orient="row")
    return pl.concat([members, wk])


def _finish(
    rows: list[dict[str, Any]], members: pl.DataFrame, ev: pl.DataFrame, files: Sequence[FileContext]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Assemble the table: device activity, host-interval fallback, coll_id and ordinal (per file)."""
    file_dtype = ev.schema[FILE]
    if not rows:
        return (
            schema.empty("collectives").with_columns(pl.lit(None, dtype=file_dtype).alias(FILE)),
            pl.DataFrame(schema={FILE: file_dtype, "event_id": pl.Int64, "coll_id": pl.Int64}),
        )
    keep = [c for c in schema.COLLECTIVES if c in rows[0]]
    df = pl.DataFrame(
        {c: [r.get(c) for r in rows] for c in keep}, schema={c: schema.COLLECTIVES[c] for c in keep}, strict=False
    )
    ranks = {i: f.rank for i, f in enumerate(files)}
    df = df.with_columns(
        pl.Series(FILE, [r[FILE] for r in rows], dtype=file_dtype),
        pl.int_range(pl.len(), dtype=pl.Int64).alias("_call"),
    )
    activity = (
        members.join(ev.select(FILE, "event_id", "start_ns", "end_ns"), on=[FILE, "event_id"])
        .group_by("_call")
        .agg(
            pl.col("start_ns").min().alias("_s"),
            pl.col("end_ns").max().alias("_e"),
            pl.len().cast(pl.Int32).alias("n_kernels"),
        )
    )
    df = (
        df.join(activity, on="_call", how="left")
        .with_columns(
            pl.coalesce("_s", "cpu_start_ns").alias("start_ns"),
            pl.coalesce("_e", "cpu_end_ns").alias("end_ns"),
            pl.col("n_kernels").fill_null(0),
            pl.col(FILE).replace_strict(ranks, return_dtype=pl.Int32).alias("rank"),
        )
        .sort(FILE, pl.coalesce("cpu_start_ns", "start_ns"), "_call")
        .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over(FILE).alias("coll_id"))
    )
    df = df.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over(FILE, "pg_name").alias("ordinal"))
    coll_of_event = (
        members.join(df.select("_call", "coll_id"), on="_call")
        .select(FILE, "event_id", "coll_id")
        .unique([FILE, "event_id"], keep="first")
    )
    table = schema.conform("collectives", df.drop("_call", "_s", "_e"))
    return table.with_columns(df[FILE]), coll_of_event
