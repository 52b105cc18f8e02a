"""The placement model on synthetic counts whose answers are worked out by hand (ep_trace.analysis.placement)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from ep_trace.analysis import placement as plm
from ep_trace.analysis.placement_plan import build_plan
from ep_trace.analysis.topology import TopologySpec, rank_nodes


def _counts(matrix: list[list[int]], step: int = 0, layer: int = 0) -> pl.DataFrame:
    """``step, layer, src, expert, count`` from C[src][expert]."""
    rows = [(step, layer, s, e, c) for s, row in enumerate(matrix) for e, c in enumerate(row) if c]
    return pl.DataFrame(
        rows,
        schema={"step": pl.Int64, "layer": pl.Int32, "src": pl.Int32, "expert": pl.Int32, "count": pl.Int64},
        orient="row",
    )


def _loads(pairs: pl.DataFrame, ranks: list[int]) -> list[int]:
    ld = plm.rank_loads(pairs, ranks).group_by("rank").agg(pl.col("load").sum()).sort("rank")
    return ld["load"].to_list()


# 2 ranks, one hot expert (e0): C[src][e]
HOT = [[60, 10, 10, 20], [40, 10, 20, 10]]


def test_balanced_two_ranks_one_hot_expert_by_hand():
    # weights e0..e3 = 100, 20, 30, 30; budget 1: 3 slots per rank, 6 copies, one more of e0 (at most 2
    # copies: 2 ranks) and then e2 (30, the first of the two 30s). Copies heaviest first: e0 50, e0 50,
    # e3 30, e1 20, e2 15, e2 15 -> rank0 e0 (50), rank1 e0 (50), rank0 e3 (80), rank1 e1 (70),
    # rank1 e2 (85), rank0 e2 (95; rank1 holds e2 already)
    w = np.array([100.0, 20.0, 30.0, 30.0])
    p = plm.balanced(w, [0, 1], budget=1)
    assert p.owners == ((0, 1), (1,), (0, 1), (0,))
    assert p.experts_of() == [[0, 2, 3], [0, 1, 2]]
    # routed on one node, replicas split evenly: rank0 = 30 + 20 (e0) + 5 + 10 (e2) + 30 (e3) = 95,
    # rank1 = 30 + 20 (e0) + 20 (e1) + 5 + 10 (e2) = 85
    pairs = plm.route(_counts(HOT), p, {0: 0, 1: 0})
    assert _loads(pairs, [0, 1]) == [95, 85]
    # the recorded (contiguous) placement: rank0 = e0 + e1 = 120, rank1 = 60
    assert _loads(plm.route(_counts(HOT), plm.contiguous(4, [0, 1]), {0: 0, 1: 0}), [0, 1]) == [120, 60]


def test_even_split_gives_the_remainder_to_the_first_replicas():
    p = plm.Placement(((0, 1, 2),), (0, 1, 2))
    pairs = plm.route(_counts([[11], [0], [0]]), p, {0: 0, 1: 0, 2: 0})
    assert dict(pairs.select("dst", "rows").iter_rows()) == {0: 4, 1: 4, 2: 3}


# 4 ranks on 2 nodes (0, 1 | 2, 3), expert e on rank e: C[src][e]
FOUR = [[10, 20, 30, 40], [5, 5, 5, 5], [0, 10, 0, 10], [1, 2, 3, 4]]
NODES = {0: 0, 1: 0, 2: 1, 3: 1}


def test_cross_node_rows_four_ranks_two_nodes_by_hand():
    cur = plm.contiguous(4, [0, 1, 2, 3])
    pairs = plm.route(_counts(FOUR), cur, NODES)
    # src0 -> e2, e3: 70; src1: 10; src2 -> e1: 10 (e0 has 0); src3 -> e0, e1: 3
    assert plm.cross_rows(pairs, NODES) == 93
    # a copy of e3 on rank 0: node A's tokens for e3 stay on node A, node B's on rank 3
    rep = plm.Placement(((0,), (1,), (2,), (0, 3)), (0, 1, 2, 3))
    pairs = plm.route(_counts(FOUR), rep, NODES)
    assert plm.cross_rows(pairs, NODES) == 30 + 5 + 10 + 3
    # rank 0: its own e0 rows (10 + 5 + 0 + 1) + node A's e3 rows (40 + 5); rank 3: node B's e3 rows (10 + 4)
    assert _loads(pairs, [0, 1, 2, 3]) == [61, 37, 38, 14]


def test_no_local_replica_splits_over_all_replicas():
    p = plm.Placement(((2, 3),), (0, 1, 2, 3))
    pairs = plm.route(_counts([[9], [0], [0], [0]]), p, NODES)  # node A has no copy: both of node B's
    assert dict(pairs.select("dst", "rows").iter_rows()) == {2: 5, 3: 4}


def test_node_local_places_experts_with_their_tokens():
    # node A's sources use e2, e3; node B's use e0, e1; contiguous puts e0, e1 on node A: 400 cross rows
    c = [[1, 1, 50, 50], [1, 1, 50, 50], [50, 50, 1, 1], [50, 50, 1, 1]]
    demand = np.array([[2, 2, 100, 100], [100, 100, 2, 2]], dtype=float)
    p = plm.node_local(demand, [0, 1, 2, 3], np.array([0, 0, 1, 1]), budget=0, cap=1.1 * 102)
    # experts heaviest first (all 102, in id order), each on the least-loaded free rank of its node
    assert p.owners == ((2,), (3,), (0,), (1,))
    assert plm.cross_rows(plm.route(_counts(c), plm.contiguous(4, [0, 1, 2, 3]), NODES), NODES) == 400
    assert plm.cross_rows(plm.route(_counts(c), p, NODES), NODES) == 8


def test_node_local_relieves_a_rank_over_the_cap_on_its_node():
    # one expert carries everything: its node's two ranks share it (a copy each), across nodes nothing moves
    demand = np.array([[90, 10, 0, 0], [0, 0, 10, 10]], dtype=float)
    p = plm.node_local(demand, [0, 1, 2, 3], np.array([0, 0, 1, 1]), budget=1, cap=40.0)
    assert set(p.owners[0]) == {0, 1}


def test_plan_on_tables_uses_the_recorded_placement_and_reports_cross_node_bytes():
    ranks = pl.DataFrame(
        {
            "rank": [0, 1, 2, 3],
            "host": ["a", "a", "b", "b"],
            "num_experts": [4] * 4,
            "ep_group_ranks": [[0, 1, 2, 3]] * 4,
        },
        schema={"rank": pl.Int32, "host": pl.Utf8, "num_experts": pl.Int32, "ep_group_ranks": pl.List(pl.Int32)},
    )
    rc = _counts(FOUR).rename({"src": "rank"}).with_columns(pl.lit(0, pl.Int32).alias("microbatch"))
    placement = pl.DataFrame(
        {"layer": [None] * 4, "expert": [0, 1, 2, 3], "rank": [0, 1, 2, 3]},
        schema={"layer": pl.Int32, "expert": pl.Int32, "rank": pl.Int32},
    )
    plan = build_plan(ranks, rc, placement, rank_nodes(ranks), [0], 100.0, 1, 0.1)
    assert plan is not None and plan.recorded
    cur = plan.per_rank.filter(pl.col("scenario") == "current").sort("rank")
    assert cur["cross_node_rows"].to_list() == [70.0, 10.0, 10.0, 3.0]
    assert cur["cross_node_bytes"].sum() == pytest.approx(9300.0)
    assert cur["load"].to_list() == [16.0, 37.0, 38.0, 59.0]
    assert set(plan.proposals) == {"placement", "node_local"}
    # every proposal keeps within the slots: ceil(4 / 4) + 1 experts per rank, every expert placed
    for p in plan.proposals.values():
        assert max(len(x) for x in p.experts_of()) <= 2
        assert all(p.owners)


def test_plan_without_nodes_has_no_node_local():
    ranks = pl.DataFrame(
        {"rank": [0, 1], "host": ["h", "h"], "num_experts": [4, 4]},
        schema={"rank": pl.Int32, "host": pl.Utf8, "num_experts": pl.Int32},
    )
    rc = _counts(HOT).rename({"src": "rank"}).with_columns(pl.lit(0, pl.Int32).alias("microbatch"))
    empty = pl.DataFrame(schema={"layer": pl.Int32, "expert": pl.Int32, "rank": pl.Int32})
    plan = build_plan(ranks, rc, empty, rank_nodes(ranks, TopologySpec(ranks_per_node=2)), [0], None, 1, 0.1)
    assert plan is not None and not plan.recorded and set(plan.proposals) == {"placement"}
    assert plan.per_rank.filter(pl.col("scenario") == "current")["load"].to_list() == [120.0, 60.0]
