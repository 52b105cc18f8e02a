"""The placement in force at each (step, layer): the recorded one, which may change during a run.

The canonical ``placement`` table holds the placement at the start (``first_step`` null: the sidecar's
``meta.placement``, a routing dump's map; ``layer`` null = every layer) and each later re-placement of a
layer (``first_step`` = the first step that runs it: the sidecar's ``placement`` records, written when an
EPLB rearrangement or ``ep-trace demo --alt-placement`` changes a layer's placement). docs/sidecar.md's
rule: the placement of (step s, layer l) is that of the last record of layer l with ``first_step`` <= s,
else the one at the start. A record of every layer (``layer`` null) from a step on is read the same way;
where one of layer l and one of every layer start at the same step, layer l's wins.

A placement that does not hold every expert on a rank of the EP group is no placement of the layer: such
keys, and keys with none recorded, fall back on the contiguous default (``recorded`` False), which the
ownership invariant does not check against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from ep_trace.analysis import placement as plm

__all__ = ["InForce", "in_force"]

_REC = ["_rl", "_fs"]  # a record: (layer or null, first_step or null)
_KEY_SCHEMA = pl.Schema({"step": pl.Int64, "layer": pl.Int32, "rec": pl.Int32, "recorded": pl.Boolean})


@dataclass(frozen=True)
class InForce:
    """The placement in force at each analysed (step, layer).

    Attributes:
        keys: ``step, layer, rec, recorded``: the placement of the key (``rec`` indexes ``rows``; -1 = the
            contiguous default, not recorded).
        rows: ``rec, expert, rank`` (one row per copy), the default's as ``rec`` -1.
        main: The placement most keys run (on a tie, the one of the earliest key): the report's "current".
        distinct: How many different placements the keys run.
    """

    keys: pl.DataFrame
    rows: pl.DataFrame
    main: plm.Placement
    distinct: int

    @property
    def recorded(self) -> bool:
        """At least one key runs a recorded placement."""
        return bool(self.keys["recorded"].any())

    def per_key(self, recorded_only: bool = False) -> pl.DataFrame:
        """``step, layer, expert, rank`` of every key (only those with a recorded placement when asked)."""
        k = self.keys.filter(pl.col("recorded")) if recorded_only else self.keys
        return k.join(self.rows, on="rec").select("step", "layer", "expert", "rank")

    def route(self, counts: pl.DataFrame, node_of: dict[int, int]) -> pl.DataFrame:
        """:func:`~ep_trace.analysis.placement.route` of each count under the placement of its key."""
        c = counts.join(self.keys.select("step", "layer", "rec"), on=["step", "layer"], how="inner")
        return plm.route_rows(c, self.rows, node_of, by=("rec",))


def _chosen(records: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """``step, layer, _rl, _fs``: the record (of ``records``' ``_rl, _fs``) in force at each key (module
    doc), keys without one left out."""
    recs = records.select(_REC).unique()
    k = keys.sort("step")
    dated = recs.filter(pl.col("_fs").is_not_null()).sort("_fs")
    start = recs.filter(pl.col("_fs").is_null())
    of_layer = k.join_asof(
        dated.filter(pl.col("_rl").is_not_null()),
        left_on="step",
        right_on="_fs",
        by_left="layer",
        by_right="_rl",
        strategy="backward",
        check_sortedness=False,  # sorted by _fs above, so within each layer too
    ).with_columns(pl.when(pl.col("_fs").is_not_null()).then(pl.col("layer")).alias("_rl"))
    of_all = k.join_asof(dated.filter(pl.col("_rl").is_null()), left_on="step", right_on="_fs", strategy="backward")
    cands = [
        of_layer.filter(pl.col("_fs").is_not_null()),
        of_all.filter(pl.col("_fs").is_not_null()),
        k.join(start.filter(pl.col("_rl").is_not_null()), left_on="layer", right_on="_rl").with_columns(
            pl.col("layer").alias("_rl")
        ),
        k.join(start.filter(pl.col("_rl").is_null()), how="cross"),
    ]
    c = pl.concat(
        [x.select("step", "layer", pl.col("_rl").cast(pl.Int32), pl.col("_fs").cast(pl.Int64)) for x in cands]
    )
    latest = [pl.col("_fs").fill_null(-(2**62)), pl.col("_rl").is_not_null()]  # the start before any step
    return c.sort("step", "layer", *latest).group_by("step", "layer", maintain_order=True).last()


def _complete(rows: pl.DataFrame, num_experts: int) -> pl.DataFrame:
    """The records (``_rl, _fs``) of ``rows`` (copies on the EP group's ranks) that hold every expert 0..E-1."""
    n = rows.group_by(_REC).agg(pl.col("expert").n_unique().alias("_n"))
    return n.filter(pl.col("_n") == num_experts).select(_REC)


def in_force(placement: pl.DataFrame, keys: pl.DataFrame, num_experts: int, group: Sequence[int]) -> InForce:
    """The placement in force at each of ``keys`` (module doc).

    Args:
        placement: Canonical ``placement``.
        keys: ``step, layer`` to resolve (the analysed steps' routing keys).
        num_experts: E.
        group: The EP group's global ranks, in group order.
    """
    keys = keys.select(pl.col("step").cast(pl.Int64), pl.col("layer").cast(pl.Int32)).unique().sort("step", "layer")

    def col(c: str, t: type[pl.DataType]) -> pl.Expr:  # absent = null: a hand-built frame of one placement
        return (pl.col(c) if c in placement.columns else pl.lit(None)).cast(t)

    rows = placement.select(
        col("layer", pl.Int32).alias("_rl"), col("first_step", pl.Int64).alias("_fs"), "expert", "rank"
    ).filter(pl.col("rank").is_in(list(group)) & pl.col("expert").is_between(0, num_experts - 1))
    rows = rows.join(_complete(rows, num_experts), on=_REC, how="semi", nulls_equal=True)
    chosen = (
        _chosen(rows, keys) if rows.height else pl.DataFrame(schema={**keys.schema, "_rl": pl.Int32, "_fs": pl.Int64})
    )
    # one id per distinct placement (two records of the same placement, as an A/B run's flips back, are one)
    sig = (
        rows.group_by(*_REC, "expert")
        .agg(pl.col("rank").sort().cast(pl.Utf8).str.join(","))
        .sort("expert")
        .group_by(_REC)
        .agg(pl.col("rank").str.join(";").alias("_sig"))
    )
    ids = sig.select("_sig").unique().sort("_sig").with_row_index("rec").with_columns(pl.col("rec").cast(pl.Int32))
    rec_of = sig.join(ids, on="_sig").select(*_REC, "rec")
    k = keys.join(chosen.join(rec_of, on=_REC, how="left", nulls_equal=True), on=["step", "layer"], how="left")
    k = k.with_columns(pl.col("rec").is_not_null().alias("recorded"), pl.col("rec").fill_null(-1)).select(
        list(_KEY_SCHEMA)
    )
    default = plm.contiguous(num_experts, group).frame().with_columns(pl.lit(-1, dtype=pl.Int32).alias("rec"))
    recorded_rows = rows.join(rec_of, on=_REC, nulls_equal=True).select("rec", "expert", "rank").unique()
    all_rows = pl.concat([recorded_rows, default.select("rec", "expert", "rank")]).sort("rec", "expert", "rank")
    used = (
        k.group_by("rec")
        .agg(pl.len().alias("_n"), pl.col("step").min().alias("_s"))
        .sort(["_n", "_s", "rec"], descending=[True, False, False])
    )
    main_rec = int(used["rec"][0]) if used.height else -1
    return InForce(k.cast(_KEY_SCHEMA), all_rows, _placement_of(all_rows, main_rec, num_experts, group), used.height)


def _placement_of(rows: pl.DataFrame, rec: int, num_experts: int, group: Sequence[int]) -> plm.Placement:
    own: list[list[int]] = [[] for _ in range(num_experts)]
    for e, r in rows.filter(pl.col("rec") == rec).select("expert", "rank").iter_rows():
        own[int(e)].append(int(r))
    return plm.Placement(tuple(tuple(sorted(o)) for o in own), tuple(group))
