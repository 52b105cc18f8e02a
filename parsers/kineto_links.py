"""Linking Kineto rows: GPU activity -> runtime launch -> enclosing CPU op, vectorised.

* ``launch_id``: GPU kernel / memcpy / memset -> the ``cuda_runtime`` / ``cuda_driver`` row with the
  same ``args.correlation`` (always present; flows are not needed).
* ``op_id``: the CPU op Kineto linked through ``External id`` (kineto ``output_json.cpp``: the
  innermost op that pushed a correlation). Legacy traces (2022-2023: ``param_dlrm_8rank``,
  ``hta_torchrec_*``) give NCCL kernels ``External id == correlation`` and no CPU op has that id,
  so when the id is missing, equal to the correlation, or unknown, the fallback is time
  containment: the innermost ``cpu_op`` / ``user_annotation`` on the launching (pid, tid) whose
  interval contains the launch start. ``python_function`` frames (kind ``python_frame``) are never
  link targets.

Containment is computed without per-event Python: ops of one thread are properly nested, so each
op gets a nesting depth from two sorted counts (ops started before it minus ops ended before it);
then, depth level by depth level, an as-of join finds the last op starting before each point and
keeps it when it still contains the point. The deepest containing level wins.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ep_trace.parsers.kineto_keys import first_rows, key_packs

__all__ = ["innermost_enclosing", "link_events"]

_KEY = ["pid", "tid"]


def _pos_in_runs(key: list[str]) -> pl.Expr:
    """0-based position of each row within its run of equal ``key`` values, on a frame sorted by
    ``key``: a shift compare, not ``int_range().over(key)`` (whose hash grouping, like a group_by's,
    was the link step's memory peak on GPU traces)."""
    row = pl.int_range(pl.len(), dtype=pl.Int64)
    first = pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(1)) for c in key])
    return row - pl.when(first).then(row).forward_fill()


def _depths(ops: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """Add ``depth`` (0 = outermost) to ops of columns ``key``, start_ns, end_ns, op."""
    # ``op`` breaks ties (two ops with the same interval): the earlier one is the outer, whatever
    # else the frame holds (a batch of files sorts differently than one file without it)
    ops = ops.sort([*key, "start_ns", "end_ns", "op"], descending=[False] * len(key) + [False, True, False])
    ops = ops.with_columns(_pos_in_runs(key).alias("_pos"))
    ends = (
        ops.select(*key, pl.col("end_ns").alias("_t"))
        .sort([*key, "_t"])
        .with_columns((_pos_in_runs(key) + 1).alias("_ended"))
    )
    # the last row of each (key, _t) run holds its largest count
    last = pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(-1)) for c in [*key, "_t"]])
    ends = ends.filter(last).sort("_t")
    ops = ops.sort("start_ns").join_asof(
        ends,
        left_on="start_ns",
        right_on="_t",
        by=key,
        strategy="backward",
        allow_exact_matches=False,
        check_sortedness=False,
    )
    depth = (pl.col("_pos") - pl.col("_ended").fill_null(0)).clip(lower_bound=0)
    return ops.with_columns(depth.alias("depth")).drop("_pos", "_t", "_ended")


def innermost_enclosing(
    points: pl.DataFrame, ops: pl.DataFrame, key: tuple[str, ...] = ("pid", "tid"), thread_ids: str | None = None
) -> pl.DataFrame:
    """Innermost op containing each point on the same thread.

    Args:
        points: Columns ``key``, ``t`` (ns) and any others (kept).
        ops: Columns ``key``, ``start_ns``, ``end_ns``, ``op`` (the id to return); properly nested
            within one key (true of the CPU ops and annotations of one thread).
        key: The thread columns, e.g. ``("rank", "pid", "tid")`` across ranks.
        thread_ids: Optional column of both frames numbering the threads ``0..T-1`` (one number
            per key; null on a point whose thread has no op), when the caller has it: the threads
            are then not ranked again.

    Returns:
        ``points`` plus column ``op`` (null when no op contains the point), in ``t`` order.
    """
    by = list(key)
    points = points.sort("t")
    out = points.with_columns(pl.lit(None, dtype=ops.schema["op"]).alias("op"))
    ops = ops.drop_nulls(by)
    if ops.height == 0 or points.height == 0:
        return out
    packed = _packed_enclosing(points, ops, by, thread_ids)
    if packed is not None:
        return out.with_columns(pl.Series("op", packed, dtype=ops.schema["op"]))
    lops = _depths(ops, by).lazy()
    pts = points.lazy().select(*by, "t")
    # one query for all levels (each level an as-of join in points' order), not ~6 eager calls per
    # level: old traces nest ~10 deep (param_dlrm_8rank: 9) and that fixed cost was per rank file
    levels = []
    for d in range(int(lops.select(pl.col("depth").max()).collect().item()) + 1):
        level = (
            lops.filter(pl.col("depth") == d)
            .select(*by, "start_ns", pl.col("end_ns").alias("_end"), pl.col("op").alias("_op"))
            .sort("start_ns")
        )
        hit = pts.join_asof(level, left_on="t", right_on="start_ns", by=by, strategy="backward", check_sortedness=False)
        levels.append(hit.select(pl.when(pl.col("_end") >= pl.col("t")).then(pl.col("_op")).alias(f"_op{d}")))
    hits = pl.concat(levels, how="horizontal").collect()
    # the deepest level that contains the point wins
    return out.with_columns(hits.select(pl.coalesce(list(reversed(hits.columns))).alias("op")).to_series())


def _packed_enclosing(
    points: pl.DataFrame, ops: pl.DataFrame, by: list[str], thread_ids: str | None = None
) -> pl.Series | None:
    """:func:`innermost_enclosing`'s answer (``op`` per point, in ``points``' order) computed on one
    int64 key per row, ``thread * 2^bits + (time - lo)``, with numpy sorts and binary searches
    instead of multi-column polars sorts and as-of joins by thread (those cost 11-13 ms each on
    100k ops: a 55 MB GPU trace's links spent 0.04 CPU-s here, now ~0.01).

    The same answer, step by step: nesting depth = ops earlier in (thread, start, end descending,
    op) order minus ops of the thread that ended strictly before the op's start; per depth level
    the last op starting at or before the point, kept when it still contains it; the deepest such
    level wins. None (use the as-of path) when the packed key could overflow, a time is null, or an
    op ends before it starts (depths could then tie within a level)."""
    s, e, t = ops.get_column("start_ns"), ops.get_column("end_ns"), points.get_column("t")
    if s.null_count() or e.null_count() or t.null_count() or bool((e < s).any()):
        return None
    lo, hi = int(s.min()), int(e.max())  # type: ignore[arg-type]
    given = thread_ids if thread_ids is not None and not ops.get_column(thread_ids).null_count() else None
    if given is not None:
        gid = ops.get_column(given).cast(pl.Int64)
        pg = points.get_column(given).cast(pl.Int64)
        n_threads = max(int(gid.max()), int(pg.max() if pg.null_count() < pg.len() else 0)) + 1  # type: ignore[arg-type]
    else:  # thread ids in key order (dense rank of the key struct: exact, no hash)
        gid = ops.select(pl.struct(by).rank("dense").cast(pl.Int64) - 1).to_series()
        n_threads = int(gid.max()) + 1  # type: ignore[arg-type]
    bits = (hi - lo + 1).bit_length()
    if (n_threads << bits) >= 2**62:
        return None
    g = gid.to_numpy()
    if given is None:
        # one row per thread id: any row of each (all rows of an id hold the same key), no hash unique
        first_row = np.zeros(n_threads, dtype=np.int64)
        first_row[g] = np.arange(len(g))
        threads = ops.select(by).gather(first_row).with_columns(pl.Series("_g", np.arange(n_threads, dtype=np.int64)))
        # each point on its thread's axis
        pg = points.select(by).join(threads, on=by, how="left", maintain_order="left").get_column("_g")
    base = g << bits
    ps = base + (s.to_numpy() - lo)
    pe = base + (e.to_numpy() - lo)
    op = ops.get_column("op").to_numpy()
    order = np.argsort(ps, kind="stable")
    if len(ps) > 1 and not (np.diff(ps[order]) > 0).all():  # equal starts on a thread: full key
        order = np.lexsort((op, -pe, ps))  # thread, start, end descending, op
    ps, pe, g, op = ps[order], pe[order], g[order], op[order]
    first_of_thread = np.searchsorted(g, np.arange(n_threads), side="left")
    pos = np.arange(len(ps)) - first_of_thread[g]
    ends = np.sort(pe)
    # ops of earlier threads, counted once per thread (not one search per op)
    ended = np.searchsorted(ends, ps, side="left") - np.searchsorted(ends, np.arange(n_threads) << bits)[g]
    depth = pos - ended  # >= 0: every op that ended before this start also started before it
    # a point outside [lo, hi] is contained by no op
    tt = t.to_numpy()
    valid = (pg.is_not_null().to_numpy()) & (tt >= lo) & (tt <= hi)
    pt = np.where(valid, (pg.fill_null(0).to_numpy() << bits) + (tt - lo), -1)
    answer = np.full(len(tt), -1, dtype=np.int64)  # row of the op in the sorted arrays
    # levels contiguous, ascending start within each (a 16-bit key: numpy's stable sort is then a
    # radix sort, 1.1 -> ~0.2 ms per 100k ops)
    small = depth.astype(np.int16) if len(depth) and int(depth.max()) < 2**15 else depth
    by_level = np.argsort(small, kind="stable")
    bounds = np.searchsorted(depth[by_level], np.arange(int(depth.max()) + 2), side="left")
    for d in range(len(bounds) - 1):
        rows = by_level[bounds[d] : bounds[d + 1]]  # (start values distinct within a level)
        j = np.searchsorted(ps[rows], pt, side="right") - 1
        cand = rows[np.maximum(j, 0)]
        hit = valid & (j >= 0) & (g[cand] == (pt >> bits)) & (pe[cand] >= pt)
        answer = np.where(hit, cand, answer)  # deeper levels overwrite: the deepest wins
    found = pl.Series("op", op[np.maximum(answer, 0)], dtype=ops.schema["op"])
    return found.scatter(np.flatnonzero(answer < 0), None)


def link_events(ev: pl.DataFrame, file_key: str | None = None) -> pl.DataFrame:
    """Add ``launch_id`` and ``op_id`` to a Kineto events frame (see the module doc).

    Args:
        ev: Columns event_id, kind, category, pid, tid, start_ns, end_ns, correlation, external_id.
        file_key: Column telling the files of a batch apart (ids and threads are per file), or None
            for one file.

    Returns:
        ``ev`` with ``launch_id`` (GPU rows) and ``op_id`` (GPU and runtime rows).
    """
    ids = [file_key] if file_key else []
    key = [*ids, *_KEY]
    gpu = pl.col("kind").is_in(["gpu_kernel", "gpu_memcpy", "gpu_memset"])
    linked = gpu | (pl.col("kind") == "runtime")
    # Only GPU and runtime rows get links: the joins below run on those rows alone (a CPU-only
    # trace has none: its 155k ops were joined by External id for nothing, 0.03 CPU-s per 50 MB).
    n = ev.select(*ids, "event_id", "kind", "correlation", "external_id").with_row_index("_row").filter(linked)
    if n.height == 0:
        none = pl.lit(None, dtype=ev.schema["event_id"])
        return ev.with_columns(none.alias("launch_id"), none.alias("op_id"))
    # (file, id) pairs as one int64 join key each (kineto_keys: half the cost of a two-column key)
    packs = key_packs(ev, {"corr": ["correlation"], "ext": ["external_id"], "event": ["event_id"]}, file_key)
    ck, xk, ek = packs["corr"].key, packs["ext"].key, packs["event"].key
    # Every filter runs on the lazily selected columns it needs: an eager filter of ``ev`` would
    # first copy all of its columns (names included), ~0.5x the events frame per filter at peak.
    lazy = ev.lazy()
    runtime, ops, by_ext = pl.collect_all(
        [
            lazy.select(*ids, "event_id", "kind", *_KEY, "start_ns", "correlation")
            .filter((pl.col("kind") == "runtime") & pl.col("correlation").is_not_null())
            .select(*key, "start_ns", "event_id", ck("correlation").alias("_ck"), ek("event_id").alias("_ek")),
            # Python frames are kind python_frame (kineto_batch): never link targets
            lazy.select(*ids, "event_id", "kind", *_KEY, "start_ns", "end_ns")
            .filter(pl.col("kind").is_in(["cpu_op", "cpu_annotation"]))
            .select(*key, "start_ns", "end_ns", pl.col("event_id").alias("op")),
            lazy.select(*ids, "event_id", "kind", "external_id")
            .filter(pl.col("kind").is_in(["cpu_op", "cpu_annotation"]) & pl.col("external_id").is_not_null())
            .select(xk("external_id").alias("_xk"), pl.col("event_id").alias("_ext_op")),
        ]
    )
    # Lookups run on a narrow frame (ids only) and the two results are attached in row order, so the
    # wide events frame (names, ...) is never copied by a join; each is the first row of its key
    # (unique keep="first" + left join) found in a table indexed by the dense ids (first_rows).
    n = n.with_columns(ck("correlation").alias("_ck"), xk("external_id").alias("_xk"))
    launch_row = first_rows(runtime.get_column("_ck"), n.get_column("_ck"))
    ext_row = first_rows(by_ext.get_column("_xk"), n.get_column("_xk"))
    n = n.with_columns(
        runtime.get_column("event_id").gather(launch_row).alias("_launch"),
        by_ext.get_column("_ext_op").gather(ext_row),
    ).with_columns(
        pl.when(gpu).then(pl.col("_launch")).alias("launch_id"),
        pl.when(pl.col("kind") == "runtime")
        .then(pl.col("event_id"))
        .when(gpu)
        .then(pl.col("_launch"))
        .alias("_launch"),
    )
    ext_ok = pl.col("_ext_op").is_not_null() & (pl.col("external_id") != pl.col("correlation")).fill_null(True)
    # Containment only for the launches some row cannot link by External id, and only against the
    # ops of their threads (each point's answer depends on nothing else): on modern GPU traces most
    # launches carry a resolvable External id.
    n = n.with_columns(ek("_launch").alias("_lk"))
    need = n.filter(~ext_ok & pl.col("_launch").is_not_null()).select("_lk")
    points = runtime.join(need.unique(), left_on="_ek", right_on="_lk", how="semi").select(
        *key, pl.col("start_ns").alias("t"), pl.col("event_id").alias("_launch"), pl.col("_ek").alias("_lk")
    )
    # the points' threads numbered once: the ops of other threads dropped by the same join
    threads = points.select(key).unique(maintain_order=True).with_row_index("_g")
    ops = ops.join(threads, on=key, how="inner", maintain_order="left")
    points = points.join(threads, on=key, how="left", maintain_order="left")
    contained = innermost_enclosing(points, ops, tuple(key), thread_ids="_g")
    n = n.with_columns(
        contained.get_column("op")
        .gather(first_rows(contained.get_column("_lk"), n.get_column("_lk")))
        .alias("_launch_op")
    )
    op_id = pl.when(ext_ok).then(pl.col("_ext_op")).otherwise(pl.col("_launch_op"))
    n = n.select("_row", "launch_id", op_id.alias("op_id"))
    rows = n.get_column("_row")
    empty = pl.repeat(None, ev.height, dtype=ev.schema["event_id"], eager=True)
    return ev.with_columns(
        empty.scatter(rows, n.get_column("launch_id")).alias("launch_id"),
        empty.scatter(rows, n.get_column("op_id")).alias("op_id"),
    )
