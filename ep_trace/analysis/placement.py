"""The placement model: where experts live, where their tokens go, and two placements to propose.

A placement maps each expert to the ranks holding a copy of it (``owners[e]``; several ranks =
replicas). The **routing rule** (the same as ``ep-trace demo --placement``'s): the assignments rank
``src`` routes to expert e go to the replicas of e on ``src``'s node when there are any, else to all
of e's replicas, split evenly (``count // n`` each, the first ``count % n`` candidates in rank order
one more). From the exact per-(source rank, expert) counts (``routing_counts``) it gives every
rank's expert load and every pair's rows (:func:`route`).

Proposals (:func:`balanced`, :func:`node_local`), one placement for every layer, from the counts
summed over the analysed steps and layers, each rank holding at most ``ceil(E / W) + budget`` experts
(``budget`` = ``AnalysisConfig.replica_budget`` extra replicas of memory per rank):

* ``balanced`` — the EPLB algorithm of DeepSeek (github.com/deepseek-ai/EPLB ``eplb.py``) as vLLM
  runs it (vllm/distributed/eplb/rebalance_algo.py, global policy: ``replicate_experts`` then
  ``balanced_packing``): replicas go one at a time to the expert with the largest load per replica;
  then the replicas, heaviest first, each to the least-loaded rank with a free slot. Two deviations,
  both because a second copy on one rank serves no token the first would not: an expert gets at most
  one replica per rank (so at most W), and packing skips ranks that already hold the expert.
* ``node_local`` — fewest cross-node rows at a bounded load: experts, heaviest first, each on the
  node whose ranks route the most assignments to it (while the node has a free slot and stays under
  the load cap), on that node's least-loaded rank; then the spare slots hold replicas where they
  save the most cross-node rows (the assignments of a node without a copy), each kept only if no
  rank's load exceeds the cap. The cap: (1 + ``node_local_slack``) x the larger of the mean rank
  load and the ``balanced`` proposal's largest load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

__all__ = [
    "Placement",
    "contiguous",
    "route",
    "route_rows",
    "balanced",
    "node_local",
    "rank_loads",
    "cross_rows",
]


@dataclass(frozen=True)
class Placement:
    """Experts -> ranks.

    Attributes:
        owners: ``owners[e]`` = the global ranks holding a copy of expert e (sorted, at least one).
        ranks: The EP group's global ranks, in group order (rank i of the proposal file = ``ranks[i]``).
    """

    owners: tuple[tuple[int, ...], ...]
    ranks: tuple[int, ...]

    @property
    def num_experts(self) -> int:
        return len(self.owners)

    def experts_of(self) -> list[list[int]]:
        """``[experts held by ranks[0], ...]`` (the proposal file's ``ranks`` list)."""
        pos = {r: i for i, r in enumerate(self.ranks)}
        out: list[list[int]] = [[] for _ in self.ranks]
        for e, own in enumerate(self.owners):
            for r in own:
                out[pos[r]].append(e)
        return out

    def frame(self) -> pl.DataFrame:
        """``expert, rank`` (one row per copy)."""
        return pl.DataFrame(
            {"expert": [e for e, o in enumerate(self.owners) for _ in o], "rank": [r for o in self.owners for r in o]},
            schema={"expert": pl.Int32, "rank": pl.Int32},
        )


def contiguous(num_experts: int, ranks: Sequence[int]) -> Placement:
    """Blocks of E / W experts per rank in group order (Megatron-Core, vLLM's ``linear`` strategy,
    the demo's default); the last ranks hold one fewer when W does not divide E."""
    per = math.ceil(num_experts / len(ranks))
    return Placement(tuple((ranks[e // per],) for e in range(num_experts)), tuple(ranks))


def _candidates(owners: pl.DataFrame, node_of: dict[int, int], by: Sequence[str]) -> pl.DataFrame:
    """``*by, node, expert, dst, n, i``: the replicas each node's sources route expert e to (rule above):
    the copies on the node, else every copy; ``i`` = the copy's position in rank order, ``n`` = copies.

    Args:
        owners: ``*by, expert, rank`` (one row per copy).
        node_of: ``rank -> node id``.
        by: Columns that tell placements apart (none for one placement).
    """
    nodes = pl.DataFrame({"node": sorted(set(node_of.values()))}, schema={"node": pl.Int32})
    own = owners.select(*by, pl.col("expert").cast(pl.Int32), pl.col("rank").cast(pl.Int32).alias("dst")).unique()
    own = own.with_columns(pl.col("dst").replace_strict(node_of, default=-1, return_dtype=pl.Int32).alias("_dn"))
    x = own.join(nodes, how="cross")
    key = [*by, "node", "expert"]
    local = x.filter(pl.col("_dn") == pl.col("node"))
    cand = pl.concat([local, x.join(local.select(key).unique(), on=key, how="anti")])
    return cand.select(
        *key,
        "dst",
        pl.len().over(key).cast(pl.Int64).alias("n"),
        (pl.col("dst").rank("ordinal").over(key) - 1).cast(pl.Int64).alias("i"),
    )


def route(counts: pl.DataFrame, pl_: Placement, node_of: dict[int, int]) -> pl.DataFrame:
    """Rows each pair sends under placement ``pl_``.

    Args:
        counts: ``step, layer, src, expert, count`` (assignments rank src routed to expert e).
        pl_: The placement.
        node_of: ``rank -> node id`` (:func:`~ep_trace.analysis.topology.rank_nodes`).

    Returns:
        ``step, layer, src, dst, rows`` (pairs with rows > 0), sorted.
    """
    return route_rows(counts, pl_.frame(), node_of)


def route_rows(
    counts: pl.DataFrame, owners: pl.DataFrame, node_of: dict[int, int], by: Sequence[str] = ()
) -> pl.DataFrame:
    """:func:`route` for placements given as rows: ``owners`` = ``*by, expert, rank``, each count routed
    under the placement of its own ``by`` values (``counts`` carries them too), e.g. the placement in
    force at its step (:mod:`~ep_trace.analysis.placement_in_force`)."""
    cand = _candidates(owners, node_of, by)
    c = counts.with_columns(
        pl.col("src").cast(pl.Int32),
        pl.col("expert").cast(pl.Int32),
        pl.col("src").cast(pl.Int32).replace_strict(node_of, default=-1, return_dtype=pl.Int32).alias("node"),
    )
    j = c.join(cand, on=[*by, "node", "expert"], how="inner")
    rows = pl.col("count") // pl.col("n") + (pl.col("i") < pl.col("count") % pl.col("n")).cast(pl.Int64)
    return (
        j.group_by("step", "layer", "src", "dst")
        .agg(rows.sum().alias("rows"))
        .filter(pl.col("rows") > 0)
        .sort("step", "layer", "src", "dst")
    )


def rank_loads(pairs: pl.DataFrame, ranks: Sequence[int]) -> pl.DataFrame:
    """``step, layer, rank, load`` (rows received, every rank of ``ranks`` per (step, layer))."""
    keys = pairs.select("step", "layer").unique()
    grid = keys.join(pl.DataFrame({"rank": pl.Series(list(ranks), dtype=pl.Int32)}), how="cross")
    got = pairs.group_by("step", "layer", pl.col("dst").alias("rank")).agg(pl.col("rows").sum().alias("load"))
    return (
        grid.join(got, on=["step", "layer", "rank"], how="left")
        .with_columns(pl.col("load").fill_null(0))
        .sort("step", "layer", "rank")
    )


def cross_rows(pairs: pl.DataFrame, node_of: dict[int, int]) -> int:
    """Rows between ranks of different nodes."""
    if pairs.is_empty():
        return 0
    ns = pl.col("src").replace_strict(node_of, default=-1, return_dtype=pl.Int32)
    nd = pl.col("dst").replace_strict(node_of, default=-1, return_dtype=pl.Int32)
    return int(pairs.filter(ns != nd)["rows"].sum())


def _replicate(weight: np.ndarray, num_phy: int, max_copies: int) -> np.ndarray:
    """Copies per expert: EPLB's ``replicate_experts`` (one more copy to the expert with the largest
    load per copy, ``num_phy - E`` times), at most ``max_copies`` each."""
    cnt = np.ones(weight.size, dtype=np.int64)
    for _ in range(max(num_phy - weight.size, 0)):
        per = np.where(cnt < max_copies, weight / cnt, -1.0)
        e = int(np.argmax(per))
        if per[e] < 0:
            break
        cnt[e] += 1
    return cnt


def _pack(weight: np.ndarray, cnt: np.ndarray, ranks: Sequence[int], slots: int) -> Placement:
    """EPLB's ``balanced_packing`` of the copies (load weight / copies each), heaviest first, each to
    the least-loaded rank with a free slot that does not hold the expert yet."""
    items = np.repeat(np.arange(weight.size), cnt)
    w = (weight / cnt)[items]
    order = np.argsort(-w, kind="stable")
    load = np.zeros(len(ranks))
    used = np.zeros(len(ranks), dtype=np.int64)
    held = np.zeros((len(ranks), weight.size), dtype=bool)
    for k in order:
        e = items[k]
        ok = (used < slots) & ~held[:, e]
        if not ok.any():  # only when slots x ranks < copies: cannot happen for the budgets used here
            continue
        r = int(np.argmin(np.where(ok, load, np.inf)))
        load[r] += w[k]
        used[r] += 1
        held[r, e] = True
    return Placement(
        tuple(tuple(int(ranks[int(i)]) for i in np.flatnonzero(held[:, e])) for e in range(weight.size)), tuple(ranks)
    )


def slots_per_rank(num_experts: int, n_ranks: int, budget: int) -> int:
    """Experts a rank may hold: ceil(E / W) + budget."""
    return math.ceil(num_experts / n_ranks) + max(budget, 0)


def balanced(weight: np.ndarray, ranks: Sequence[int], budget: int) -> Placement:
    """The ``balanced`` proposal (module doc) for expert loads ``weight`` (assignments per expert)."""
    s = slots_per_rank(weight.size, len(ranks), budget)
    cnt = _replicate(weight.astype(np.float64), s * len(ranks), len(ranks))
    return _pack(weight.astype(np.float64), cnt, ranks, s)


def _contrib(own: np.ndarray, demand_e: np.ndarray, rank_node: np.ndarray) -> np.ndarray:
    """Load per rank (fractional even split) of one expert held by ranks ``own`` (indices), under the
    routing rule: each node's assignments to the copies on the node, else to every copy."""
    out = np.zeros(rank_node.size)
    if own.size == 0:
        return out
    for n in np.flatnonzero(demand_e):
        local = own[rank_node[own] == n]
        tgt = local if local.size else own
        out[tgt] += demand_e[n] / tgt.size
    return out


def node_local(demand: np.ndarray, ranks: Sequence[int], rank_node: np.ndarray, budget: int, cap: float) -> Placement:
    """The ``node_local`` proposal (module doc).

    Args:
        demand: ``[N, E]`` assignments the sources of each node route to each expert.
        ranks: The EP group's ranks.
        rank_node: Node index (0..N-1) of each rank of ``ranks``.
        budget: Extra copies per rank.
        cap: The largest load a rank may carry.
    """
    n_exp = demand.shape[1]
    s = slots_per_rank(n_exp, len(ranks), budget)
    base = math.ceil(n_exp / len(ranks))
    held = np.zeros((len(ranks), n_exp), dtype=bool)
    load = np.zeros(len(ranks))
    weight = demand.sum(axis=0).astype(np.float64)
    for e in np.argsort(-weight, kind="stable"):
        free = held.sum(axis=1) < base  # first copies fill the base slots: the spare ones stay for replicas

        def least(n: int, free: np.ndarray = free) -> float:
            return float(load[free & (rank_node == n)].min())

        nodes = [int(n) for n in np.argsort(-demand[:, e], kind="stable") if (free & (rank_node == n)).any()]
        fits = [n for n in nodes if least(n) + weight[e] <= cap]
        n = fits[0] if fits else min(nodes, key=least)
        cand = np.flatnonzero(free & (rank_node == n))
        r = int(cand[np.argmin(load[cand])])
        held[r, e] = True
        load[r] += weight[e]
    _add_replicas(held, demand.astype(np.float64), rank_node, s, cap)
    return Placement(
        tuple(tuple(int(ranks[int(i)]) for i in np.flatnonzero(held[:, e])) for e in range(n_exp)), tuple(ranks)
    )


def _add_replicas(held: np.ndarray, demand: np.ndarray, rank_node: np.ndarray, slots: int, cap: float) -> None:
    """The spare slots of ``node_local``: first relief (while a rank's load exceeds ``cap``, a copy of
    its heaviest expert on the least-loaded rank with a free slot, on its node first), then copies of
    e on node n where n's sources send e the most rows across nodes, each kept only while no rank's
    load exceeds ``cap`` (or the largest load before it, when that is higher)."""
    n_nodes, n_exp = demand.shape
    contrib = np.stack([_contrib(np.flatnonzero(held[:, e]), demand[:, e], rank_node) for e in range(n_exp)])
    load = contrib.sum(axis=0)

    def add(r: int, e: int, limit: float) -> bool:
        nonlocal load
        held[r, e] = True
        new_c = _contrib(np.flatnonzero(held[:, e]), demand[:, e], rank_node)
        new_load = load - contrib[e] + new_c
        if new_load.max() > limit + 1e-9:
            held[r, e] = False
            return False
        contrib[e], load = new_c, new_load
        return True

    for _ in range(held.size):  # relief: each accepted copy lowers the largest load
        top = int(np.argmax(load))
        if load[top] <= cap:
            break
        e = int(np.argmax(contrib[:, top]))
        free = (held.sum(axis=1) < slots) & ~held[:, e]
        same = free & (rank_node == rank_node[top])
        cand = np.flatnonzero(same if same.any() else free)
        if cand.size == 0 or not add(int(cand[np.argmin(load[cand])]), e, load.max() - 1e-6):
            break
    has = np.stack([(held & (rank_node == n)[:, None]).any(axis=0) for n in range(n_nodes)])  # [N, E]
    gain = np.where(has, 0.0, demand)
    for flat in np.argsort(-gain, axis=None, kind="stable"):
        n, e = divmod(int(flat), n_exp)
        if gain[n, e] <= 0:
            break
        cand = np.flatnonzero((rank_node == n) & (held.sum(axis=1) < slots) & ~held[:, e])
        if cand.size:
            add(int(cand[np.argmin(load[cand])]), e, max(cap, float(load.max())))
