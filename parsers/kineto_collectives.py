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

Cost: no Python per marker; one pass per call reads its kept ``args`` and looks its fields up by
signature (:mod:`ep_trace.parsers.kineto_coll_fields`: computed once per distinct signature, shared
across the ranks of a batch), and the table's columns are built from those few distinct rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from ep_trace import schema
from ep_trace.comm_classifier import is_comm_expr
from ep_trace.parsers.collective_names import normalise_collective
from ep_trace.parsers.kineto_coll_fields import (
    FILE,
    CallRows,
    _int,
    call_signature,
    dist_key,
    fields_from,
    per_call,
    without_per_call,
)
from ep_trace.parsers.kineto_gloo_groups import with_gloo_groups
from ep_trace.parsers.kineto_gloo_workers import pair_workers
from ep_trace.parsers.kineto_keys import first_rows, key_packs

__all__ = ["FileContext", "build_collectives", "normalise_collective"]

_PREFIXES = ("c10d::", "record_param_comms", "nccl:", "gloo:", "_c10d_functional::")


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


#: Launch priority of a member kind (lowest launches the call): dispatcher op, functional op, title,
#: record_param_comms (see the module doc).
_C10D, _FUNC, _TITLE, _RPC = 0, 1, 2, 3
_NO_ARGS: dict[str, Any] = {}


def _candidates(ev: pl.DataFrame, files: Sequence[FileContext]) -> pl.DataFrame:
    """Collective markers per thread in start order (outermost first), waits dropped, with ``_kind``."""
    name = pl.col("name")
    # the name test on the host rows only, then the few marker rows gathered: a filter of the whole
    # frame by the combined mask cost 5x as much (param DLRM, 256 ranks: 33 -> 7 ms)
    rows = (
        ev.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"), "kind", "name")
        .filter(pl.col("kind").is_in(["cpu_op", "cpu_annotation"]))
        .filter(pl.any_horizontal([name.str.starts_with(p) for p in _PREFIXES]))
        .get_column("_row")
    )
    cands = (
        ev.select(FILE, "event_id", name.cast(pl.Utf8), "pid", "tid", "start_ns", "end_ns", "external_id")
        .gather(rows)
        .sort(
            [FILE, "pid", "tid", "start_ns", "end_ns"], descending=[False, False, False, False, True], nulls_last=True
        )
        .with_columns(
            pl.when(name.str.starts_with("_c10d_functional::"))
            .then(_FUNC)
            .when(name.str.starts_with("c10d::"))
            .then(_C10D)
            .when(name == "record_param_comms")
            .then(_RPC)
            .otherwise(_TITLE)
            .cast(pl.Int8)
            .alias("_kind")
        )
    )
    # `work.wait()`: any "wait" name, and record_param_comms whose Collective name is "wait"
    rpc = cands.select(pl.col("_kind") == _RPC).to_series().arg_true()
    waits = [
        (a := files[f].kept.get(e)) is not None and a.get("Collective name") == "wait"
        for f, e in zip(cands[FILE].gather(rpc).to_list(), cands["event_id"].gather(rpc).to_list(), strict=True)
    ]
    wait = pl.Series([False] * cands.height).scatter(rpc, pl.Series(waits, dtype=pl.Boolean))
    return cands.filter(~(name.str.contains("wait", literal=True) | wait))


def _group_ids(cands: pl.DataFrame) -> pl.Series:
    """Call (outermost-interval group) of each marker: a marker joins the group of its thread whose
    first marker (the root) it starts inside, else starts one.

    Vectorised as ``start_ns >= max(end_ns of the earlier markers of the thread)``, which is the same
    grouping whenever no member ends after its root (then that running max is the root's end);
    otherwise the rule is run marker by marker."""
    same = pl.all_horizontal([pl.col(c).eq_missing(pl.col(c).shift(1)) for c in (FILE, "pid", "tid")])
    t = cands.select("start_ns", "end_ns", (~same).alias("_new_thread")).with_columns(
        pl.col("_new_thread").cum_sum().alias("_thread")
    )
    prev_end = pl.col("end_ns").shift(1).cum_max().over("_thread")  # earlier markers of the thread
    gid = (pl.col("_new_thread") | (pl.col("start_ns") >= prev_end).fill_null(True)).cum_sum() - 1
    g = t.select(gid.alias("_gid"), "end_ns")
    if g.select((pl.col("end_ns").max() <= pl.col("end_ns").first()).over("_gid").all()).item():
        return g["_gid"]
    out: list[int] = []
    key = end = None
    cols = [cands[c].to_list() for c in (FILE, "pid", "tid", "start_ns", "end_ns")]
    for f, pid, tid, s, e in zip(*cols, strict=True):
        if (f, pid, tid) != key or end is None or s >= end:
            out.append(len(out) and out[-1] + 1)
            key, end = (f, pid, tid), e
        else:
            out.append(out[-1])
    return pl.Series("_gid", out, dtype=g["_gid"].dtype)


def _calls(cands: pl.DataFrame, files: Sequence[FileContext]) -> tuple[CallRows, pl.DataFrame, pl.DataFrame]:
    """The calls of the marker groups: ``(rows, roots, ext)`` with ``roots`` (_call, file, thread,
    root interval) and ``ext`` (file, External id, _call) of their members, in call / member order."""
    kind = pl.col("_kind")
    g = cands.with_columns(_group_ids(cands))
    first_of = {k: kind == k for k in (_C10D, _FUNC, _TITLE, _RPC)}
    launcher = kind.arg_min()  # first member of the highest-priority kind
    agg = g.group_by("_gid", maintain_order=True).agg(
        pl.col(FILE).first(),
        pl.col("pid").get(launcher),
        pl.col("tid").get(launcher),
        pl.col("start_ns").first().alias("_rs"),
        pl.col("end_ns").first().alias("_re"),
        pl.col("name").get(launcher).alias("op_name"),
        pl.col("event_id").get(launcher).alias("op_id"),
        pl.col("start_ns").get(launcher).alias("cpu_start_ns"),
        pl.col("end_ns").get(launcher).alias("cpu_end_ns"),
        *(pl.col("event_id").filter(m).first().alias(f"_id{k}") for k, m in first_of.items()),
        *(pl.col("name").filter(first_of[k]).first().alias(f"_name{k}") for k in (_C10D, _FUNC, _TITLE)),
    )
    sigs: list[dict[str, Any]] = []
    memo: dict[tuple[Any, tuple[Any, ...]], int] = {}
    file_keys: dict[int, Any] = {}
    keep: list[bool] = []
    sig: list[int] = []
    seq: list[int | None] = []
    comms: list[int | None] = []
    cols = [agg[c].to_list() for c in (FILE, "op_id", "_id0", "_id1", "_id2", "_id3", "_name0", "_name1", "_name2")]
    for fi, op_id, c10d, func, title, rpc, c10d_n, func_n, title_n in zip(*cols, strict=True):
        f = files[fi]
        kept = f.kept
        rpc_args = kept.get(rpc, _NO_ARGS)  # (ids are ints: an absent member, None, gets the default)
        meta = rpc_args if "Collective name" in rpc_args else _NO_ARGS
        if not meta and c10d is None and title is None and func is None:
            keep.append(False)  # e.g. a TorchRec awaitable wait: record_param_comms without metadata
            continue
        names = (c10d_n, func_n, title_n)
        key = call_signature(meta, names, kept.get(c10d, _NO_ARGS), kept.get(func, _NO_ARGS), kept.get(title, _NO_ARGS))
        if key is not None:
            fk = file_keys.get(fi)
            if fk is None:
                fk = file_keys[fi] = dist_key(f.dist, fi)
            key = (fk, key)
        s = memo.get(key) if key is not None else None
        if s is None:
            by = {
                k: {"name": n, "event_id": e} if e is not None else None
                for k, n, e in zip(("c10d", "func", "title"), names, (c10d, func, title), strict=True)
            }
            world = _int(f.dist.get("world_size"))
            sigs.append(fields_from(without_per_call(meta), None, by, kept, f.dist, world, f.source))
            s = len(sigs) - 1
            if key is not None:
                memo[key] = s
        one_seq, one_comms = per_call(meta, op_id, f.source)
        keep.append(True)
        sig.append(s)
        seq.append(one_seq)
        comms.append(one_comms)
    is_call = pl.Series(keep, dtype=pl.Boolean)
    call_of_group = pl.select(pl.when(is_call).then(is_call.cast(pl.Int64).cum_sum() - 1)).to_series()
    calls = agg.filter(is_call).with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("_call"))
    rows = CallRows(
        sigs,
        sig,
        calls[FILE].to_list(),
        calls["op_name"].to_list(),
        calls["op_id"].to_list(),
        calls["cpu_start_ns"].to_list(),
        calls["cpu_end_ns"].to_list(),
        seq,
        comms,
        set(),
    )
    roots = calls.select("_call", FILE, pl.col("pid", "tid").cast(pl.Int64), pl.col("_rs", "_re").cast(pl.Int64))
    ext = (
        g.filter(pl.col("external_id").is_not_null())
        .with_columns(pl.lit(call_of_group).gather(pl.col("_gid")).alias("_call"))
        .filter(pl.col("_call").is_not_null())
        .select(FILE, pl.col("external_id").cast(pl.Int64), pl.col("_call").cast(pl.Int64))
    )
    return rows, roots, ext


def _kernel_members(
    ev: pl.DataFrame, rows: CallRows, roots: pl.DataFrame, ext: pl.DataFrame, files: Sequence[FileContext]
) -> pl.DataFrame:
    """(file, event_id, _call) of the kernels implementing each call; kernels carrying collective
    metadata whose CPU op is outside the window become calls of their own (added to ``rows``)."""
    file_dtype = ev.schema[FILE]
    # (file, id) pairs as one int64 join key each (kineto_keys: half the cost of a two-column key)
    packs = key_packs(ev, {"event": ["event_id"], "ext": ["external_id"]}, FILE, len(files))
    ek, xk = packs["event"].key, packs["ext"].key
    # Kernels implementing each call: launched inside the call's root interval on its thread ...
    # (columns first, then rows: a filter of the whole frame copies every column of the kept rows)
    kind = ev.get_column("kind")
    kernels = ev.select(
        FILE,
        "event_id",
        "name",
        "start_ns",
        "end_ns",
        "external_id",
        "correlation",
        ek("event_id").alias("_ek"),
        ek("launch_id").alias("_lk"),
    ).filter(kind == "gpu_kernel")
    launch = ev.select(ek("event_id").alias("_lk"), "pid", "tid", pl.col("start_ns").alias("t")).filter(
        kind == "runtime"
    )
    at = first_rows(launch.get_column("_lk"), kernels.get_column("_lk"))
    k = kernels.with_columns(launch.select(pl.col("pid", "tid", "t").gather(at))).sort("t", nulls_last=True)
    k_in = k.filter(pl.col("t").is_not_null()).join_asof(
        roots, left_on="t", right_on="_rs", by=[FILE, "pid", "tid"], strategy="backward", check_sortedness=False
    )
    k_in = k_in.filter(pl.col("t") <= pl.col("_re")).select("_ek", "_call")
    # ... or linked by External id to one of its ops (kernels without a launch in the window).
    k_ext = (
        kernels.filter(pl.col("external_id") != pl.col("correlation"))
        .with_columns(xk("external_id").alias("_xk"))
        .join(ext.select(xk("external_id").alias("_xk"), "_call"), on="_xk")
        .select("_ek", "_call")
    )
    assigned = pl.concat([k_in, k_ext]).unique("_ek", keep="first")
    k = kernels.join(assigned, on="_ek", how="left")
    # Kernels carrying collective metadata whose CPU op is not in the window: calls of their own.
    kept_ids = pl.DataFrame(
        {
            FILE: [i for i, f in enumerate(files) for _ in f.kept],
            "event_id": [e for f in files for e in f.kept],
        },
        schema={FILE: file_dtype, "event_id": pl.Int64},
    )
    # (kept ids may be rows dropped as duplicates, outside the packed range: the two columns here)
    orphan = k.filter(pl.col("_call").is_null()).join(kept_ids, on=[FILE, "event_id"], how="semi")
    if orphan.height:
        orphan = orphan.with_columns(pl.coalesce("external_id", "correlation").alias("_grp"))
        extra = []
        for part in orphan.partition_by([FILE, "_grp"], maintain_order=True):
            first = part.row(0, named=True)
            f = files[first[FILE]]
            world = _int(f.dist.get("world_size"))
            fields = fields_from(f.kept[first["event_id"]], None, {}, f.kept, f.dist, world, f.source)
            extra.append((rows.add(fields, first[FILE], "record_param_comms"), first[FILE], part["event_id"]))
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
            k.join(fill.select(ek("event_id").alias("_ek"), "_orph"), on="_ek", how="left")
            .with_columns(pl.coalesce("_call", "_orph").alias("_call"))
            .drop("_orph")
        )
    k = k.filter(pl.col("_call").is_not_null())
    # Only communication kernels count when a call launched some (copies around a collective do not).
    k = k.with_columns(is_comm_expr(pl.col("name")).alias("_comm"))
    k = k.filter(pl.col("_comm") | ~pl.col("_comm").any().over("_call"))
    return k.select(FILE, "event_id", "_call")


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
    file_dtype = ev.schema[FILE]
    rows, roots, ext = _calls(_candidates(ev, files), files)
    roots = roots.with_columns(pl.col(FILE).cast(file_dtype)).sort("_rs")
    ext = ext.with_columns(pl.col(FILE).cast(file_dtype))
    if (ev.get_column("kind") == "gpu_kernel").any():
        k = _kernel_members(ev, rows, roots, ext, files)
    else:  # a CPU trace (gloo): no kernel to assign, no orphan metadata copy (~15 queries on empty frames)
        k = pl.DataFrame(schema={FILE: file_dtype, "event_id": pl.Int64, "_call": pl.Int64})
    members = pair_workers(ev, rows, set(k["_call"].unique().to_list()), k, files)
    return _finish(rows, members, ev, files)


#: Python types whose values polars converts one by one for a column of each dtype group (a column of
#: other values may be inferred as a whole: such a column is then built per call, as before).
def _plain(values: list[Any], dtype: pl.DataType) -> bool:
    if dtype == pl.Utf8:
        return all(v is None or v.__class__ is str for v in values)
    if dtype == pl.Boolean:
        return all(v is None or v.__class__ is bool for v in values)
    if dtype.is_integer():
        return all(v is None or (v.__class__ is int and -(2**63) <= v < 2**63) for v in values)
    if isinstance(dtype, pl.List) and dtype.inner is not None and dtype.inner.is_integer():
        return all(
            v is None
            or (v.__class__ is list and all(x is None or (x.__class__ is int and -(2**63) <= x < 2**63) for x in v))
            for v in values
        )
    return False


def _columns(rows: CallRows) -> list[pl.Series]:
    """The table's columns from the rows: per-signature fields built once per signature and gathered
    (a list column from 2,000 Python lists cost ~20 ms), the per-call ones from their lists."""
    per_call: dict[str, list[Any]] = {
        "op_name": rows.op_name,
        "op_id": rows.op_id,
        "cpu_start_ns": rows.cpu_start_ns,
        "cpu_end_ns": rows.cpu_end_ns,
        "seq": rows.seq,
        "comms_id": rows.comms_id,
        "backend": ["gloo" if i in rows.gloo else rows.field(i, "backend") for i in range(len(rows.sig))],
    }
    idx = pl.Series(rows.sig, dtype=pl.UInt32)
    out = []
    for c, dtype in schema.COLLECTIVES.items():
        if c in per_call:
            out.append(pl.Series(c, per_call[c], dtype=dtype, strict=False))
        elif c in rows.sigs[0]:
            vals = [s[c] for s in rows.sigs]
            if _plain(vals, dtype):
                out.append(pl.Series(c, vals, dtype=dtype, strict=False).gather(idx))
            else:
                out.append(pl.Series(c, [vals[i] for i in rows.sig], dtype=dtype, strict=False))
    return out


def _finish(
    rows: CallRows, members: pl.DataFrame, ev: pl.DataFrame, files: Sequence[FileContext]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Assemble the table: device activity, host-interval fallback, coll_id and ordinal (per file)."""
    file_dtype = ev.schema[FILE]
    if not rows.sig:
        return (
            schema.empty("collectives").with_columns(pl.lit(None, dtype=file_dtype).alias(FILE)),
            pl.DataFrame(schema={FILE: file_dtype, "event_id": pl.Int64, "coll_id": pl.Int64}),
        )
    df = pl.DataFrame(_columns(rows))
    ranks = {i: f.rank for i, f in enumerate(files)}
    df = df.with_columns(
        pl.Series(FILE, rows.file, dtype=file_dtype),
        pl.int_range(pl.len(), dtype=pl.Int64).alias("_call"),
    )
    ek = key_packs(ev, {"event": ["event_id"]}, FILE, len(files))["event"].key
    activity = (
        members.select(ek("event_id").alias("_ek"), "_call")
        .join(ev.select(ek("event_id").alias("_ek"), "start_ns", "end_ns"), on="_ek")
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
    df = with_gloo_groups(df, members, ev, files)  # gloo records no group: its worker threads tell it
    df = df.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over(FILE, "pg_name").alias("ordinal"))
    coll_of_event = (
        members.join(df.select("_call", "coll_id"), on="_call")
        .select(FILE, "event_id", "coll_id")
        .unique([FILE, "event_id"], keep="first")
    )
    table = schema.conform("collectives", df.drop("_call", "_s", "_e"))
    return table.with_columns(df[FILE]), coll_of_event
