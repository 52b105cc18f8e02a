"""The placement plan of a trace: the recorded placement, the two proposals, and what each does to
every rank's expert load and to the bytes that cross nodes (:mod:`~ep_trace.analysis.placement`).

The counts are ``routing_counts`` of the analysed steps summed over micro-batches; the recorded
placement is the one in force at each analysed (step, layer) (:mod:`~ep_trace.analysis.placement_in_force`:
the sidecar's ``meta.placement`` or a routing dump's map, then the sidecar's ``placement`` records), else
Megatron-Core's / vLLM's default of contiguous blocks (``placement_recorded`` False: the report says it
was assumed). The ``current`` scenario routes each step's counts under the placement it ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import polars as pl

from ep_trace.analysis import placement as plm
from ep_trace.analysis.placement_in_force import InForce, in_force
from ep_trace.dtypes import itemsize

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

__all__ = ["PlacementPlan", "PlacementProposal", "build_plan", "scenario_stats", "PER_RANK_SCHEMA", "SCENARIOS"]

#: The what-ifs of the plan, in report order (``current`` is the recorded placement).
SCENARIOS = ("placement", "node_local")

PER_RANK_SCHEMA: dict[str, PolarsDataType] = {
    "scenario": pl.Utf8,
    "rank": pl.Int32,
    "node": pl.Utf8,
    "experts": pl.List(pl.Int32),
    "load": pl.Float64,
    "cross_node_rows": pl.Float64,
    "cross_node_bytes": pl.Float64,
    "recorded": pl.Boolean,
}


@dataclass(frozen=True)
class PlacementProposal:
    """A proposed placement, as data (only the CLI writes it to a file).

    Attributes:
        scenario: ``'placement'`` or ``'node_local'``.
        num_experts: E.
        ranks: The EP group's global ranks; ``experts[i]`` are held by ``ranks[i]``.
        experts: Expert ids per rank (an id on several ranks = replicas).
        replica_budget: The extra copies per rank it was allowed.
        layers: The MoE layers of the trace it applies to (one placement for all of them).
    """

    scenario: str
    num_experts: int
    ranks: tuple[int, ...]
    experts: tuple[tuple[int, ...], ...]
    replica_budget: int
    layers: tuple[int, ...]


@dataclass(frozen=True)
class PlacementPlan:
    """Everything the placement what-ifs and the report need.

    Attributes:
        counts: ``step, layer, src, expert, count`` of the analysed steps.
        current: The recorded placement most analysed (step, layer)s ran (or the contiguous default).
        recorded: ``current`` was recorded, not assumed.
        proposals: ``scenario -> Placement`` (:data:`SCENARIOS` that apply).
        node_of: ``rank -> node id``.
        pairs: ``scenario -> (step, layer, src, dst, rows)`` routed under each placement (and ``current``).
        per_rank: :data:`PER_RANK_SCHEMA` rows for ``current`` and each proposal (mean per step).
        steps_matched: The counts are those of the analysed steps (False: a routing dump's mean per
            step stands for each of them).
        in_force: The placement each analysed (step, layer) ran (``pairs['current']`` routes by it).
    """

    counts: pl.DataFrame
    current: plm.Placement
    recorded: bool
    proposals: dict[str, plm.Placement]
    node_of: dict[int, int]
    pairs: dict[str, pl.DataFrame]
    per_rank: pl.DataFrame
    steps_matched: bool = True
    in_force: InForce | None = None

    def proposal(self, scenario: str, budget: int) -> PlacementProposal:
        """The proposal of ``scenario`` as data."""
        p = self.proposals[scenario]
        layers = tuple(sorted(int(x) for x in self.counts["layer"].unique()))
        experts = tuple(tuple(x) for x in p.experts_of())
        return PlacementProposal(scenario, p.num_experts, p.ranks, experts, budget, layers)


def _group_ranks(ranks: pl.DataFrame) -> list[int]:
    """The EP group (``ranks.ep_group_ranks`` of the first rank that has it), else every rank."""
    g = (
        ranks.filter(pl.col("ep_group_ranks").is_not_null())["ep_group_ranks"]
        if "ep_group_ranks" in ranks.columns
        else None
    )
    if g is not None and g.len():
        return [int(x) for x in g[0]]
    return sorted(int(r) for r in ranks["rank"].unique())


def row_bytes_of(count_matrix: pl.DataFrame, ranks: pl.DataFrame) -> float | None:
    """Bytes per dispatched row: the count matrix's (median over dispatch rows), else hidden x itemsize."""
    d = count_matrix.filter((pl.col("direction") == "dispatch") & pl.col("row_bytes").is_not_null())
    if d.height:
        return float(cast(float, d["row_bytes"].median()))
    r = ranks.filter(pl.col("hidden_size").is_not_null() & pl.col("dtype").is_not_null())
    if r.height:
        isz = itemsize(r["dtype"][0])
        return float(int(r["hidden_size"][0]) * isz) if isz else None
    return None


def build_plan(
    tables_ranks: pl.DataFrame,
    routing_counts: pl.DataFrame,
    placement_table: pl.DataFrame,
    nodes: pl.DataFrame,
    steps: list[int],
    row_bytes: float | None,
    budget: int,
    slack: float,
) -> PlacementPlan | None:
    """The plan (module doc); None without routing counts of the analysed steps.

    Args:
        tables_ranks: Canonical ``ranks``.
        routing_counts: Canonical ``routing_counts``.
        placement_table: Canonical ``placement``.
        nodes: :func:`~ep_trace.analysis.topology.rank_nodes`.
        steps: The analysed steps.
        row_bytes: Bytes per dispatched row (None: bytes columns are 0).
        budget: ``AnalysisConfig.replica_budget``.
        slack: ``AnalysisConfig.node_local_slack``.
    """
    counts, matched = _step_counts(routing_counts, steps)
    if counts.is_empty():
        return None
    group = _group_ranks(tables_ranks)
    n_exp = max(int(cast(int, tables_ranks["num_experts"].max() or 0)), int(cast(int, counts["expert"].max())) + 1)
    now = in_force(placement_table, counts.select("step", "layer"), n_exp, group)
    current = now.main
    node_of = {int(r): int(n) for r, n in nodes.select("rank", "node_id").iter_rows()}
    weight = np.zeros(n_exp)
    per_e = counts.group_by("expert").agg(pl.col("count").sum())
    weight[per_e["expert"].to_numpy()] = per_e["count"].to_numpy()
    proposals = {"placement": plm.balanced(weight, group, budget)}
    pairs = {
        "current": now.route(counts, node_of),
        "placement": plm.route(counts, proposals["placement"], node_of),
    }
    node_ids = sorted({node_of.get(r, -1) for r in group})
    if len(node_ids) > 1:
        rank_node = np.array([node_ids.index(node_of.get(r, -1)) for r in group])
        src_node = (
            counts.with_columns(pl.col("src").replace_strict(node_of, default=-1, return_dtype=pl.Int32).alias("_n"))
            .group_by("_n", "expert")
            .agg(pl.col("count").sum())
        )
        demand = np.zeros((len(node_ids), n_exp))
        for n, e, c in src_node.iter_rows():
            if n in node_ids:
                demand[node_ids.index(n), int(e)] += c
        loads_bal = plm.rank_loads(pairs["placement"], group).group_by("rank").agg(pl.col("load").sum())
        cap = (1.0 + slack) * max(weight.sum() / len(group), float(cast(float, loads_bal["load"].max()) or 0.0))
        proposals["node_local"] = plm.node_local(demand, group, rank_node, budget, cap)
        pairs["node_local"] = plm.route(counts, proposals["node_local"], node_of)
    per_rank = _per_rank(pairs, {"current": current, **proposals}, group, nodes, node_of, row_bytes).with_columns(
        pl.lit(now.recorded).alias("recorded")
    )
    return PlacementPlan(counts, current, now.recorded, proposals, node_of, pairs, per_rank, matched, now)


def _step_counts(routing_counts: pl.DataFrame, steps: list[int]) -> tuple[pl.DataFrame, bool]:
    """``step, layer, src, expert, count`` of the analysed steps, and whether the counts' steps are the
    trace's. A routing dump numbers its own steps (Megatron-Core's iteration, SGLang's forward pass):
    when none is an analysed profiler step, its mean per (layer, source, expert) over its steps stands
    for every analysed step (the workload, rather than the very steps traced)."""
    per = routing_counts.group_by("step", "layer", pl.col("rank").cast(pl.Int32).alias("src"), "expert").agg(
        pl.col("count").sum()
    )
    hit = per.filter(pl.col("step").is_in(steps)) if steps else per
    if hit.height or per.is_empty() or not steps:
        return hit, True
    n = per["step"].n_unique()
    mean = per.group_by("layer", "src", "expert").agg(
        (pl.col("count").sum() / n).round(0).cast(pl.Int64).alias("count")
    )
    grid = pl.DataFrame({"step": pl.Series(steps, dtype=pl.Int64)}).join(mean, how="cross")
    return grid.select("step", "layer", "src", "expert", "count"), False


def _per_rank(
    pairs: dict[str, pl.DataFrame],
    places: dict[str, plm.Placement],
    group: list[int],
    nodes: pl.DataFrame,
    node_of: dict[int, int],
    row_bytes: float | None,
) -> pl.DataFrame:
    """Per scenario and rank: experts, load and cross-node rows sent (mean per step, summed over layers)."""
    out = []
    names = dict(nodes.select("rank", "node").iter_rows())
    for sc, pr in pairs.items():
        n_steps = max(pr["step"].n_unique(), 1) if pr.height else 1
        ld = plm.rank_loads(pr, group).group_by("rank").agg((pl.col("load").sum() / n_steps).alias("load"))
        ns = pl.col("src").replace_strict(node_of, default=-1, return_dtype=pl.Int32)
        nd = pl.col("dst").replace_strict(node_of, default=-1, return_dtype=pl.Int32)
        cross = (
            pr.filter(ns != nd)
            .group_by(pl.col("src").alias("rank"))
            .agg((pl.col("rows").sum() / n_steps).alias("cross_node_rows"))
        )
        exp = places[sc].experts_of()
        base = pl.DataFrame(
            {
                "rank": group,
                "node": [names.get(r) for r in group],
                "experts": [sorted(x) for x in exp],
            },
            schema={"rank": pl.Int32, "node": pl.Utf8, "experts": pl.List(pl.Int32)},
        )
        t = base.join(ld, on="rank", how="left").join(
            cross.with_columns(pl.col("rank").cast(pl.Int32)), on="rank", how="left"
        )
        out.append(
            t.with_columns(
                pl.lit(sc).alias("scenario"),
                pl.col("load").fill_null(0.0).cast(pl.Float64),
                pl.col("cross_node_rows").fill_null(0.0).cast(pl.Float64),
            ).with_columns((pl.col("cross_node_rows") * (row_bytes or 0.0)).alias("cross_node_bytes"))
        )
    cols = [c for c in PER_RANK_SCHEMA if c != "recorded"]
    return pl.concat(out).select(cols).cast({c: PER_RANK_SCHEMA[c] for c in cols})


#: The summary's order of the placement scenarios.
_SCENARIO_ORDER = {"current": 0, "placement": 1, "node_local": 2}


def scenario_stats(per_rank: pl.DataFrame | None) -> dict[str, dict[str, Any]]:
    """Per scenario of a :data:`PER_RANK_SCHEMA` frame (``current``, ``placement``, ``node_local``): the
    largest rank load, the mean, their ratio ``I_r``, cross-node rows and bytes (per step, summed over
    layers) and the most experts a rank holds."""
    if per_rank is None or per_rank.is_empty():
        return {}
    # one order of the scenarios and of the rows summed (the summary's bytes must not depend on the
    # group order: the same trace gave "current" / "placement" in either order and means 2048.0 or
    # 2047.9999999999998)
    order = pl.col("scenario").cast(pl.Utf8).replace_strict(_SCENARIO_ORDER, default=len(_SCENARIO_ORDER))
    g = (
        per_rank.sort(order, pl.col("scenario").cast(pl.Utf8), "rank")
        .group_by("scenario", maintain_order=True)
        .agg(
            pl.col("load").max().alias("max_load"),
            pl.col("load").mean().alias("mean_load"),
            pl.col("cross_node_rows").sum(),
            pl.col("cross_node_bytes").sum(),
            pl.col("experts").list.len().max().alias("max_experts_per_rank"),
        )
    )
    out = {}
    for r in g.iter_rows(named=True):
        r["I_r"] = r["max_load"] / r["mean_load"] if r["mean_load"] else None
        out[str(r.pop("scenario"))] = r
    return out
