"""Cross-rank collective matching, barrier wait, wait-free transfer and the straggler.

Calls are matched within their process group only (EP groups, expert-data-parallel groups and the
world each have their own sequence of calls): the group is the trace's process-group name, else
its ranks, else the world; calls on a group of one rank are not matched, nor, where the trace has
sub-groups it does not name, any call that names no group (:func:`_apart`).

A collective instance is identified by, in order of preference: ``(pg_name, Seq)`` when the trace
records ``Seq``; ``(Comms Id, step, ordinal)`` when it records a ``Comms Id``; else
``(pg_name, step, ordinal)`` — the ordinal of the call among the rank's calls of that process group
within the profiler step (anchoring on the step because profiler windows may start at different
collectives on different ranks).

Ordinal matching is only trusted when every rank of a (process group, step) made the same number
of calls and the matched calls have the same collective type; otherwise the whole (group, step) is
reported in ``misaligned`` and left out — a wrong pairing would produce wrong waits. A matched call
where some rank ends before the last rank arrived (impossible for a collective, beyond the clock
uncertainty) is also flagged (``causal`` False) and left out of the wait figures.

For matched call c with per-rank start s_r and end e_r (device or worker activity, clock-aligned):
a = max_r s_r, wait_r = a - s_r, transfer_r = e_r - max(s_r, a); the last arriver is the straggler
of the call (it has the shortest comm time).
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.steps import assign_step
from ep_trace.dtypes import itemsize_expr

__all__ = ["match_collectives", "measure_calls", "splits_long"]


def splits_long(coll: pl.DataFrame, which: str) -> pl.DataFrame:
    """One row per (call, peer) from a split list, group-local order mapped to global ranks.

    Args:
        coll: Collectives (with ``group_ranks`` filled where known).
        which: ``'in_splits'`` (rows sent to the peer) or ``'out_splits'`` (rows received from it).

    Returns:
        Columns ``rank, coll_id, peer, rows`` (calls whose list length differs from the group are
        skipped; truncated lists are skipped).
    """
    c = coll.filter(
        pl.col(which).is_not_null()
        & ~pl.col("splits_truncated")
        & (pl.col(which).list.len() == pl.col("_gr").list.len())
    ).select("rank", "coll_id", pl.col(which).alias("rows"), pl.col("_gr").alias("peer"))
    return c.explode(["rows", "peer"]).with_columns(pl.col("peer").cast(pl.Int32))


def _with_group(coll: pl.DataFrame, world: int) -> pl.DataFrame:
    """``_gr``: group ranks, or 0..n-1 when the list is absent and the split list covers the world."""
    n = pl.coalesce(pl.col("in_splits").list.len(), pl.col("out_splits").list.len())
    default = pl.int_ranges(0, n, dtype=pl.Int32)
    return coll.with_columns(
        pl.when(pl.col("group_ranks").is_not_null())
        .then(pl.col("group_ranks"))
        .when(n == world)
        .then(default)
        .otherwise(None)
        .alias("_gr")
    )


def match_collectives(coll: pl.DataFrame, windows: pl.DataFrame, world: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Give every collective row a ``match_id`` (null when it cannot be matched safely).

    Args:
        coll: Canonical collectives table.
        windows: Step windows.
        world: Number of ranks in the trace set.

    Returns:
        ``(coll, misaligned)``: the collectives with ``step, key, match_id``, ``_gr``, ``_pg`` (the
        group's key) and ``unmatched`` (``'group_of_one'`` or ``'unknown_group'``: kept apart by
        :func:`_apart`; else null) added; and
        one row per (pg, step) that could not be matched: ``pg_name, step, calls_per_rank`` (a
        ``rank -> count`` string) and ``reason``.
    """
    c = _with_group(coll, world).with_columns(pl.coalesce("cpu_start_ns", "start_ns").alias("_t"))
    c = assign_step(c, windows, "_t")
    c, alone = _apart(c, world)
    c = c.sort(["rank", "_pg", "_t"]).with_columns(
        pl.int_range(pl.len()).over(["rank", "_pg", "step"]).alias("_ord"),
        pl.int_range(pl.len()).over(["rank", "comms_id", "step"]).alias("_ord_c"),
    )
    key = (
        pl.when(pl.col("seq").is_not_null())
        .then(pl.lit("seq"))
        .when(pl.col("comms_id").is_not_null())
        .then(pl.lit("comms_id"))
        .otherwise(pl.lit("ordinal"))
    )
    kv = (
        pl.when(pl.col("seq").is_not_null())
        .then(pl.col("seq"))
        .when(pl.col("comms_id").is_not_null())
        .then(pl.col("_ord_c"))
        .otherwise(pl.col("_ord"))
    )
    kg = (
        pl.when(pl.col("comms_id").is_not_null() & pl.col("seq").is_null())
        .then(pl.col("comms_id").cast(pl.Utf8))
        .otherwise(pl.col("_pg"))
    )
    ks = pl.when(pl.col("seq").is_not_null()).then(None).otherwise(pl.col("step"))
    c = c.with_columns(key.alias("key"), kv.alias("_kv"), kg.alias("_kg"), ks.alias("_ks"))
    # ordinal-style keys: every rank of the (group, step) must have made the same number of calls,
    # and only ranks of the group (when the trace names them) may have made them
    ordk = c.filter(pl.col("key") != "seq")
    counts = ordk.group_by(["_kg", "_ks", "rank"]).agg(
        pl.len().alias("n"), (~pl.col("_gr").list.contains(pl.col("rank"))).any().fill_null(False).alias("_out")
    )
    bad = counts.group_by(["_kg", "_ks"]).agg(
        ((pl.col("n").n_unique() > 1) | pl.col("_out").any()).alias("_bad"),
        pl.format("{}:{}", "rank", "n").sort_by("rank").str.join(",").alias("calls_per_rank"),
        pl.when(pl.col("_out").any())
        .then(pl.lit("ranks outside the group made calls on it"))
        .otherwise(pl.lit("ranks made different numbers of calls"))
        .alias("reason"),
    )
    c = c.join(bad.select("_kg", "_ks", "_bad"), on=["_kg", "_ks"], how="left", nulls_equal=True).with_columns(
        pl.col("_bad").fill_null(False)
    )
    mids = (
        c.filter(~pl.col("_bad"))
        .select("key", "_kg", "_ks", "_kv")
        .unique(maintain_order=True)
        .sort(["_ks", "_kg", "_kv"], nulls_last=True)
        .with_row_index("match_id")
        .with_columns(pl.col("match_id").cast(pl.Int64))
    )
    c = c.join(mids, on=["key", "_kg", "_ks", "_kv"], how="left", nulls_equal=True)
    # a match mixing collective types is a misalignment too
    mixed = (
        c.filter(pl.col("match_id").is_not_null())
        .group_by("match_id")
        .agg((pl.col("collective").n_unique() > 1).alias("_mx"))
    )
    mixed_ids = mixed.filter(pl.col("_mx"))["match_id"]
    misaligned = pl.concat(
        [
            bad.filter(pl.col("_bad")).select(
                pl.col("_kg").alias("pg_name"),
                pl.col("_ks").alias("step"),
                "calls_per_rank",
                "reason",
            ),
            c.filter(pl.col("match_id").is_in(mixed_ids.implode()))
            .group_by(["_kg", "_ks"])
            .agg(pl.format("{}:{}", "rank", "collective").str.join(",").alias("calls_per_rank"))
            .select(
                pl.col("_kg").alias("pg_name"),
                pl.col("_ks").alias("step"),
                "calls_per_rank",
                pl.lit("matched calls have different collective types").alias("reason"),
            ),
        ]
    )
    c = c.with_columns(
        pl.when(pl.col("match_id").is_in(mixed_ids.implode()))
        .then(None)
        .otherwise(pl.col("match_id"))
        .alias("match_id")
    )
    c = pl.concat([c, alone.with_columns(pl.lit(None, pl.Int64).alias("match_id"))], how="diagonal_relaxed")
    return c.drop(["_ord", "_ord_c", "_kv", "_ks", "_bad", "_t"]), misaligned


def _apart(c: pl.DataFrame, world: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(calls to match, calls kept apart)``, each with ``_pg`` (the group's key) and ``unmatched``.

    Matching is within a process group: ``_pg`` is its name, else its ranks (``ranks:0,1``; the
    sidecar's lists), else ``<default>`` (one group: the world). Kept apart, never matched:

    * a call on a group of one rank (an expert-parallel size of 1): nothing crosses ranks, no wait;
    * where some call's group is smaller than the trace set and the trace does not name it (a gloo
      all-to-all with split lists of 2 in a 4-rank world and no ``pg_config`` to tell its worker
      thread's group), every call whose group the trace does not name: the job has sub-groups, so an
      unnamed all-reduce may be an expert-data-parallel one as well as the world's, and pairing them
      by order across every rank pairs calls of different groups (the EP-2 gloo test trace without
      ``pg_config``: rank 0 charged 61.7 ms of waiting for rank 3, with which it shares no group but
      the world, where it waits 0.51 ms).
    """
    lists = [pl.when(~pl.col("splits_truncated")).then(pl.col(c).list.len()) for c in ("in_splits", "out_splits")]
    size = pl.coalesce(pl.col("group_size"), pl.col("_gr").list.len(), *lists).cast(pl.Int64)
    named = pl.col("pg_name").is_not_null() | pl.col("group_ranks").is_not_null()
    unnamed_sub = (~named & (size < world)).any()
    why = pl.when(size == 1).then(pl.lit("group_of_one")).when(~named & unnamed_sub).then(pl.lit("unknown_group"))
    key = pl.coalesce(
        "pg_name", pl.lit("ranks:") + pl.col("group_ranks").cast(pl.List(pl.Utf8)).list.join(","), pl.lit("<default>")
    )
    c = c.with_columns(key.alias("_pg"), why.alias("unmatched"), size.cast(pl.Int32).alias("group_size"))
    return c.filter(pl.col("unmatched").is_null()), c.filter(pl.col("unmatched").is_not_null())


def _peer_arrival(m: pl.DataFrame) -> pl.DataFrame:
    """Per (call, rank): ``_ar``, the arrival the rank really waits for, and ``_wf``, whom it waits for.

    In an all-to-allv a rank only waits for the peers it exchanges rows with (kineto.md §10.4): a
    rank that sends nothing to and receives nothing from the last arriver can finish before it
    arrives. So where the rank's own split lists are known, ``_ar`` = max start over itself and its
    peers with a non-zero split either way; elsewhere (no splits, truncated lists) the call's last
    arrival ``_a``. ``_wf`` is the peer that arrived at ``_ar`` (the rank itself when it came last).
    """
    known = splits_long(m, "in_splits").select("rank", "coll_id").unique()
    pairs = (
        pl.concat([splits_long(m, "in_splits"), splits_long(m, "out_splits")])
        .filter(pl.col("rows") > 0)
        .select("rank", "coll_id", "peer")
        .unique()
        .join(m.select("rank", "coll_id", "match_id"), on=["rank", "coll_id"])
        .join(m.select("match_id", pl.col("rank").alias("peer"), pl.col("s").alias("_ps")), on=["match_id", "peer"])
    )
    peer = pairs.group_by(["rank", "coll_id"]).agg(
        pl.col("_ps").max().alias("_ap"), pl.col("peer").sort_by("_ps").last().alias("_apr")
    )
    last = pl.col("rank").sort_by("s").last().over("match_id")
    m = m.join(known.with_columns(pl.lit(True).alias("_known")), on=["rank", "coll_id"], how="left").join(
        peer, on=["rank", "coll_id"], how="left"
    )
    own = pl.col("_ap").is_null() | (pl.col("s") >= pl.col("_ap"))
    return m.with_columns(
        pl.when(pl.col("_known").is_null())
        .then(pl.col("_a"))
        .when(own)
        .then(pl.col("s"))
        .otherwise(pl.col("_ap"))
        .alias("_ar"),
        pl.when(pl.col("_known").is_null())
        .then(last)
        .when(own)
        .then(pl.col("rank"))
        .otherwise(pl.col("_apr"))
        .alias("_wf"),
    ).drop("_known", "_ap", "_apr")


def measure_calls(
    c: pl.DataFrame, ranks: pl.DataFrame, offsets: pl.DataFrame, tol_ns: int
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per matched call and per (call, rank): arrival, wait, transfer, skews, bytes, link class.

    Args:
        c: Output of :func:`match_collectives`.
        ranks: Canonical ranks table (``rank, host, world_size``).
        offsets: ``rank, offset_ns`` added to every time of the rank (clock alignment).
        tol_ns: Clock uncertainty: a rank ending more than this before the last arrival marks the
            call non-causal (a misalignment or a clock error), excluded from wait figures.

    Returns:
        ``(calls, call_ranks)`` as documented in :data:`ep_trace.analysis.result.FRAME_DOCS`.
    """
    m = (
        c.filter(pl.col("match_id").is_not_null())
        .join(offsets, on="rank", how="left")
        .with_columns(
            (pl.col("start_ns") + pl.col("offset_ns").fill_null(0)).alias("s"),
            (pl.col("end_ns") + pl.col("offset_ns").fill_null(0)).alias("e"),
        )
    )
    isz = itemsize_expr(pl.col("dtype"))
    rb = pl.coalesce("row_bytes", isz)
    sent_l = splits_long(m, "in_splits").join(m.select("rank", "coll_id", "row_bytes"), on=["rank", "coll_id"])
    self_rows = sent_l.filter(pl.col("peer") == pl.col("rank")).select("rank", "coll_id", pl.col("rows").alias("_self"))
    m = m.join(self_rows, on=["rank", "coll_id"], how="left").join(
        ranks.select("rank", "host", "world_size"), on="rank", how="left"
    )
    m = m.with_columns(
        pl.coalesce(pl.col("in_splits").list.sum() * rb, pl.col("in_nelems") * isz).alias("bytes_sent"),
        pl.coalesce(pl.col("out_splits").list.sum() * rb, pl.col("out_nelems") * isz).alias("bytes_recv"),
    ).with_columns(
        (pl.col("bytes_sent") - pl.col("_self").fill_null(0) * rb.fill_null(0)).alias("cross_rank_bytes_sent"),
        pl.col("s").max().over("match_id").alias("_a"),
    )
    m = _peer_arrival(m).with_columns(
        (pl.col("_ar") - pl.col("s")).alias("wait_ns"),
        (pl.col("e") - pl.max_horizontal("s", "_ar")).alias("_tr"),
    )
    call_ranks = m.select(
        "match_id",
        "rank",
        "step",
        pl.col("s").alias("start_ns"),
        pl.col("e").alias("end_ns"),
        pl.col("_ar").alias("arrival_ns"),
        pl.col("_wf").alias("waited_for"),
        "wait_ns",
        pl.col("_tr").clip(0).alias("transfer_ns"),
        "bytes_sent",
        "bytes_recv",
        "cross_rank_bytes_sent",
    ).sort(["match_id", "rank"])
    expected = pl.coalesce(
        pl.col("group_size").max(), pl.col("_gr").list.len().max(), pl.col("world_size").max(), pl.len()
    ).cast(pl.Int64)
    calls = (
        m.sort(["match_id", "s", "rank"])
        .group_by("match_id", maintain_order=True)
        .agg(
            pl.col("collective").first(),
            pl.col("_pg").first().alias("pg_name"),
            pl.col("key").first(),
            pl.col("step").min(),
            pl.col("layer").drop_nulls().first(),
            pl.col("direction").drop_nulls().first(),
            pl.len().cast(pl.Int32).alias("n_ranks"),
            expected.alias("expected_ranks"),
            pl.col("rank").last().alias("last_rank"),
            pl.col("_a").first().alias("arrival_ns"),
            (pl.col("s").max() - pl.col("s").min()).alias("arrival_skew_ns"),
            (pl.col("e").max() - pl.col("e").min()).alias("end_skew_ns"),
            pl.col("_tr").min().clip(0).alias("transfer_ns"),
            (pl.col("_a").first() - pl.col("s").sort().reverse().get(1, null_on_oob=True))
            .fill_null(0)
            .alias("lateness_ns"),
            pl.max_horizontal(pl.col("bytes_sent").max(), pl.col("bytes_recv").max()).alias("bytes_max"),
            pl.col("cross_rank_bytes_sent").sum().alias("cross_rank_bytes"),
            pl.col("bytes_sent").sum().alias("logical_bytes"),
            (pl.col("e") >= pl.col("_ar") - tol_ns).all().alias("causal"),
            pl.col("host").n_unique().alias("_nh"),
            pl.col("host").null_count().alias("_hn"),
        )
        .with_columns(
            (pl.col("n_ranks") >= pl.col("expected_ranks")).alias("complete"),
            pl.when(pl.col("_hn") > 0)
            .then(pl.lit("unknown"))
            .when(pl.col("_nh") > 1)
            .then(pl.lit("inter_host"))
            .otherwise(pl.lit("intra_host"))
            .alias("link_class"),
            pl.when(pl.col("transfer_ns") > 0)
            .then(pl.col("bytes_max") / pl.col("transfer_ns"))
            .otherwise(None)
            .alias("bandwidth_gbps"),
        )
        .with_columns((pl.col("complete") & pl.col("causal") & (pl.col("n_ranks") > 1)).alias("valid"))
        .drop(["_nh", "_hn"])
    )
    return calls, call_ranks
