"""The causal model: golden graphs with exact answers, and properties of replay and what-if edits."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from ep_trace.analysis import whatif
from ep_trace.analysis.critical_path import composition, critical_path
from ep_trace.analysis.graph import build_graph
from ep_trace.analysis.replay import prepare, replay, replay_error

T0 = 1_700_000_000_000_000_000  # epoch ns: replay must stay exact at this magnitude


def _frames(spec: dict) -> dict[str, pl.DataFrame]:
    """Frames for build_graph from a per-rank timeline: every call is joined by all ranks (full arrival).

    spec = {"windows": {rank: (start, end)}, "calls": [{"dir": str, "layer": int, "ranks": {rank: (s, e)}}],
    "compute": [(rank, s, e)], "memory": [(rank, s, e)] (memcpy / memset), "stages": [(rank, stage, layer, s, e)],
    "stalls": [(rank, s, e)]}; times relative to T0.
    """
    win = pl.DataFrame(
        [(r, 0, T0 + s, T0 + e) for r, (s, e) in spec["windows"].items()],
        schema={"rank": pl.Int32, "step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64},
        orient="row",
    )
    calls, cr = [], []
    for m, c in enumerate(spec["calls"]):
        a = max(s for s, _ in c["ranks"].values())
        last = max(c["ranks"], key=lambda r: (c["ranks"][r][0], -r))
        calls.append((m, "all_to_allv", c.get("dir"), c.get("layer"), True, T0 + a))
        for r, (s, e) in c["ranks"].items():
            cr.append((m, r, 0, T0 + s, T0 + e, T0 + a, last))
    calls_df = pl.DataFrame(
        calls,
        schema={
            "match_id": pl.Int64,
            "collective": pl.Utf8,
            "direction": pl.Utf8,
            "layer": pl.Int32,
            "valid": pl.Boolean,
            "arrival_ns": pl.Int64,
        },
        orient="row",
    )
    cr_df = pl.DataFrame(
        cr,
        schema={
            "match_id": pl.Int64,
            "rank": pl.Int32,
            "step": pl.Int64,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
            "arrival_ns": pl.Int64,
            "waited_for": pl.Int32,
        },
        orient="row",
    )
    act = pl.DataFrame(
        [(r, "compute", T0 + s, T0 + e) for r, s, e in spec.get("compute", [])]
        + [(r, "memory", T0 + s, T0 + e) for r, s, e in spec.get("memory", [])],
        schema={"rank": pl.Int32, "cls": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64},
        orient="row",
    )
    stages = pl.DataFrame(
        [(r, stg, ly, T0 + s, T0 + e, T0 + s, T0 + e) for r, stg, ly, s, e in spec.get("stages", [])],
        schema={
            "rank": pl.Int32,
            "stage": pl.Utf8,
            "layer": pl.Int32,
            "cpu_start_ns": pl.Int64,
            "cpu_end_ns": pl.Int64,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
        },
        orient="row",
    )
    stalls = pl.DataFrame(
        [(r, T0 + s, T0 + e) for r, s, e in spec.get("stalls", [])],
        schema={"rank": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64},
        orient="row",
    )
    off = pl.DataFrame({"rank": list(spec["windows"]), "offset_ns": [0] * len(spec["windows"])}).cast(
        {"rank": pl.Int32, "offset_ns": pl.Int64}
    )
    return {
        "windows": win,
        "offsets": off,
        "calls": calls_df,
        "call_ranks": cr_df,
        "activity": act,
        "stages": stages,
        "stalls": stalls,
    }


def _graph(spec: dict):
    return build_graph(**_frames(spec))


def _load(rows: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        [(0, ly, 0, 0, r, n, n) for r, ly, n in rows],
        schema={
            "step": pl.Int64,
            "layer": pl.Int32,
            "microbatch": pl.Int32,
            "call": pl.Int64,
            "rank": pl.Int32,
            "recv_rows": pl.Int64,
            "send_rows": pl.Int64,
        },
        orient="row",
    )


# rank 1 is late (300 ns of work before the call, rank 0 100 ns); both transfer 100 ns, then 100 ns
# of compute and 100 ns of idle before the step end at 600.
STRAGGLER = {
    "windows": {0: (0, 600), 1: (0, 600)},
    "calls": [{"dir": "combine", "layer": 0, "ranks": {0: (100, 400), 1: (300, 400)}}],
    "compute": [(0, 0, 100), (1, 0, 300), (0, 400, 500), (1, 400, 500)],
}


def test_golden_replay_and_critical_path():
    g = _graph(STRAGGLER)
    p = prepare(g)
    rep = replay_error(g, replay(p))
    assert rep["replayed_ns"].to_list() == [600, 600] and rep["error_pct"].to_list() == [0.0, 0.0]
    cp = critical_path(g)
    got = cp.with_columns(pl.col("start_ns") - T0, pl.col("end_ns") - T0).select("rank", "start_ns", "end_ns", "cause")
    # rank 0 is the critical rank (tie, lowest rank): its wait is not on the path, rank 1's work is
    assert got.rows() == [
        (1, 0, 300, "compute"),
        (0, 300, 400, "transfer"),
        (0, 400, 500, "compute"),
        (0, 500, 600, "launch_gap"),
    ]
    c = composition(cp, 0)
    assert c["total_ns"] == 600
    assert c["by_cause"] == {
        "compute": 400,
        "copy": 0,
        "transfer": 100,
        "barrier_wait": 0,
        "host_stall": 0,
        "launch_gap": 100,
        "queued": 0,
        "unexplained": 0,
    }


def test_golden_whatifs_straggler():
    m = whatif.model(_graph(STRAGGLER), _load([]))
    w = {r["scenario"]: r for r in m.whatif.iter_rows(named=True)}
    # rank 1's 300 ns set to rank 0's 100 ns: the call starts at 100, the step ends at 400
    assert w["no_straggler"]["saving_ns"] == 200 and w["no_straggler"]["ranks"] == [1]
    assert w["no_straggler"]["predicted_step_ns"] == 400
    # the 100 ns transfer runs behind the 200 ns that follow it
    assert w["full_overlap"]["saving_ns"] == 100
    assert "balanced_routing" not in w  # no routing counts: absent, not zero
    assert "fp8_dispatch" not in w  # no dispatch call
    assert w["all"]["saving_ns"] == 300


# the late rank is late because its experts carry 3x the tokens: routing imbalance, not a straggler
SKEW = {
    "windows": {0: (0, 600), 1: (0, 600)},
    "calls": [{"dir": "combine", "layer": 0, "ranks": {0: (100, 400), 1: (300, 400)}}],
    "compute": [(0, 0, 100), (1, 0, 300), (0, 400, 500), (1, 400, 500)],
    "stages": [(0, "expert", 0, 0, 100), (1, "expert", 0, 0, 300)],
}


def test_golden_imbalance_is_not_a_straggler():
    m = whatif.model(_graph(SKEW), _load([(0, 0, 1), (1, 0, 3)]))
    w = {r["scenario"]: r for r in m.whatif.iter_rows(named=True)}
    assert "no_straggler" not in w  # its lateness is expert compute its load explains
    # mean load 2: rank 1's 300 ns of expert work -> 200, rank 0's 100 -> 200; the call starts at 200
    assert w["balanced_routing"]["saving_ns"] == 100 and w["balanced_routing"]["ranks"] == [1]


def test_golden_barrier_wait_from_a_late_step_start():
    spec = {
        "windows": {0: (0, 600), 1: (200, 600)},  # rank 1 enters the step 200 ns late
        "calls": [{"ranks": {0: (100, 400), 1: (300, 400)}}],
        "compute": [(0, 0, 100), (1, 200, 300)],
    }
    cp = critical_path(_graph(spec))
    c = composition(cp, 0)
    assert c["total_ns"] == 600 and c["by_cause"]["barrier_wait"] == 200 and c["by_cause"]["compute"] == 100


def test_golden_host_stall_piece():
    spec = {
        "windows": {0: (0, 400), 1: (0, 400)},
        "calls": [{"ranks": {0: (200, 300), 1: (200, 300)}}],
        "compute": [(0, 0, 100), (1, 0, 200)],
        "stalls": [(0, 100, 200)],
    }
    g = _graph(spec)
    w = g.work.filter(pl.col("rank") == 0).sort("start_ns")
    assert w.select((pl.col("start_ns") - T0), (pl.col("end_ns") - T0), "cause").rows()[:2] == [
        (0, 100, "compute"),
        (100, 200, "host_stall"),
    ]


def test_golden_copy_under_a_blocking_call_is_not_a_stall():
    # each rank: compute [0, 100), then a blocking cudaMemcpy [100, 200) whose copy runs [100, 180):
    # the device copies for 80 ns and idles 20 ns; both call at 200
    spec = {
        "windows": {0: (0, 400), 1: (0, 400)},
        "calls": [{"ranks": {0: (200, 300), 1: (200, 300)}}],
        "compute": [(0, 0, 100), (1, 0, 100)],
        "memory": [(0, 100, 180), (1, 100, 180)],
        "stalls": [(0, 100, 200), (1, 100, 200)],
    }
    g = _graph(spec)
    w = g.work.filter(pl.col("rank") == 0).sort("start_ns")
    assert w.select((pl.col("start_ns") - T0), (pl.col("end_ns") - T0), "cause").rows()[:3] == [
        (0, 100, "compute"),
        (100, 180, "copy"),
        (180, 200, "host_stall"),
    ]
    m = whatif.model(g, _load([]))
    w2 = {r["scenario"]: r for r in m.whatif.iter_rows(named=True)}
    # only the 20 ns without device work go (both arrive at 180); counting the copy as a stall would
    # have claimed the whole 100 ns call
    assert w2["no_host_stalls"]["saving_ns"] == 20


# GPU ranks: compute [0, 100) and [150, 200) with a 50 ns launch gap between, the call [200, 300),
# then 100 ns of idle (launch gap) before the step end at 400
HOST_BOUND = {
    "windows": {0: (0, 400), 1: (0, 400)},
    "calls": [{"ranks": {0: (200, 300), 1: (200, 300)}}],
    "compute": [(0, 0, 100), (0, 150, 200), (1, 0, 100), (1, 150, 200)],
}


def test_golden_no_launch_gaps_keeps_the_device_gap_floor():
    g = _graph(HOST_BOUND)
    m = whatif.model(g, _load([]), gpu_ranks=frozenset({0, 1}), launch_floor={0: 10.0, 1: 10.0})
    w = {r["scenario"]: r for r in m.whatif.iter_rows(named=True)}
    # each launch gap cut to the 10 ns floor: the call starts at 100 + 10 + 50 = 160, ends 260, the
    # step ends 10 ns later: 270 (saving 130)
    assert w["no_launch_gaps"]["predicted_step_ns"] == 270 and w["no_launch_gaps"]["saving_ns"] == 130
    assert w["no_launch_gaps"]["ranks"] == [0, 1]
    # without a measured floor the gaps go entirely (the bound): 100 + 50 + 100 = 250
    bound = whatif.model(g, _load([]), gpu_ranks=frozenset({0, 1}))
    assert bound.whatif.filter(pl.col("scenario") == "no_launch_gaps")["predicted_step_ns"].item() == 250
    # CPU ranks: such gaps are the compute thread's own Python, not a starved device: absent
    cpu = whatif.model(g, _load([]))
    assert "no_launch_gaps" not in cpu.whatif["scenario"].to_list()


@st.composite
def timelines(draw):
    """A random multi-rank step: every rank takes part in every call (ground truth by forward simulation)."""
    n_r = draw(st.integers(2, 4))
    n_c = draw(st.integers(1, 4))
    starts = [draw(st.integers(0, 300)) for _ in range(n_r)]
    gaps = [[draw(st.integers(0, 1000)) for _ in range(n_c)] for _ in range(n_r)]
    trs = [[draw(st.integers(1, 500)) for _ in range(n_c)] for _ in range(n_r)]
    tails = [draw(st.integers(0, 500)) for _ in range(n_r)]
    t = list(starts)
    calls, compute = [], []
    for c in range(n_c):
        s = [t[r] + gaps[r][c] for r in range(n_r)]
        a = max(s)
        e = [a + trs[r][c] for r in range(n_r)]
        for r in range(n_r):
            if gaps[r][c]:
                compute.append((r, t[r], s[r]))
        calls.append({"ranks": {r: (s[r], e[r]) for r in range(n_r)}})
        t = e
    windows = {r: (starts[r], t[r] + tails[r]) for r in range(n_r)}
    return {"windows": windows, "calls": calls, "compute": compute}


@settings(max_examples=40, deadline=None)
@given(timelines())
def test_replay_of_unedited_graph_equals_measured(spec):
    g = _graph(spec)
    r = replay(prepare(g))
    err = replay_error(g, r)
    assert (err["replayed_ns"] == err["measured_ns"]).all()
    nodes = g.nodes.filter(pl.col("kind") != "end")
    assert np.array_equal(np.rint(r.end[nodes["node"].to_numpy()]).astype(np.int64) + r.t0, nodes["end_ns"].to_numpy())


@settings(max_examples=40, deadline=None)
@given(timelines())
def test_removing_all_waits_never_lengthens_a_step(spec):
    g = _graph(spec)
    p = prepare(g)
    base = replay(p).step_end
    free = replay(dataclasses.replace(p, sync=np.zeros_like(p.sync))).step_end
    assert (free <= base + 1e-6).all()


@settings(max_examples=40, deadline=None)
@given(timelines(), st.integers(0, 3), st.floats(0.0, 1.0))
def test_shrinking_one_ranks_work_never_lengthens_any_rank(spec, who, f):
    g = _graph(spec)
    p = prepare(g)
    who = who % len(spec["windows"])
    base = replay(p).step_end
    gap = p.gap.copy()
    mine = (g.nodes["rank"] == who).to_numpy()
    gap[mine] *= f
    edited = replay(p, gap=gap).step_end
    assert (edited <= base + 1e-6).all()
    tr = p.transfer.copy()
    tr[mine] *= f
    assert (replay(p, transfer=tr).step_end <= base + 1e-6).all()


def test_golden_full_overlap_on_a_rank_without_a_spare_core():
    # STRAGGLER with rank 0 on a core of its own for compute and transfer (hidden fraction 0): its 100 ns
    # transfer cannot run behind the compute that follows it; rank 1 (fraction 1) hides all of it
    g = _graph(STRAGGLER)
    full = whatif.model(g, _load([]), hiding={0: 1.0, 1: 1.0}).whatif
    none = whatif.model(g, _load([]), hiding={0: 0.0, 1: 0.0}).whatif
    half = whatif.model(g, _load([]), hiding={0: 0.5, 1: 0.5}).whatif

    def saving(w: pl.DataFrame, s: str) -> int:
        return int(w.filter(pl.col("scenario") == s)["saving_ns"][0])

    assert saving(full, "full_overlap") == 100
    assert saving(none, "full_overlap") == 0
    assert saving(half, "full_overlap") == 50


@settings(max_examples=40, deadline=None)
@given(timelines(), st.floats(0.0, 1.0))
def test_overlap_fraction_interpolates_between_serial_and_full(spec, h):
    p = prepare(_graph(spec))
    n = p.pred.size
    serial = replay(p).step_end
    full = replay(p, overlap=True).step_end
    assert np.array_equal(replay(p, overlap=np.zeros(n)).step_end, serial)
    assert np.array_equal(replay(p, overlap=np.ones(n)).step_end, full)
    part = replay(p, overlap=np.full(n, h)).step_end
    assert (part <= serial + 1e-6).all() and (part >= full - 1e-6).all()


# one rank's dispatch -> expert -> combine: 100 ns dispatch transfer, 400 ns expert work, 100 ns combine
PIPE = {
    "windows": {0: (0, 700), 1: (0, 700)},
    "calls": [
        {"dir": "dispatch", "layer": 0, "ranks": {0: (0, 100), 1: (0, 100)}},
        {"dir": "combine", "layer": 0, "ranks": {0: (500, 600), 1: (500, 600)}},
    ],
    "compute": [(0, 100, 500), (1, 100, 500)],
}


def test_golden_chunked_pipeline_needs_a_resource_for_the_transfer():
    g = _graph(PIPE)
    p = prepare(g)
    # k = 2, no overhead: span = 600 / 2 + 1/2 x max(100, 400, 100) = 500 ns (100 ns saved per rank)
    gap, tr = whatif.chunked(g, p, 2, 0.0)
    assert replay(p, gap, tr).step_end.tolist() == [600.0, 600.0]
    # no spare core: the serial 600 ns stays, plus one extra chunk's 30 ns of call overhead
    gap, tr = whatif.chunked(g, p, 2, 30.0, np.zeros(p.pred.size))
    assert replay(p, gap, tr).step_end.tolist() == [730.0, 730.0]


# rank 1 is late for 250 ns outside any compute (a sleep); its experts carry the least load. Balancing
# the routing moves tokens onto it: its 50 ns of expert work doubles and the step gets longer
LATE_AND_LIGHT = {
    "windows": {0: (0, 500), 1: (0, 500)},
    "calls": [{"dir": "combine", "layer": 0, "ranks": {0: (100, 400), 1: (300, 400)}}],
    "compute": [(0, 0, 100), (1, 0, 50)],
    "stages": [(0, "expert", 0, 0, 100), (1, "expert", 0, 0, 300)],
}


def test_all_takes_only_the_edits_that_save():
    m = whatif.model(_graph(LATE_AND_LIGHT), _load([(0, 0, 3), (1, 0, 1)]))
    w = {r["scenario"]: r["saving_ns"] for r in m.whatif.iter_rows(named=True)}
    assert w["balanced_routing"] == -50  # rank 1's 50 ns of expert work x 2
    # every fix that helps at once: no straggler (rank 1 at 100 like rank 0, its sleep gone) and the
    # 100 ns transfer behind the 100 ns that follow it; the harmful rebalancing is left out
    assert w["all"] >= max(v for k, v in w.items() if k != "all")
    assert w["all"] == w["no_straggler"] + w["full_overlap"]


def test_saving_is_the_median_of_per_step_savings_not_the_difference_of_medians():
    # steps of 100 / 200 / 300 ns; the edit saves 10 / 80 / 10 ns: the median step moves by 80
    # (200 -> 120) though the typical step saves 10
    base, edited = np.array([100.0, 200.0, 300.0]), np.array([90.0, 120.0, 290.0])
    assert whatif._paired_saving(base, edited) == 10.0
    assert float(np.median(base) - np.median(edited)) == 80.0
    assert whatif._paired_saving(np.array([]), np.array([])) == 0.0


def test_golden_fused_permute_leaves_the_stalled_calls():
    # rank 1 is late by 200 ns, all of it permute compute (0..200 of its 300 ns before the call)
    spec = dict(STRAGGLER, stages=[(1, "permute", 0, 0, 200)])
    w = {r["scenario"]: r for r in whatif.model(_graph(spec), _load([])).whatif.iter_rows(named=True)}
    assert w["fused_permute"]["saving_ns"] == 100 and w["fused_permute"]["ranks"] == [1]  # 200 halved
    # half of that permute time is stalled op calls: fusion halves only the other 100 ns
    m = whatif.model(_graph(spec), _load([]), permute_stalls={1: 0.5})
    w = {r["scenario"]: r for r in m.whatif.iter_rows(named=True)}
    assert w["fused_permute"]["saving_ns"] == 50
    # all of it stalled: nothing for fusion to save, and the row is absent, not zero
    m = whatif.model(_graph(spec), _load([]), permute_stalls={1: 1.0})
    assert "fused_permute" not in m.whatif["scenario"].to_list()
