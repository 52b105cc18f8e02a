"""The EP invariants the routing counts make checkable, reported before any performance figure.

A silent mis-routing is worse than a slow layer, so the report and the summary state these first:

* ``assignment_conservation`` — every routing decision assigns tokens x top-k slots: per (rank,
  step, layer, micro-batch) Σ_e count = tokens x top_k - dropped + padded (``routing_counts.tokens`` /
  ``top_k`` / ``dropped`` / ``padded``, where recorded: ``dropped`` assignments are not in the counts,
  ``padded`` ones are, docs/sidecar.md); and every counted assignment is dispatched once: per (step,
  layer, source rank) the rows it sends in the forward dispatch (``count_matrix``) = Σ_e count (drops
  and padding named with their totals when recorded; the ingest refuses a sidecar whose records
  contradict themselves, this checks records against the all-to-alls).
* ``ownership`` — every expert's tokens land on a rank that holds it under the recorded placement in
  force at that step (:mod:`~ep_trace.analysis.placement_in_force`: a layer may be re-placed during the
  run): per (step, layer, source, destination) the rows sent lie between the assignments to experts only
  the destination holds and the assignments to experts it holds at all (equal without replicas).
* ``split_consistency`` — rank i's send split to j equals rank j's receive split from i
  (:func:`~ep_trace.analysis.imbalance.split_violations`).

Each check is ``ok``, ``violated`` or ``not_checked`` (with why).
"""

from __future__ import annotations

import polars as pl

__all__ = ["INVARIANT_SCHEMA", "ep_invariants"]

INVARIANT_SCHEMA = {
    "check": pl.Utf8,
    "status": pl.Utf8,
    "checked": pl.Int64,
    "violations": pl.Int64,
    "detail": pl.Utf8,
}


def _row(check: str, status: str, checked: int, violations: int, detail: str) -> tuple[str, str, int, int, str]:
    return (check, status, checked, violations, detail)


def _router_sums(rc: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step, layer, microbatch): Σ count, tokens x top_k, dropped, padded."""
    cols = rc.columns
    opt = [c for c in ("tokens", "top_k", "dropped", "padded") if c in cols]
    return rc.group_by("rank", "step", "layer", "microbatch").agg(
        pl.col("count").sum().alias("_sum"), *[pl.col(c).first() for c in opt]
    )


def _conservation(rc: pl.DataFrame, cm: pl.DataFrame) -> tuple[str, str, int, int, str]:
    name = "assignment_conservation"
    if rc.is_empty():
        return _row(name, "not_checked", 0, 0, "no routing counts (no sidecar routing records or routing dump)")
    d = _router_sums(rc).with_columns(
        *(pl.col(c).fill_null(0) if c in rc.columns else pl.lit(0, pl.Int64).alias(c) for c in ("dropped", "padded"))
    )
    parts, checked, bad = [], 0, 0
    drops, pads = int(d["dropped"].sum()), int(d["padded"].sum())
    named = (f", {drops} dropped" if drops else "") + (f", {pads} padding" if pads else "")
    if "tokens" in d.columns and "top_k" in d.columns:
        known = d.filter(pl.col("tokens").is_not_null() & pl.col("top_k").is_not_null())
        expect = pl.col("tokens") * pl.col("top_k") - pl.col("dropped") + pl.col("padded")
        off = known.filter(pl.col("_sum") != expect)
        checked += known.height
        bad += off.height
        if known.height:
            rule = "tokens × top_k" + (" − dropped + padded" if drops or pads else "")
            parts.append(f"{known.height} routing decisions: Σ counts = {rule} in {known.height - off.height}{named}")
        if off.height:
            r = off.sort("rank", "step", "layer", "microbatch").row(0, named=True)
            adj = (f" − {r['dropped']} dropped" if r["dropped"] else "") + (
                f" + {r['padded']} padding" if r["padded"] else ""
            )
            parts.append(
                f"first off: rank {r['rank']} step {r['step']} layer {r['layer']}: {r['_sum']} assignments for "
                f"{r['tokens']} tokens × top-{r['top_k']}{adj}"
            )
    disp = cm.filter((pl.col("direction") == "dispatch") & pl.col("layer").is_not_null())
    if not disp.is_empty():
        sent = disp.group_by("step", "layer", pl.col("src").alias("rank")).agg(pl.col("rows").sum().alias("_sent"))
        cnt = d.group_by("rank", "step", "layer").agg(pl.col("_sum").sum())
        j = cnt.join(sent.with_columns(pl.col("rank").cast(pl.Int32)), on=["rank", "step", "layer"], how="inner")
        off = j.filter(pl.col("_sent") != pl.col("_sum"))
        checked += j.height
        bad += off.height
        parts.append(f"{j.height} (step, layer, rank) dispatches: rows sent = Σ counts in {j.height - off.height}")
        if off.height:
            r = off.sort("step", "layer", "rank").row(0, named=True)
            parts.append(
                f"first off: rank {r['rank']} step {r['step']} layer {r['layer']} sent {r['_sent']} rows for "
                f"{r['_sum']} assignments"
            )
    if checked == 0:
        return _row(
            name, "not_checked", 0, 0, "routing counts without tokens / top-k and no dispatch count matrix per layer"
        )
    return _row(name, "violated" if bad else "ok", checked, bad, "; ".join(parts))


def _ownership(rc: pl.DataFrame, cm: pl.DataFrame, owners: pl.DataFrame | None) -> tuple[str, str, int, int, str]:
    name = "ownership"
    if rc.is_empty():
        return _row(name, "not_checked", 0, 0, "no routing counts")
    if owners is None or owners.is_empty():
        return _row(
            name, "not_checked", 0, 0, "no expert placement recorded (sidecar meta.placement or a routing dump's map)"
        )
    disp = cm.filter((pl.col("direction") == "dispatch") & pl.col("layer").is_not_null())
    if disp.is_empty():
        return _row(name, "not_checked", 0, 0, "no dispatch count matrix per layer")
    key = ["step", "layer", "expert"]
    own = owners.select(pl.col("step").cast(pl.Int64), pl.col("layer").cast(pl.Int32), "expert", "rank")
    ncopies = own.group_by(key).agg(pl.len().alias("_n"))
    per = rc.group_by("step", "layer", pl.col("rank").alias("src"), "expert").agg(pl.col("count").sum())
    per = per.join(own.rename({"rank": "dst"}), on=key).join(ncopies, on=key)
    bounds = per.group_by("step", "layer", "src", "dst").agg(
        pl.col("count").sum().alias("_hi"), pl.col("count").filter(pl.col("_n") == 1).sum().alias("_lo")
    )
    sent = disp.group_by("step", "layer", "src", "dst").agg(pl.col("rows").sum().alias("_rows"))
    # the (step, layer)s with both counts and a recorded placement
    steps = rc.select("step", "layer").unique().join(own.select("step", "layer").unique(), on=["step", "layer"])
    j = (
        sent.with_columns(pl.col("src").cast(pl.Int32), pl.col("dst").cast(pl.Int32))
        .join(steps, on=["step", "layer"], how="semi")
        .join(bounds, on=["step", "layer", "src", "dst"], how="full", coalesce=True)
        .with_columns(pl.col("_rows").fill_null(0), pl.col("_hi").fill_null(0), pl.col("_lo").fill_null(0))
        .join(sent.select("step", "layer").unique(), on=["step", "layer"], how="semi")
    )
    off = j.filter((pl.col("_rows") < pl.col("_lo")) | (pl.col("_rows") > pl.col("_hi")))
    detail = f"{j.height} (step, layer, source, destination) pairs: rows within the placement's bounds in {j.height - off.height}"
    if off.height:
        r = off.sort("step", "layer", "src", "dst").row(0, named=True)
        detail += (
            f"; first off: step {r['step']} layer {r['layer']}: rank {r['src']} sent {r['_rows']} rows to rank "
            f"{r['dst']}, whose experts were assigned {r['_lo']}..{r['_hi']}"
        )
    return _row(name, "violated" if off.height else "ok", j.height, off.height, detail)


def ep_invariants(
    routing_counts: pl.DataFrame,
    count_matrix: pl.DataFrame,
    split_violations: pl.DataFrame,
    owners: pl.DataFrame | None,
    n_split_pairs: int,
) -> pl.DataFrame:
    """The three checks (module doc), one row each (:data:`INVARIANT_SCHEMA`).

    Args:
        routing_counts: Canonical ``routing_counts``.
        count_matrix: ``Analysis.count_matrix``.
        split_violations: ``Analysis.split_violations``.
        owners: ``step, layer, expert, rank``: the recorded placement in force at each (step, layer) the
            counts are checked against (:meth:`~ep_trace.analysis.placement_in_force.InForce.per_key`);
            None or empty: none recorded (not checked).
        n_split_pairs: (call, pair) split pairs compared (for the ``checked`` column).
    """
    rc = routing_counts
    cm = count_matrix.filter(pl.col("source") == "sidecar") if "source" in count_matrix.columns else count_matrix
    cm = cm if not cm.is_empty() else count_matrix
    v = split_violations.height
    split = (
        _row(
            "split_consistency",
            "violated" if v else "ok",
            n_split_pairs,
            v,
            f"{n_split_pairs} send / receive split pairs compared, {v} disagree",
        )
        if n_split_pairs
        else _row(
            "split_consistency", "not_checked", 0, 0, "no call recorded both its send and its peer's receive splits"
        )
    )
    rows = [_conservation(rc, cm), _ownership(rc, cm, owners), split]
    return pl.DataFrame(rows, schema=INVARIANT_SCHEMA, orient="row")
