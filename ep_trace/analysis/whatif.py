"""What-ifs: edits of the step graph, re-simulated by :mod:`ep_trace.analysis.replay`.

Every scenario edits measured lead gaps / transfers and replays; ``saving_ns`` is the median over
steps of the per-step saving (the replayed baseline step minus the edited one, each the mean over
ranks of the step length), ``predicted_step_ns`` the baseline's median step (the same mean over
ranks) minus that saving. A scenario that does not apply to the trace (no
routing counts, no collectives, no stall) is absent, never a zero row.

* ``no_straggler``: the late rank's work before each arrival where it came last, less the part its
  expert load explains (``_load_explained``; that part is ``balanced_routing``'s), set to the median of the
  other ranks' (never lengthened). The late rank is the one with the largest such excess over all calls, present only
  when it stands out (:data:`STANDOUT` x the next rank's excess).
* ``balanced_routing``: each rank's expert compute scaled by mean load / its load per (step,
  layer) from ``rank_load`` (exact counts or split lists).
* ``full_overlap``: every transfer runs behind the work that follows it (the next collective of
  the rank still waits for it): the bound of any comm/compute overlap.
* ``fp8_dispatch``: the dispatch transfers halved (half the bytes).
* ``no_host_stalls``: host-stall pieces of the gaps removed; the blocking count exchange (direction
  ``count``) takes no time (device-side split layout).
* ``no_launch_gaps``: on GPU ranks, each launch-gap piece of the gaps cut to the rank's device gap
  floor (:mod:`ep_trace.analysis.launch_floor`: the gap the device leaves between kernels that were
  queued in time, ~1-9 µs on the real traces): the device never waits for a host that is not
  blocked (launch latency, Python, data loading between kernels). The bound of CUDA-graph capture /
  fewer, fused launches (removed entirely where the floor cannot be measured). Not on CPU ranks:
  there such gaps are the compute thread's own Python between ops, not a device starved by its host.
* ``fused_permute``: permute / unpermute compute halved (fused kernels), less the stalled op calls of
  CPU ranks (:mod:`ep_trace.analysis.op_stalls`), which fusion does not remove.
* ``chunked_pipeline``: dispatch -> expert work -> combine of each layer pipelined over k chunks:
  span = (tD + X + tC) / k + (k - 1) / k * max(tD, X, tC) + (k - 1) * overhead, overhead = 2 extra
  collective calls at the trace's per-call latency (the median transfer of its count exchange, the
  smallest message) plus the fixed cost of re-issuing the region's ops and, on CPU ranks, of posting
  the two calls (:mod:`ep_trace.analysis.chunk_cost`), the best of k = 2..8.
* Overlap and pipelining hide a transfer only as far as the rank has a resource for it
  (:mod:`ep_trace.analysis.resources`): all of it on GPU ranks, on CPU (gloo) ranks only with a
  spare core; the unhidden part stays in the step.
* ``all``: every edit that saves on its own, at once (with ``full_overlap`` standing for the
  chunking): the bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from ep_trace.analysis.critical_path import critical_path
from ep_trace.analysis.graph import StepGraph
from ep_trace.analysis.load_scaling import expert_delta, with_step
from ep_trace.analysis.replay import Prepared, prepare, replay, replay_error

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

__all__ = ["Model", "model", "chunked", "WHATIF_SCHEMA", "STANDOUT"]

log = logging.getLogger(__name__)
#: The late rank's excess over the others must be this multiple of the next rank's.
STANDOUT = 1.3

WHATIF_SCHEMA: dict[str, PolarsDataType] = {
    "scenario": pl.Utf8,
    "predicted_step_ns": pl.Int64,
    "saving_ns": pl.Int64,
    "ranks": pl.List(pl.Int32),
    "chunks": pl.Int32,
}


@dataclass(frozen=True)
class Model:
    """The causal model of a trace set: its graph, replay, critical path and what-ifs."""

    graph: StepGraph
    replay: pl.DataFrame
    critical_path: pl.DataFrame
    whatif: pl.DataFrame
    straggler_rank: int | None


def _step_lengths(g: StepGraph, p: Prepared, step_end: np.ndarray) -> np.ndarray:
    """Per step (in step order): the mean over ranks of the step length, ns."""
    d = g.starts.select("step").with_columns(pl.Series("_t", step_end - p.step_start))
    return d.group_by("step").agg(pl.col("_t").mean()).sort("step")["_t"].to_numpy().astype(np.float64)


def _paired_saving(base: np.ndarray, edited: np.ndarray) -> float:
    """Median over steps of (baseline - edited) step length, ns.

    Paired per step, not the difference of the two medians: an edit shifts each step by its own
    amount, and the median of the per-step differences keeps the steps' common noise out of the
    saving (on the README example, 4 ranks on 2 cores, 8 steps: the no_straggler saving of five
    runs spread 7.4-32.6 ms as a difference of medians, 13.2-28.0 ms paired).
    """
    return float(np.median(base - edited)) if base.size else 0.0


def _per_node(g: StepGraph, mask: pl.Expr, length: pl.Expr | None = None) -> np.ndarray:
    """Sum per node of ``length`` (default: the piece's length) over the work pieces matching ``mask``
    (row order = node)."""
    d = pl.col("end_ns") - pl.col("start_ns") if length is None else length
    # lazy: the filter copies only the columns the mask and the sum read, not every column of the
    # work pieces (2.2 M rows at 4,096 ranks: an eager filter added ~170 MB to the peak)
    w = g.work.lazy().filter(mask).group_by("node").agg(d.sum().alias("_d")).collect()
    out = np.zeros(g.nodes.height)
    if w.height:
        out[w["node"].to_numpy()] = w["_d"].to_numpy()
    return out


def _ranks_where(nodes: pl.DataFrame, hit: np.ndarray) -> list[int]:
    """The ranks of the nodes where ``hit`` (a boolean per node, row order) holds, sorted."""
    return sorted({int(r) for r in nodes.filter(pl.Series(hit))["rank"].unique()})


def _launch_excess(g: StepGraph, gpu_ranks: frozenset[int], floor: dict[int, float]) -> np.ndarray:
    """Per node: the launch-gap time of GPU ranks above the rank's device gap floor (per piece)."""
    piece_floor = (
        pl.col("rank").replace_strict(list(floor), list(floor.values()), default=0.0, return_dtype=pl.Float64)
        if floor
        else pl.lit(0.0)
    )
    excess = (pl.col("end_ns") - pl.col("start_ns") - piece_floor).clip(lower_bound=0.0)
    return _per_node(g, (pl.col("cause") == "launch_gap") & pl.col("rank").is_in(sorted(gpu_ranks)), excess)


def _straggler_delta(g: StepGraph, gap: np.ndarray, expert: np.ndarray) -> tuple[np.ndarray, int | None]:
    """Gap reduction of the late rank's calls (0 elsewhere) and that rank (``expert``: the load-explained part)."""
    n = g.nodes
    calls = n.select("node", "rank", "group", "kind").filter(pl.col("kind") == "call")
    if calls.is_empty():
        return np.zeros(n.height), None
    x = calls.with_columns(pl.Series("_x", (gap - expert)[calls["node"].to_numpy()]))
    # only the lateness that delayed others counts: calls where the rank arrived last
    s = n["start_ns"].to_numpy()[calls["node"].to_numpy()]
    x = x.with_columns(pl.Series("_s", s)).with_columns(
        (pl.col("_s") == pl.col("_s").max().over("group")).alias("_last")
    )
    x = x.join(_median_of_others(x), on="node", how="inner").with_columns(
        pl.when(pl.col("_last")).then((pl.col("_x") - pl.col("_m")).clip(0)).otherwise(0.0).alias("_ex")
    )
    if x.is_empty():
        return np.zeros(n.height), None
    tot = x.group_by("rank").agg(pl.col("_ex").sum()).sort(["_ex", "rank"], descending=[True, False])
    log.debug("straggler excess per rank: %s", tot.rows())
    second = float(tot["_ex"][1]) if tot.height > 1 else 0.0
    # a straggler stands out: at least STANDOUT x the next rank's excess (else it is scheduling noise
    # spread over the ranks, not one late rank)
    if float(tot["_ex"][0]) <= 0 or float(tot["_ex"][0]) < STANDOUT * second:
        return np.zeros(n.height), None
    r = int(tot["rank"][0])
    sel = x.filter(pl.col("rank") == r)
    d = np.zeros(n.height)
    d[sel["node"].to_numpy()] = sel["_ex"].to_numpy()
    return d, r


def _median_of_others(x: pl.DataFrame) -> pl.DataFrame:
    """``node, _m``: the median of ``_x`` over the other nodes of each node's ``group`` (nodes alone
    in their group are left out), in O(nodes) memory.

    A self-join of each group would give the same numbers but holds group size squared rows (a
    call of 1,024 ranks: 1 M pairs, ~1 GB over the calls of a 1,024-rank trace). Without a node,
    the sorted values of its group lose one entry at the node's sorted position ``k``, so the
    median of the others is one of the two or three order statistics around the middle: for
    ``m`` values (``L = m - 1`` others, ``h = L // 2``), ``w[i] = v[i] if i < k else v[i + 1]``
    and the median is ``w[h]`` (``L`` odd) or the median of ``[w[h - 1], w[h]]`` (``L`` even, the
    same polars median of the same two middle values).
    """
    k = pl.col("_x").rank("ordinal").over("group").cast(pl.Int64) - 1
    y = x.select("node", "group", "_x").with_columns(k.alias("_k"), pl.len().over("group").cast(pl.Int64).alias("_n"))
    y = y.filter(pl.col("_n") > 1)
    h = (pl.col("_n") - 1) // 2
    stats = (
        y.sort("group", "_k")
        .group_by("group", maintain_order=True)
        .agg(
            pl.col("_x").gather(h.first() - 1).first().alias("_lo"),
            pl.col("_x").gather(h.first()).first().alias("_mid"),
            pl.col("_x").gather(h.first() + 1).first().alias("_hi"),
        )
    )
    y = y.join(stats, on="group", how="left")

    def w(i: pl.Expr) -> pl.Expr:  # value at index i of the sorted others, i in {h - 1, h}
        below = pl.when(i == h - 1).then(pl.col("_lo")).otherwise(pl.col("_mid"))
        above = pl.when(i == h - 1).then(pl.col("_mid")).otherwise(pl.col("_hi"))
        return pl.when(i < pl.col("_k")).then(below).otherwise(above)

    odd = (pl.col("_n") - 1) % 2 == 1
    med = pl.when(odd).then(w(h)).otherwise(pl.concat_list(w(h - 1), w(h)).list.median())
    return y.select("node", med.alias("_m"))


def _load_explained(g: StepGraph, expert: np.ndarray, rank_load: pl.DataFrame) -> np.ndarray:
    """Per node: the part of its lead gap its expert load explains, ns.

    Without routing counts: its expert compute. With them: its expert-stage time (compute, and the
    idle between ops that a CPU-starved, busier rank also accumulates) up to what the other ranks of
    the same call take per token times its tokens: ``min(E_r, L_r x median_q (E_q / L_q))``, never less
    than its expert compute. A sleep or stall inside the stage is beyond that, so it stays lateness.
    """
    if rank_load.is_empty() or g.work.is_empty():
        return expert
    L = rank_load.group_by(["step", "layer", "rank"]).agg(pl.col("recv_rows").sum().cast(pl.Float64).alias("_L"))
    L = L.with_columns(pl.col("layer").cast(pl.Int32), pl.col("rank").cast(pl.Int32))
    w = (
        g.work.lazy()
        .filter(pl.col("stage") == "expert")
        .group_by(["node", "rank", "layer"])
        .agg((pl.col("end_ns") - pl.col("start_ns")).sum().cast(pl.Float64).alias("_E"))
        .pipe(with_step, g)
        .join(L.lazy(), on=["step", "layer", "rank"], how="inner", maintain_order="left")
        .group_by("node")
        .agg(pl.col("_E").sum(), pl.col("_L").sum())
        .filter(pl.col("_L") > 0)
        .collect()
    )
    if w.is_empty():
        return expert
    x = g.nodes.select("node", "group").join(w, on="node", how="inner")
    pairs = x.join(
        x.select("group", pl.col("node").alias("_o"), (pl.col("_E") / pl.col("_L")).alias("_rate")), on="group"
    )
    rate = pairs.filter(pl.col("node") != pl.col("_o")).group_by("node").agg(pl.col("_rate").median())
    x = x.join(rate, on="node", how="inner").with_columns(
        pl.min_horizontal("_E", pl.col("_rate") * pl.col("_L")).alias("_ex")
    )
    out = expert.copy()
    idx = x["node"].to_numpy()
    out[idx] = np.maximum(out[idx], x["_ex"].to_numpy())
    return out


def _balance_delta(g: StepGraph, rank_load: pl.DataFrame) -> tuple[np.ndarray, list[int]]:
    """Gap reduction (negative = lengthening) of expert compute scaled to the mean load."""
    if rank_load.is_empty():
        return np.zeros(g.nodes.height), []
    L = rank_load.group_by(["step", "layer", "rank"]).agg(pl.col("recv_rows").sum().alias("_L"))
    L = L.with_columns(pl.col("_L").mean().over(["step", "layer"]).alias("_Ln"))
    return expert_delta(g, L)


def _chunk_pairs(g: StepGraph) -> tuple[np.ndarray, np.ndarray] | None:
    """``(combine nodes, their dispatch nodes)`` of every (rank, step, layer) whose combine call
    directly follows its dispatch call; None when there is none."""
    calls = g.nodes.filter(pl.col("kind") == "call").select("node", "rank", "step", "layer", "direction", "pred")
    d = calls.filter(pl.col("direction") == "dispatch").select("rank", "step", "layer", pl.col("node").alias("_d"))
    c = calls.filter(pl.col("direction") == "combine").join(d, on=["rank", "step", "layer"], how="inner")
    c = c.filter(pl.col("pred") == pl.col("_d"))
    return None if c.is_empty() else (c["node"].to_numpy(), c["_d"].to_numpy())


def _by_rank(g: StepGraph, values: dict[int, float], default: float) -> np.ndarray:
    """``values[rank]`` of every node of ``g`` (``default`` for ranks not in it), row order = node id."""
    return (
        g.nodes["rank"].replace_strict(values, default=default, return_dtype=pl.Float64).to_numpy().astype(np.float64)
    )


def chunked(
    g: StepGraph,
    p: Prepared,
    k: int,
    overhead_ns: float | np.ndarray,
    hide: np.ndarray | None = None,
    pairs: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Edited (gap, transfer) of ``chunked_pipeline`` with ``k`` chunks; None when no layer applies.

    Applies to every (rank, step, layer) whose combine call directly follows its dispatch call
    (the 1-chunk data path: dispatch -> expert work -> combine). ``hide`` is the hidden fraction of
    each node's transfer (:func:`ep_trace.analysis.resources.transfer_hiding`; default 1): the span
    is ``h x pipelined + (1 - h) x serial`` plus ``k - 1`` times the cost of one more chunk
    (``overhead_ns``: one figure, or one per node). ``pairs``: :func:`_chunk_pairs` of ``g``, when
    the caller already has them.
    """
    pairs = pairs if pairs is not None else _chunk_pairs(g)
    if pairs is None:
        return None
    ci, di = pairs
    gap, tr = p.gap.copy(), p.transfer.copy()
    tD, X, tC = tr[di], gap[ci], tr[ci]
    h = np.ones(ci.size) if hide is None else hide[ci]
    piped = (tD + X + tC) / k + (k - 1) / k * np.maximum(np.maximum(tD, X), tC)
    ovh = overhead_ns[ci] if isinstance(overhead_ns, np.ndarray) else overhead_ns
    span = h * piped + (1.0 - h) * (tD + X + tC) + (k - 1) * ovh
    # the unhidden part of a transfer stays a transfer (after the sync point), so that on a rank
    # without a spare core (h = 0) the edit is only the extra calls' overhead, not a shift of
    # transfer time in front of the sync where a wait could absorb it
    tr[di], tr[ci] = h * tD / k + (1.0 - h) * tD, h * tC / k + (1.0 - h) * tC
    gap[ci] = np.maximum(span - tr[di] - tr[ci], 0.0)
    return gap, tr


def _overhead(g: StepGraph) -> float:
    """Per extra chunk: two more collective calls, each costing the fixed per-call latency of the
    trace, measured as the median wait-free transfer of its smallest-message calls (the count
    exchange when recorded, else the calls of the smallest byte quartile)."""
    n = g.nodes.filter(pl.col("kind") == "call")
    cnt = n.filter(pl.col("direction") == "count")
    src = cnt if cnt.height else n
    if src.is_empty():
        return 0.0
    return 2.0 * float(np.median(src["transfer_ns"].to_numpy()))


def model(
    g: StepGraph,
    rank_load: pl.DataFrame,
    chunk_counts: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8),
    hiding: dict[int, float] | None = None,
    chunk_cost: Callable[[], dict[int, float]] | None = None,
    gpu_ranks: frozenset[int] = frozenset(),
    launch_floor: dict[int, float] | None = None,
    permute_stalls: dict[int, float] | None = None,
    extra_edits: Callable[[StepGraph, np.ndarray, np.ndarray], list[tuple[str, np.ndarray, np.ndarray, list[int]]]]
    | None = None,
) -> Model:
    """Replay, critical path and every applicable what-if of ``g``.

    Args:
        g: The step graph.
        rank_load: ``Analysis.rank_load`` (receive rows per rank, step, layer).
        chunk_counts: k values ``chunked_pipeline`` tries.
        hiding: Hidden fraction of each rank's transfers when overlapped (``full_overlap``,
            ``chunked_pipeline``, ``all``); default 1 for every rank.
        chunk_cost: Returns the fixed cost of one more chunk's ops per rank, ns
            (:func:`ep_trace.analysis.chunk_cost.per_chunk_cost`), on top of its two extra calls;
            called only when some layer can be chunked.
        gpu_ranks: Ranks whose work is device kernels (``no_launch_gaps`` edits only these).
        launch_floor: Device gap floor per GPU rank, ns (``launch_floor.device_gap_floor``); 0 where absent.
        permute_stalls: Share (0..1) of each CPU rank's permute / unpermute op time that is stalled
            calls (:func:`ep_trace.analysis.op_stalls.stall_share`); ``fused_permute`` halves only the
            rest (fusion moves the data once; it does not remove a page-fault storm or a lost core).
        extra_edits: Further scenarios, ``(g, gaps, transfers) -> [(scenario, edited gaps, edited
            transfers, ranks)]`` (the ``placement`` / ``node_local`` what-ifs,
            :func:`ep_trace.analysis.placement_whatif.placement_edits`); replayed like the others, not
            part of ``all``.

    Returns:
        The :class:`Model`.
    """
    p = prepare(g)
    r0 = replay(p)
    rep = replay_error(g, r0)
    cp = critical_path(g)
    base_v = _step_lengths(g, p, r0.step_end)
    base = float(np.median(base_v)) if base_v.size else 0.0
    rows: list[tuple[str, float, list[int], int | None]] = []  # (scenario, saving ns, ranks, k)
    all_ranks = sorted(int(r) for r in g.starts["rank"].unique())
    n = g.nodes
    has_calls = bool((n["kind"] == "call").any())
    expert = _per_node(g, (pl.col("cause") == "compute") & (pl.col("stage") == "expert"))
    gap_all, tr_all = p.gap.copy(), p.transfer.copy()
    edits = False
    hide = _by_rank(g, hiding or {}, 1.0)

    def run(gap: np.ndarray | None = None, tr: np.ndarray | None = None, overlap: bool | np.ndarray = False) -> float:
        """The edit's saving (:func:`_paired_saving`), ns."""
        return _paired_saving(base_v, _step_lengths(g, p, replay(p, gap, tr, overlap).step_end))

    def helps() -> bool:
        """The last row saves time (only such edits join ``all``: nobody applies a fix that hurts)."""
        return rows[-1][1] > 0

    explained = _load_explained(g, expert, rank_load)
    sd, srank = _straggler_delta(g, p.gap, explained) if has_calls else (np.zeros(n.height), None)
    if srank is not None:
        rows.append(("no_straggler", run(np.maximum(p.gap - sd, 0)), [srank], None))
        if helps():
            gap_all -= sd
        edits = True
    bd, heavy = _balance_delta(g, rank_load)
    if heavy:
        rows.append(("balanced_routing", run(p.gap - bd), heavy, None))
        if helps():  # moving tokens onto a straggler can lengthen the step: not part of the bound
            gap_all -= bd
        edits = True
    if has_calls and float(p.transfer[p.sync].sum()) > 0:
        rows.append(("full_overlap", run(overlap=hide), all_ranks, None))
        edits = True
    disp = (n["direction"] == "dispatch").fill_null(False).to_numpy() & p.sync
    if disp.any():
        tr = p.transfer.copy()
        tr[disp] *= 0.5
        rows.append(("fp8_dispatch", run(tr=tr), all_ranks, None))
        if helps():
            tr_all[disp] *= 0.5
    stall = _per_node(g, pl.col("cause") == "host_stall")
    count = (n["direction"] == "count").fill_null(False).to_numpy() & (n["kind"] != "end").to_numpy()
    if stall.any() or count.any():
        tr = p.transfer.copy()
        tr[count] = 0.0
        ranks = _ranks_where(n, count | (stall > 0))
        rows.append(("no_host_stalls", run(p.gap - stall, tr), ranks, None))
        if helps():
            gap_all -= stall
            tr_all[count] = 0.0
    lg = _launch_excess(g, gpu_ranks, launch_floor or {})
    if lg.any():
        ranks = _ranks_where(n, lg > 0)
        rows.append(("no_launch_gaps", run(p.gap - lg), ranks, None))
        if helps():
            gap_all -= lg
    perm = _per_node(g, (pl.col("cause") == "compute") & pl.col("stage").is_in(["permute", "unpermute"]))
    perm *= 1.0 - _by_rank(g, permute_stalls or {}, 0.0)
    if perm.any():
        ranks = _ranks_where(n, perm > 0)
        rows.append(("fused_permute", run(p.gap - 0.5 * perm), ranks, None))
        if helps():
            gap_all -= 0.5 * perm
    pairs = _chunk_pairs(g)
    best: tuple[float, int] | None = None
    if pairs is not None:
        ovh = _overhead(g) + _by_rank(g, chunk_cost() if chunk_cost else {}, 0.0)
        for k in chunk_counts:
            e = chunked(g, p, k, ovh, hide, pairs)
            assert e is not None  # the pairs exist
            t = run(*e)
            if best is None or t > best[0]:
                best = (t, k)
    if best is not None:
        rows.append(("chunked_pipeline", best[0], all_ranks, best[1]))
    if rows and edits or len(rows) > 1:
        rows.append(("all", run(np.maximum(gap_all, 0), tr_all, overlap=hide if has_calls else False), all_ranks, None))
    for name, gap_e, tr_e, rk in extra_edits(g, p.gap, p.transfer) if extra_edits is not None else []:
        rows.append((name, run(gap_e, tr_e), rk, None))
    wf = pl.DataFrame(
        [(s, int(round(base - v)), int(round(v)), rk, k) for s, v, rk, k in rows],
        schema=WHATIF_SCHEMA,
        orient="row",
    )
    return Model(graph=g, replay=rep, critical_path=cp, whatif=wf, straggler_rank=srank)
