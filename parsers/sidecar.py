"""Reader of the ep-trace sidecar ``rank{r}.ep.jsonl`` (docs/sidecar.md) and its merge into tables.

The sidecar holds what Kineto cannot: exact per-expert routing counts, full (never truncated) split
lists of every all-to-all, the expert placement and rank metadata. Merging one rank's sidecar:

* ``ranks``: null columns are filled from the ``meta`` records (later ``meta`` records update
  earlier ones key by key); ``has_sidecar`` = True, ``rank_source`` unchanged;
* ``routing_counts`` from ``routing`` records (one row per expert);
* ``routing_matrix`` from ``a2a`` records of direction ``dispatch`` / ``combine`` and phase
  ``fwd``: this rank's row of the count matrix (src = this rank, dst = ``group_ranks[j]``,
  rows = ``send_splits[j]``), ``source = 'sidecar'``; ``count`` exchanges are not token traffic
  and ``bwd`` records (the backward's transposed all-to-alls, carrying gradients back) would count
  every token again in the opposite direction, so both are left out;
* ``placement`` from ``meta.placement`` (``first_step`` null) and the ``placement`` records (each with
  its ``layer`` and ``first_step`` = the record's ``step``: the layer runs it from that step on);
* ``collectives``: each all-to-all(v) call is matched to the ``a2a`` record whose host window
  ``[start_ns, end_ns]`` (``time.time_ns`` around the call, same epoch clock as Kineto) contains
  the call's host start (when no window matches at all and the counts agree, by order); the
  record's layer / direction annotate it and its full split lists replace truncated or missing
  ones (``splits_source = 'sidecar'``).

Malformed lines are errors naming the line, except a cut-short last line (a crash mid-write), which
is skipped with a warning. Unknown record types and keys are ignored; a ``v`` newer than
:data:`SIDECAR_VERSION` is rejected.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from ep_trace import schema
from ep_trace.errors import TraceFormatError
from ep_trace.parsers.json_guard import check_json_line
from ep_trace.trace_files import SIDECAR_VERSION

__all__ = ["SIDECAR_VERSION", "Sidecar", "read_sidecar", "merge_sidecar", "read_workload"]

_META_TO_RANKS = {
    "world_size": "world_size",
    "host": "host",
    "local_rank": "local_rank",
    "device": "device",
    "cpu_cores": "cpu_cores",
    "host_cores": "host_cores",
    "backend": "backend",
    "job_id": "job_id",
    "ep_group_ranks": "ep_group_ranks",
    "hidden_size": "hidden_size",
    "dtype": "dtype",
    "num_experts": "num_experts",
    "top_k": "top_k",
    "torch_version": "torch_version",
    "ep_trace_version": "ep_trace_version",
}


@dataclass(frozen=True)
class Sidecar:
    """One parsed sidecar file.

    Attributes:
        path: The file.
        meta: Merged ``meta`` records.
        routing: ``routing`` records in file order.
        a2a: ``a2a`` records in file order.
        issues: Warnings (e.g. a cut-short last line).
        routing_lines, a2a_lines: The 1-based line of each ``routing`` / ``a2a`` record (named in
            errors; empty for a Sidecar built in memory).
        placements: ``placement`` records (a layer re-placed from a step on) in file order;
            ``placement_lines`` their lines.
    """

    path: str
    meta: dict[str, Any]
    routing: list[dict[str, Any]] = field(default_factory=list)
    a2a: list[dict[str, Any]] = field(default_factory=list)
    issues: tuple[schema.LoadIssue, ...] = ()
    routing_lines: tuple[int, ...] = ()
    a2a_lines: tuple[int, ...] = ()
    placements: list[dict[str, Any]] = field(default_factory=list)
    placement_lines: tuple[int, ...] = ()

    @property
    def rank(self) -> int | None:
        """Rank the sidecar belongs to (``meta.rank``)."""
        r = self.meta.get("rank")
        return r if isinstance(r, int) else None


def read_sidecar(path: str | Path) -> Sidecar:
    """Parse a ``rank{r}.ep.jsonl`` file.

    Raises:
        TraceFormatError: a malformed line (not the last), a record without ``type``, a ``v`` newer
            than this reader, or no ``meta`` record.
    """
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    meta: dict[str, Any] = {}
    routing: list[dict[str, Any]] = []
    a2a: list[dict[str, Any]] = []
    placements: list[dict[str, Any]] = []
    issues: list[schema.LoadIssue] = []
    routing_lines: list[int] = []
    a2a_lines: list[int] = []
    placement_lines: list[int] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        check_json_line(path, line, i + 1)
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if i == len(lines) - 1:
                issues.append(
                    schema.LoadIssue(
                        str(path),
                        meta.get("rank"),
                        "warning",
                        f"last sidecar line {i + 1} is cut short (crash mid-write?); skipped",
                    )
                )
                break
            raise TraceFormatError(
                path,
                f"malformed JSON ({exc})",
                "the sidecar is corrupt; re-capture or delete it",
                record=f"line {i + 1}",
            ) from None
        if not isinstance(rec, dict) or "type" not in rec:
            raise TraceFormatError(
                path,
                "record without a 'type'",
                "the sidecar is corrupt; re-capture or delete it",
                record=f"line {i + 1}",
            )
        v = rec.get("v", 1)
        if not isinstance(v, int) or v > SIDECAR_VERSION:
            raise TraceFormatError(
                path,
                f"sidecar version {v!r} is newer than this reader ({SIDECAR_VERSION})",
                "upgrade ep-trace",
                record=f"line {i + 1}",
            )
        kind = rec["type"]
        if kind == "meta":
            meta.update({k: val for k, val in rec.items() if k not in ("type", "v")})
        elif kind == "routing":
            routing.append(rec)
            routing_lines.append(i + 1)
        elif kind == "a2a":
            a2a.append(rec)
            a2a_lines.append(i + 1)
        elif kind == "placement":
            placements.append(rec)
            placement_lines.append(i + 1)
    if not meta:
        raise TraceFormatError(path, "no 'meta' record", "the sidecar is corrupt; re-capture or delete it")
    return Sidecar(
        str(path),
        meta,
        routing,
        a2a,
        tuple(issues),
        tuple(routing_lines),
        tuple(a2a_lines),
        placements,
        tuple(placement_lines),
    )


def read_workload(trace_dir: str | Path) -> dict[str, Any] | None:
    """The ``meta.workload`` object of the lowest-ranked sidecar in ``trace_dir`` (docs/sidecar.md), or None.

    Only ``meta`` records are decoded (the first lines of the file); a directory without sidecars, or
    sidecars without a ``workload`` key, gives None.
    """
    d = Path(trace_dir)
    if not d.is_dir():
        return None
    files = sorted(d.glob("rank*.ep.jsonl"), key=lambda p: (len(p.name), p.name))
    for f in files:
        with open(f, "rb") as fh:
            for i, line in enumerate(fh):
                try:
                    check_json_line(f, line, i + 1)  # (a line nested too deep: no workload from this file)
                    rec = orjson.loads(line)
                except (orjson.JSONDecodeError, TraceFormatError):
                    break
                if not isinstance(rec, dict) or rec.get("type") != "meta":
                    break
                wl = rec.get("workload")
                if isinstance(wl, dict):
                    return wl
    return None


def _routing_counts(sc: Sidecar, rank: int) -> pl.DataFrame:
    recs = [r for r in sc.routing if isinstance(r.get("expert_counts"), list)]
    if not recs:
        return schema.empty("routing_counts")
    df = pl.DataFrame(
        {
            "step": [r.get("step") for r in recs],
            "layer": [r.get("layer") for r in recs],
            "microbatch": [r.get("microbatch", 0) for r in recs],
            "count": [r["expert_counts"] for r in recs],
            # conservation facts of the decision (docs/sidecar.md), checked by the analysis (ep_invariants)
            **{k: [r.get(k) for r in recs] for k in ("tokens", "top_k", "dropped", "padded")},
        },
        schema={
            "step": pl.Int64,
            "layer": pl.Int32,
            "microbatch": pl.Int32,
            "count": pl.List(pl.Int64),
            **dict.fromkeys(("tokens", "top_k", "dropped", "padded"), pl.Int64),
        },
    )
    df = df.with_columns(pl.int_ranges(pl.col("count").list.len()).alias("expert")).explode("count", "expert")
    return schema.conform("routing_counts", df.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank")))


def _a2a_frame(sc: Sidecar) -> pl.DataFrame:
    cols = (
        "step",
        "layer",
        "microbatch",
        "direction",
        "phase",
        "call",
        "send_splits",
        "recv_splits",
        "row_bytes",
        "group_ranks",
        "start_ns",
        "end_ns",
        "link_delay_ns",
    )
    return pl.DataFrame(
        {c: [r.get(c) for r in sc.a2a] for c in cols},
        schema={
            "step": pl.Int64,
            "layer": pl.Int32,
            "microbatch": pl.Int32,
            "direction": pl.Utf8,
            "phase": pl.Utf8,
            "call": pl.Int64,
            "send_splits": pl.List(pl.Int64),
            "recv_splits": pl.List(pl.Int64),
            "row_bytes": pl.Int64,
            "group_ranks": pl.List(pl.Int32),
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
            "link_delay_ns": pl.Int64,
        },
    ).with_columns(
        pl.col("microbatch").fill_null(0), pl.col("phase").fill_null("fwd")
    )  # absent before sidecar phase existed


def _routing_matrix(a2a: pl.DataFrame, rank: int) -> pl.DataFrame:
    df = a2a.filter(
        pl.col("direction").is_in(["dispatch", "combine"])
        & (pl.col("phase") == "fwd")
        & pl.col("send_splits").is_not_null()
        & pl.col("group_ranks").is_not_null()
    )
    if df.height == 0:
        return schema.empty("routing_matrix")
    df = df.filter(pl.col("send_splits").list.len() == pl.col("group_ranks").list.len())
    df = df.select(
        "step",
        "layer",
        "microbatch",
        "direction",
        "row_bytes",
        pl.when(pl.col("layer").is_null())
        .then(pl.col("call").rank("ordinal").over("step", "direction").cast(pl.Int64) - 1)
        .otherwise(0)
        .alias("call"),
        pl.col("send_splits").alias("rows"),
        pl.col("group_ranks").alias("dst"),
    ).explode("rows", "dst")
    df = df.with_columns(pl.lit(rank, dtype=pl.Int32).alias("src"), pl.lit("sidecar").alias("source"))
    return schema.conform("routing_matrix", df)


def _placement(sc: Sidecar) -> pl.DataFrame:
    pl_ = sc.meta.get("placement")
    if not isinstance(pl_, list):
        return schema.empty("placement")
    experts = [e for e, owners in enumerate(pl_) for _ in (owners if isinstance(owners, list) else [])]
    owners = [r for o in pl_ for r in (o if isinstance(o, list) else [])]
    return schema.conform(
        "placement", pl.DataFrame({"expert": experts, "rank": owners}, schema={"expert": pl.Int32, "rank": pl.Int32})
    )


def _placement_records(sc: Sidecar) -> pl.DataFrame:
    """The ``placement`` records' rows: ``layer``, ``first_step`` (the record's ``step``), ``expert``, ``rank``.

    The records passed :mod:`~ep_trace.parsers.sidecar_checks` before the merge (types, ranges, replicas
    only as the record's own ``redundant_experts`` declares).
    """
    rows: list[tuple[int, int, int, int]] = []
    for rec in sc.placements:
        step, layer = rec["step"], rec["layer"]
        rows += [(layer, step, e, r) for e, o in enumerate(rec["placement"]) for r in o]
    if not rows:
        return schema.empty("placement")
    df = pl.DataFrame(
        rows,
        schema={"layer": pl.Int32, "first_step": pl.Int64, "expert": pl.Int32, "rank": pl.Int32},
        orient="row",
    )
    return schema.conform("placement", df)


def _annotate_collectives(colls: pl.DataFrame, a2a: pl.DataFrame) -> pl.DataFrame:
    if colls.height == 0 or a2a.height == 0:
        return colls
    is_a2a = pl.col("collective").is_in(["all_to_all", "all_to_allv"]) & pl.col("cpu_start_ns").is_not_null()
    right = (
        a2a.select(
            pl.col("start_ns").alias("_a_start"),
            pl.col("end_ns").alias("_a_end"),
            pl.col("layer").alias("_layer"),
            pl.col("direction").alias("_dir"),
            pl.col("send_splits").alias("_send"),
            pl.col("recv_splits").alias("_recv"),
            pl.col("row_bytes").alias("_rb"),
            pl.col("group_ranks").alias("_gr"),
            pl.col("link_delay_ns").alias("_delay"),
        )
        .drop_nulls(["_a_start"])
        .sort("_a_start")
    )
    left = colls.with_row_index("_i")
    cand = (
        left.filter(is_a2a)
        .sort("cpu_start_ns")
        .join_asof(right, left_on="cpu_start_ns", right_on="_a_start", strategy="backward")
    )
    cand = cand.filter(pl.col("cpu_start_ns") <= pl.col("_a_end")).select(
        "_i", "_layer", "_dir", "_send", "_recv", "_rb", "_gr", "_delay"
    )
    calls = left.filter(is_a2a).sort("cpu_start_ns")
    if cand.height == 0 and calls.height == right.height:
        # Host clocks that do not line up (e.g. a trace re-based by another tool): pair by order.
        cand = pl.concat(
            [
                calls.select("_i"),
                right.sort("_a_start").select("_layer", "_dir", "_send", "_recv", "_rb", "_gr", "_delay"),
            ],
            how="horizontal",
        )
    out = left.join(cand, on="_i", how="left")
    hit = pl.col("_send").is_not_null()
    replace_splits = hit & (pl.col("splits_truncated") | pl.col("in_splits").is_null())
    out = out.with_columns(
        pl.coalesce("layer", "_layer").alias("layer"),
        pl.coalesce("direction", "_dir").alias("direction"),
        pl.when(replace_splits).then(pl.col("_send")).otherwise(pl.col("in_splits")).alias("in_splits"),
        pl.when(replace_splits).then(pl.col("_recv")).otherwise(pl.col("out_splits")).alias("out_splits"),
        pl.when(replace_splits).then(pl.lit("sidecar")).otherwise(pl.col("splits_source")).alias("splits_source"),
        pl.when(replace_splits).then(False).otherwise(pl.col("splits_truncated")).alias("splits_truncated"),
        pl.coalesce("row_bytes", "_rb").alias("row_bytes"),
        pl.coalesce("group_ranks", "_gr").alias("group_ranks"),
        pl.coalesce("link_delay_ns", "_delay").alias("link_delay_ns"),
    )
    out = out.with_columns(
        pl.when(replace_splits & (pl.col("collective") == "all_to_all"))
        .then(pl.lit("all_to_allv"))
        .otherwise(pl.col("collective"))
        .alias("collective"),
        pl.coalesce("group_size", pl.col("group_ranks").list.len().cast(pl.Int32)).alias("group_size"),
    )
    return schema.conform("collectives", out.sort("_i"))


def merge_sidecar(tables: schema.TraceTables, sc: Sidecar) -> schema.TraceTables:
    """Merge one rank's sidecar into that rank's tables (see the module doc).

    Args:
        tables: Tables of exactly one rank.
        sc: Its sidecar.

    Returns:
        New validated tables.
    """
    rank = int(tables.ranks["rank"][0])
    ranks = tables.ranks
    fills = []
    for key, col in _META_TO_RANKS.items():
        v = sc.meta.get(key)
        if v is not None:
            fills.append(pl.coalesce(pl.col(col), pl.lit(pl.Series(col, [v], dtype=schema.RANKS[col]))).alias(col))
    ranks = ranks.with_columns(*fills, pl.lit(True).alias("has_sidecar"))
    a2a = _a2a_frame(sc)
    colls = _annotate_collectives(tables.collectives, a2a)
    src = str(sc.path)
    return replace(
        tables,
        ranks=schema.validate("ranks", schema.conform("ranks", ranks), src),
        collectives=schema.validate("collectives", colls, src),
        routing_counts=schema.validate(
            "routing_counts", pl.concat([tables.routing_counts, _routing_counts(sc, rank)]), src
        ),
        routing_matrix=schema.validate(
            "routing_matrix", pl.concat([tables.routing_matrix, _routing_matrix(a2a, rank)]), src
        ),
        placement=schema.validate(
            "placement",
            pl.concat([tables.placement, _placement(sc), _placement_records(sc)]).unique(maintain_order=True),
            src,
        ),
        load_report=tables.load_report + sc.issues,
    )
