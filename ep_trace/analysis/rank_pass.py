"""Per-rank passes over blocks of ranks: the analyses whose rows never mix ranks.

Step windows, device activity, overlap, stage attribution, the top ops / kernels, the blocking host
calls, the device gap floor and the chunk cost are computed rank by rank; only the collectives (matching, waits,
clocks) and the step graph need every rank at once, and they read small tables. So the events are
read one *block* of consecutive ranks at a time (about :attr:`AnalysisConfig.block_events` rows:
enough ranks to amortise polars' fixed cost per query, few enough that a block's intermediates stay
small), and only each block's small results are kept: the peak memory of the analysis is one
block's working set plus the cross-rank tables, not every rank's events and intermediates at once
(1,024 param DLRM ranks, 2.53 M events: the process peak during the analysis went ~1,074 -> ~360
MB with the events on disk; benchmarks/README.md, rank-scaling).

The events come from :meth:`TraceTables.scan_events`: an in-memory frame, or the Parquet partitions
of an ingest directory read lazily (a block reads only its ranks' row groups). Every pass's result
equals the same pass over all ranks at once (``tests/analysis/test_rank_pass.py``, real multi-rank
traces with one rank per block).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import polars as pl

from ep_trace.analysis import stage_coverage, stage_tiers, stages
from ep_trace.analysis.activity import device_activity
from ep_trace.analysis.breakdown import top_kernels, top_ops
from ep_trace.analysis.chunk_cost import per_chunk_cost
from ep_trace.analysis.config import AnalysisConfig
from ep_trace.analysis.host_stalls import BLOCKING_RE
from ep_trace.analysis.intervals import overlay, segment_lengths, subtract, union
from ep_trace.analysis.launch_floor import device_gap_floor
from ep_trace.analysis.name_filter import name_filter
from ep_trace.analysis.op_stalls import STALL_SCHEMA, stage_calls, stalls_of_calls
from ep_trace.analysis.step_work import assign_activity, device_windows
from ep_trace.analysis.steps import step_windows
from ep_trace.analysis.user_steps import user_range_steps
from ep_trace.analysis.warmup import trim_warmup
from ep_trace.schema import TraceTables

__all__ = [
    "Blocks",
    "FirstPass",
    "SecondPass",
    "rank_blocks",
    "first_pass",
    "second_pass",
    "by_block",
    "drain_blocks",
    "chunk_cost",
    "op_stalls",
    "hta_overlap",
]

Blocks = tuple[tuple[int, int], ...]
_CLS = pl.Enum(["comm", "compute", "memory"])  # activity.device_activity's classes


def rank_blocks(tables: TraceTables, max_rows: int) -> tuple[Blocks, int]:
    """Inclusive ``(first_rank, last_rank)`` ranges of consecutive ranks holding about ``max_rows``
    events each (a rank is never split: one big rank is a block alone); and the total event count.
    """
    counts = tables.scan_events().group_by("rank").agg(pl.len().alias("n")).sort("rank").collect()
    blocks: list[tuple[int, int]] = []
    first = last = None
    rows = 0
    for r, n in counts.iter_rows():
        if first is not None and rows + n > max_rows:
            blocks.append((first, last))  # type: ignore[arg-type]
            first, rows = None, 0
        if first is None:
            first = r
        last, rows = r, rows + n
    if first is not None:
        blocks.append((first, last))  # type: ignore[arg-type]
    return tuple(blocks), int(counts["n"].sum()) if counts.height else 0


def _in(block: tuple[int, int]) -> pl.Expr:
    return pl.col("rank").is_between(block[0], block[1])


#: Event columns the per-rank passes (first, second, chunk cost) never read: the source ids and
#: labels the parsers keep for the annotated traces and HTA. Their block reads leave them on disk
#: (1,024 param DLRM ranks: ~50 -> ~42 ms a block of 400 k events); a pass that starts reading one
#: fails loudly (ColumnNotFoundError), never silently.
_UNREAD = ("category", "domain", "pid", "correlation", "external_id", "bytes")


def _events(
    tables: TraceTables, blocks: Blocks, skip: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[int, int], pl.DataFrame]]:
    """The events of each block, without the ``skip`` columns when they are read from a scan; one
    block of an in-memory frame is the frame itself (no copy, every column)."""
    if len(blocks) == 1 and tables.events_scan is None:
        yield blocks[0], tables.events
        return
    scan = tables.scan_events()
    cols = [c for c in scan.collect_schema().names() if c not in skip]
    for b in blocks:
        yield b, scan.select(cols).filter(_in(b)).collect()


def _of(df: pl.DataFrame, block: tuple[int, int], single: bool) -> pl.DataFrame:
    return df if single else df.filter(_in(block))


def _concat(parts: list[pl.DataFrame]) -> pl.DataFrame:
    return parts[0] if len(parts) == 1 else pl.concat(parts, how="vertical_relaxed")


def _own_strings(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with its String columns pointing into a buffer of their distinct values only.

    A polars String column is a view array: a filter or a join keeps pointing into the buffers of the
    frame it came from. A block's few top-kernel names would then keep the whole block's kernel-name
    text alive (~110 MB over 1,024 param DLRM ranks, measured). A round trip through a Categorical
    copies the text of every row instead (20 top kernels of ~300 characters a rank: ~25 MB over
    4,096 ranks); a gather from the distinct values copies only 16-byte views, which share one
    buffer of the distinct text.
    """
    strs = [c for c, t in df.schema.items() if t == pl.Utf8]
    return df.with_columns(_shared(df[c]) for c in strs) if strs else df


def _shared(s: pl.Series) -> pl.Series:
    """``s`` (String) as views into a fresh buffer of its distinct values (same values, nulls kept)."""
    text = pl.Series(s.name, s.drop_nulls().unique(maintain_order=True).to_list(), dtype=pl.Utf8)
    return text.gather(s.cast(pl.Enum(text)).to_physical())


@dataclass(frozen=True)
class FirstPass:
    """What the first pass keeps of every rank.

    Attributes:
        all_windows: Step windows of every step (``step_windows(events, None)`` widened to the work
            each step launched: :func:`~ep_trace.analysis.step_work.device_windows`).
        active_steps: The steps holding device activity on some rank (what
            :func:`~ep_trace.analysis.steps.select_steps` needs of the activity; the activity
            itself is rebuilt block by block in the second pass, never held for every rank).
        mode: ``rank -> 'gpu' | 'cpu'``.
        blocking: The blocking host calls (``rank, kind, name, start_ns, end_ns``), the events
            :func:`~ep_trace.analysis.host_stalls.host_stalls` reads.
        gap_floor: :func:`~ep_trace.analysis.launch_floor.device_gap_floor` (``rank -> ns``).
    """

    all_windows: pl.DataFrame
    active_steps: pl.Series
    mode: dict[int, str]
    blocking: pl.DataFrame
    gap_floor: dict[int, float]


def first_pass(tables: TraceTables, blocks: Blocks, steps: tuple[int, int] | None) -> FirstPass:
    """Step windows, device activity and blocking host calls, block by block.

    Args:
        tables: The canonical tables.
        blocks: :func:`rank_blocks`.
        steps: ``AnalysisConfig.steps`` (the activity reads the windows of these steps only).
    """
    single = len(blocks) == 1
    wins, active, blks = [], [], []
    mode: dict[int, str] = {}
    floor: dict[int, float] = {}
    for b, ev in _events(tables, blocks, _UNREAD):
        coll = _of(tables.collectives, b, single)
        w = step_windows(ev, None)
        act, m = device_activity(ev, coll, _steps(w, steps))
        if steps is None or steps[0] > 0:  # --steps 0 keeps a marker-less rank's whole trace
            u = user_range_steps(w, ev, act)
            if not u.equals(w):  # a user range is the step: its thread is the compute thread
                w = u
                act, m = device_activity(ev, coll, _steps(w, steps))
        w = device_windows(w, act)  # a step is the work it launched (step_work)
        assigned = assign_activity(act, w)
        w = trim_warmup(w, assigned, ev)  # never past a step's first work: the assignment stands
        wins.append(w)
        active.append(_steps(assigned.filter(pl.col("step").is_not_null()), steps)["step"].unique())
        mode |= m
        floor |= device_gap_floor(ev)  # per rank: queued kernel pairs of one stream
        host = ev.select("rank", "kind", "name", "start_ns", "end_ns").filter(
            pl.col("kind").is_in(["runtime", "cpu_op"])
        )
        blks.append(_own_strings(name_filter(host, BLOCKING_RE)))
    return FirstPass(_concat(wins), pl.concat(active).unique().sort(), mode, _concat(blks), floor)


def _steps(windows: pl.DataFrame, steps: tuple[int, int] | None) -> pl.DataFrame:
    return windows if steps is None else windows.filter(pl.col("step").is_between(steps[0], steps[1]))


@dataclass(frozen=True)
class SecondPass:
    """What the second pass keeps of every rank (frames as the engine's all-ranks passes made them).

    Attributes:
        activity: Device activity of every rank with ``step`` (analysed steps), only the columns the
            cross-rank passes read: ``rank, cls`` (an Enum: 1 byte a row where a String costs 16)
            ``, start_ns, end_ns, step, launch_end_ns`` (the step graph's ``queued`` pieces).
        overlap: ``segment_lengths`` of the comm / compute overlay per ``(rank, step)``.
        exposed_union: The union of the comm-only segments per ``(rank, step)`` (own clock).
        exposed_iv: Comm minus compute per rank, all steps (own clock).
        stages: Stage rows (``sid`` unique within a block only), filtered to the analysed steps when
            ``steps`` is set.
        detection: The most common stage detection method (``'none'`` without stage rows).
        top_ops: :func:`~ep_trace.analysis.breakdown.top_ops`.
        top_kernels: :func:`~ep_trace.analysis.breakdown.top_kernels`.
        coverage: :func:`~ep_trace.analysis.stage_coverage.coverage` of every rank.
        unassigned: :func:`~ep_trace.analysis.stage_coverage.unassigned` over every rank.
    """

    activity: pl.DataFrame
    overlap: pl.DataFrame
    exposed_union: pl.DataFrame
    exposed_iv: pl.DataFrame
    stages: pl.DataFrame
    detection: str
    top_ops: pl.DataFrame
    top_kernels: pl.DataFrame
    coverage: pl.DataFrame
    unassigned: pl.DataFrame


def second_pass(
    tables: TraceTables,
    blocks: Blocks,
    first: FirstPass,
    windows: pl.DataFrame,
    config: AnalysisConfig,
) -> SecondPass:
    """Activity (again: as in the first pass), overlap, stages, top ops and kernels, block by block.

    Args:
        tables: The canonical tables.
        blocks: :func:`rank_blocks`.
        first: :func:`first_pass`.
        windows: The analysed steps' windows (after ``select_steps``).
        config: Analysis knobs (stage presets, steps).
    """
    single, mode = len(blocks) == 1, first.mode
    presets = stages.load_presets(config.stage_presets)
    kernels = stages.load_user_kernels(config.stage_presets)
    keys = ("act", "ov", "xu", "xiv", "st", "ops", "kern", "cov", "un")
    out: dict[str, list[pl.DataFrame]] = {k: [] for k in keys}
    for b, ev in _events(tables, blocks, _UNREAD):
        # the first pass' activity of these ranks (same windows), then the analysed steps
        wf = _steps(_of(first.all_windows, b, single), config.steps)
        a, _ = device_activity(ev, _of(tables.collectives, b, single), wf)
        w = _of(windows, b, single)
        a = assign_activity(a, w)
        out["act"].append(a.select("rank", pl.col("cls").cast(_CLS), "start_ns", "end_ns", "step", "launch_end_ns"))
        ins = a.filter(pl.col("step").is_not_null())
        comm, comp = ins.filter(pl.col("cls") == "comm"), ins.filter(pl.col("cls") == "compute")
        seg = overlay(comm, comp, ["rank", "step"])  # once: step overlap lengths and exposed intervals
        del ins, comm, comp
        out["ov"].append(segment_lengths(seg, ["rank", "step"]))
        out["xu"].append(union(seg.filter(pl.col("state") == 1), ["rank", "step"]))
        del seg
        xiv = subtract(a.filter(pl.col("cls") == "comm"), a.filter(pl.col("cls") == "compute"), ["rank"])
        out["xiv"].append(xiv)
        det = stage_tiers.detect(ev, a, mode, w, xiv, presets, kernels)
        st = _own_strings(det.rows)
        out["st"].append(st)
        out["cov"].append(stage_coverage.coverage(det.attributed))
        out["un"].append(_own_strings(stage_coverage.unassigned(det.attributed)))
        del det
        if config.steps is not None:  # ranges outside the chosen steps are not part of the analysis
            st = st.filter(pl.col("step").is_not_null())
        out["ops"].append(_own_strings(top_ops(ev, w, st)))
        out["kern"].append(_own_strings(top_kernels(a, st)))
    st_all = _concat(out["st"])
    detection = "none"
    if st_all.height and "method" in st_all.columns:
        methods = st_all["method"].value_counts(sort=True)
        detection = str(methods["method"][0])
    if config.steps is not None:
        st_all = st_all.filter(pl.col("step").is_not_null())
    return SecondPass(
        _concat(out["act"]),
        _concat(out["ov"]),
        _concat(out["xu"]),
        _concat(out["xiv"]),
        st_all,
        detection,
        _concat(out["ops"]),
        _concat(out["kern"]),
        _concat(out["cov"]),
        stage_coverage.combine_unassigned(_concat(out["un"])),
    )


def by_block(blocks: Blocks, fn: Callable[..., pl.DataFrame], *frames: pl.DataFrame) -> pl.DataFrame:
    """``fn(*frames)`` of a per-rank analysis, computed on each block's rows of ``frames`` (all with a
    ``rank`` column) and concatenated in rank order: its intermediates hold one block at a time."""
    if len(blocks) <= 1:
        return fn(*frames)
    return _concat([fn(*(f.filter(_in(b)) for f in frames)) for b in blocks])


def drain_blocks(df: pl.DataFrame, blocks: Blocks) -> Iterator[pl.DataFrame]:
    """The rows of each block of ``df`` (all of it for at most one block), in block order, each
    released once the consumer moves to the next: ``df`` itself is dropped when the first block is
    taken, so a caller that keeps no other reference to it holds one copy of the rows, shrinking,
    instead of all of them while what it builds from them grows (the step graph's work pieces)."""
    parts = [df] if len(blocks) <= 1 else [df.filter(_in(b)) for b in blocks]
    del df
    parts.reverse()
    while parts:
        yield parts.pop()


def chunk_cost(tables: TraceTables, blocks: Blocks, stage_df: pl.DataFrame, mode: dict[int, str]) -> dict[int, float]:
    """:func:`~ep_trace.analysis.chunk_cost.per_chunk_cost`, block by block (read again: it is only
    needed when some layer can be chunked)."""
    single = len(blocks) == 1
    out: dict[int, float] = {}
    for b, ev in _events(tables, blocks, _UNREAD):
        out |= per_chunk_cost(ev, _of(stage_df, b, single), mode, _of(tables.collectives, b, single))
    return out


def op_stalls(tables: TraceTables, blocks: Blocks, stage_df: pl.DataFrame, cpu_ranks: frozenset[int]) -> pl.DataFrame:
    """:func:`~ep_trace.analysis.op_stalls.stage_op_stalls`, block by block; no read without CPU ranks.

    Each block yields its permute / unpermute op calls (a few per layer); the stalls are found once
    over all of them, because an op's usual time is the minimum over every rank of its median."""
    if not cpu_ranks:
        return pl.DataFrame(schema=STALL_SCHEMA)
    single = len(blocks) == 1
    calls = [stage_calls(ev, _of(stage_df, b, single), cpu_ranks) for b, ev in _events(tables, blocks, _UNREAD)]
    return stalls_of_calls(_concat(calls))


def hta_overlap(tables: TraceTables, blocks: Blocks) -> pl.DataFrame:
    """:func:`~ep_trace.analysis.hta_compat.hta_overlap` block by block (``--hta-compatible``).

    HTA's step filter depends on the whole trace set (more than one distinct ``ProfilerStep``
    name), so that is counted once over every rank first; the rest is per rank."""
    from ep_trace.analysis.hta_compat import hta_overlap as one

    steps = tables.scan_events().filter(pl.col("seq").is_not_null()).select(pl.col("seq").n_unique()).collect()
    multi = bool(steps.item() > 1)
    return _concat([one(ev, multi) for _, ev in _events(tables, blocks)])
