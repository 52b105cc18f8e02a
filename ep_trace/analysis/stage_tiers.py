"""Stage detection of a block of ranks, tier by tier, each assignment recording its tier.

1. ``range``: host ranges (ep-trace's ``ep:`` names, a user ``--stages`` file, framework presets;
   :mod:`ep_trace.analysis.stages`);
2. ``family``: the kernel families of the knowledge table for the kernels no range claimed
   (:mod:`ep_trace.analysis.stage_families`), with every MoE window (framework MoE op, module block,
   op window) as context;
3. ``module``: MoE blocks of ``nn.Module`` frames (:mod:`ep_trace.analysis.moe_blocks`): the work a
   block launched, by the role of the child that launched it and its position
   (:mod:`ep_trace.analysis.moe_segments`);
4. ``cpu_op``: the ops of a framework MoE op or range, or of a window found from ops alone
   (:mod:`ep_trace.analysis.moe_ops`), the same way; CPU-only traces are attributed here;
5. ``token``: name tokens (the ``[[token]]`` rows: ``topk`` / ``router`` -> route, ``sort`` / ``align`` /
   ``histogram`` -> permute, ``grouped ... gemm`` -> expert, ``finalize`` / ``reduce`` after the experts ->
   unpermute) for the kernels still unclaimed *inside an MoE window* found by a higher tier
   (:mod:`ep_trace.analysis.moe_windows`), never over a whole step (:mod:`ep_trace.analysis.name_tokens`).

Each tier only sees what the earlier ones left. The MoE windows found on the way, and every
attributed interval with its tier, go to the coverage (:mod:`ep_trace.analysis.stage_coverage`).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ep_trace.analysis import moe_blocks, moe_ops, moe_segments, moe_windows, name_tokens, stage_families, stages
from ep_trace.analysis.intervals import range_join, subtract
from ep_trace.analysis.steps import assign_step
from ep_trace.knowledge import Row

__all__ = ["TIERS", "StageDetection", "detect", "tier_of_method"]

#: Detection tiers, best first.
TIERS = ("range", "family", "module", "cpu_op", "token")
_CAT = {"route": "route", "route_aux": "route_aux", "permute": "permute", "unpermute": "unpermute", "expert": "expert"}
_RANGE_CAT = {"route": "route", "permute": "permute", "dispatch": "permute", "expert": "expert"}
_RANGE_CAT |= {"combine": "unpermute", "unpermute": "unpermute", "shared_expert": "shared"}


def tier_of_method(method: pl.Expr) -> pl.Expr:
    """The tier of a stage row's ``method`` (``ep_trace`` / ``preset:*`` -> range, ...)."""
    m = method.cast(pl.Utf8)
    return (
        pl.when(m.is_in(["ep_trace"]) | m.str.starts_with("preset:"))
        .then(pl.lit("range"))
        .when(m == "kernel_family")
        .then(pl.lit("family"))
        .when(m.str.starts_with("module:"))
        .then(pl.lit("module"))
        .when(m == "cpu_op")
        .then(pl.lit("cpu_op"))
        .otherwise(pl.lit("token"))
    )


@dataclass(frozen=True)
class StageDetection:
    """What the stage detection of a block of ranks found.

    Attributes:
        rows: Stage rows (the stages table plus ``comm_ns, overlapped_ns, exposed_comm_ns, sid, tier``).
        attributed: Every attributed interval and every unclaimed one inside an MoE window (``mw``):
            ``rank, step, mw, layer, stage, tier, cls, name, start_ns, end_ns`` (``stage`` null = unclaimed).
    """

    rows: pl.DataFrame
    attributed: pl.DataFrame


def _windows(
    ev: pl.DataFrame, ops: pl.DataFrame, cont: pl.DataFrame, ranges: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """All MoE host windows (``wid, rank, tid, start_ns, end_ns, method, kind``) and their items
    (``wid, start_ns, cat``); ``cont`` and ``ranges``: :func:`ep_trace.analysis.stages.detect_containers`
    and :func:`ep_trace.analysis.stages.detect_ranges` of ``ev``."""
    frames = moe_blocks.module_frames(ev)
    topk = ops.filter(pl.col("role") == "route")
    in_frames = range_join(
        topk.select("rank", "tid", "start_ns"),
        frames.select("rank", "tid", "fid", pl.col("start_ns").alias("_fs"), pl.col("end_ns").alias("_fe")),
        ("start_ns", "start_ns"),
        ("_fs", "_fe"),
        by=("rank", "tid"),
    )["fid"]
    children = moe_blocks.block_children(frames, in_frames)
    blocks = moe_blocks.moe_blocks(frames, children)
    mod = blocks.select(
        pl.col("bid").alias("wid"), "rank", "tid", "start_ns", "end_ns", ("module:" + pl.col("cls")).alias("method")
    ).with_columns(pl.lit("module").alias("kind"))
    ch = children.join(blocks.select("bid"), on="bid", how="semi").rename({"bid": "wid"})
    named = ch.group_by("wid").agg((pl.col("cat") == "expert").any().alias("_has_exp"))
    body = moe_ops.items_in(ops.drop("oid", "name"), mod, ch.select("wid", "rank", "tid", "start_ns", "end_ns"))
    body = body.join(named, on="wid", how="left").with_columns(
        pl.when((pl.col("role") == "expert") & pl.col("_has_exp").fill_null(False))
        .then(pl.lit("other"))
        .otherwise(pl.col("role").replace_strict(_CAT, default="other"))
        .alias("cat")
    )
    items = [ch.select("wid", "start_ns", "cat"), body.select("wid", "start_ns", "cat")]
    # an experts module outside every block: a layer whose work is all expert work (one item)
    lone = moe_blocks.lone_experts(frames, blocks).select(
        pl.col("bid").alias("wid"), "rank", "tid", "start_ns", "end_ns", ("module:" + pl.col("cls")).alias("method")
    )
    items.append(lone.select("wid", "start_ns", pl.lit("expert").alias("cat")))
    mod = pl.concat([mod, lone.with_columns(pl.lit("module").alias("kind"))])
    # framework MoE ops / ranges (containers) outside every block: their top-level ops and stage ranges
    off = int(ev.select(pl.col("event_id").max().fill_null(0)).item()) + 1
    cw = cont.with_row_index("wid").select(
        (pl.col("wid").cast(pl.Int64) + off).alias("wid"),
        "rank",
        "tid",
        pl.col("cpu_start_ns").alias("start_ns"),
        pl.col("cpu_end_ns").alias("end_ns"),
        pl.lit("cpu_op").alias("method"),
        pl.lit("container").alias("kind"),
    )
    cw = cw.join(_inside(cw, mod), on="wid", how="anti")
    rng = ranges.select(
        "rank", "tid", pl.col("cpu_start_ns").alias("start_ns"), pl.col("cpu_end_ns").alias("end_ns"), "stage"
    )
    c_items = moe_ops.items_in(
        pl.concat(
            [
                ops.drop("oid", "name").with_columns(pl.lit(None, pl.Utf8).alias("stage")),
                rng.with_columns(pl.lit(None, pl.Utf8).alias("role")),
            ],
            how="diagonal_relaxed",
        ),
        cw,
    )
    cat = pl.coalesce(
        pl.col("stage").replace_strict(_RANGE_CAT, default=None), pl.col("role").replace_strict(_CAT, default="other")
    )
    items.append(c_items.select("wid", "start_ns", cat.alias("cat")))
    # windows from ops alone, outside the blocks, the containers and every stage range (a layer the
    # ranges describe is theirs: the glue between them stays unattributed, not guessed)
    ow, o_items = moe_ops.op_windows(ops, pl.concat([mod, cw, rng], how="diagonal_relaxed"))
    ow = ow.with_columns(pl.col("wid") + 2 * off, pl.lit("cpu_op").alias("method"), pl.lit("op_window").alias("kind"))
    o_items = o_items.with_columns(
        pl.col("wid") + 2 * off, pl.col("role").replace_strict(_CAT, default="other").alias("cat")
    )
    items.append(o_items.select("wid", "start_ns", "cat"))
    win = pl.concat([mod, cw, ow], how="diagonal_relaxed")
    return win, pl.concat([i.cast({"wid": pl.Int64}) for i in items], how="vertical_relaxed")


def _inside(w: pl.DataFrame, outer: pl.DataFrame) -> pl.DataFrame:
    """``wid`` of the windows of ``w`` lying inside a window of ``outer`` (same rank)."""
    if w.is_empty() or outer.is_empty():
        return w.select("wid").head(0)
    o = outer.select("rank", pl.col("start_ns").alias("_os"), pl.col("end_ns").alias("_oe"))
    j = range_join(w.select("wid", "rank", "start_ns", "end_ns"), o, ("start_ns", "start_ns"), ("_os", "_oe"))
    return j.filter(pl.col("end_ns") <= pl.col("_oe")).select("wid").unique()


def _unclaimed(act: pl.DataFrame, att: pl.DataFrame, mode: dict[int, str], steps: pl.DataFrame) -> pl.DataFrame:
    """The activity no earlier tier claimed: device rows by id, CPU compute pieces minus the claimed time."""
    cpu = [r for r, m in mode.items() if m == "cpu"]
    is_cpu = pl.col("rank").is_in(cpu) & (pl.col("cls") == "compute")
    rest = act.filter(~is_cpu & ~pl.col("aid").is_in(att["aid"].implode()))
    pieces = act.filter(is_cpu)
    if pieces.is_empty():
        return rest
    claimed = att.filter(pl.col("rank").is_in(cpu) & (pl.col("cls") == "compute")).select("rank", "start_ns", "end_ns")
    # one compute thread per CPU rank (activity._cpu): subtract per rank, then give the thread back
    keep = pieces.select("rank", "start_ns", "end_ns")
    free = subtract(keep, claimed, ["rank"]) if claimed.height else keep
    free = free.join(pieces.group_by("rank").agg(pl.col("anchor_tid").first()), on="rank", how="left")
    base = int(act.select(pl.col("aid").max().fill_null(0)).item()) + 1
    free = free.with_row_index("_i").select(
        "rank",
        pl.lit("compute").alias("cls"),
        pl.lit("cpu compute").alias("name"),
        "start_ns",
        "end_ns",
        pl.col("start_ns").alias("anchor_ns"),
        "anchor_tid",
        (pl.col("_i").cast(pl.Int64) + base).alias("aid"),
    )
    return pl.concat([rest, assign_step(free, steps, "anchor_ns")], how="diagonal_relaxed")


def _segment_rows(
    items: pl.DataFrame, win: pl.DataFrame, act: pl.DataFrame, mode: dict[int, str], steps: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Tiers ``module`` and ``cpu_op``: the windows' segments, the activity they hold (``act`` is what
    the earlier tiers left) and its stage (communication -> dispatch / combine).

    Returns:
        ``(ranges, attributed)``: ranges with ``sid`` (as :func:`ep_trace.analysis.stages.measure` reads
        them) and the attributed rows with ``sid``.
    """
    seg = moe_segments.segments(moe_segments.item_stages(items), win)
    empty = (seg.head(0), act.head(0).with_columns(pl.lit(None, pl.UInt32).alias("sid")))
    if seg.is_empty() or act.is_empty():
        return empty
    seg = seg.drop("wid").with_columns(
        pl.lit(None, pl.Int32).alias("layer"), pl.lit(None, pl.Int32).alias("microbatch"), pl.lit("fwd").alias("phase")
    )
    r = assign_step(seg, steps, "cpu_start_ns").with_row_index("sid")
    att = stages.attach(r, act, mode)
    if att.is_empty():
        return r.head(0), att
    # communication launched before the experts is the dispatch, from the experts on the combine
    att = att.join(r.select("sid", pl.col("stage").alias("_st")), on="sid").with_columns(
        moe_segments.comm_stage(pl.col("_st"), pl.col("cls")).alias("_cst")
    )
    moved = att.filter(pl.col("_cst") != pl.col("_st")).select("sid", "_cst").unique()
    if moved.height:
        n = r.height
        extra = (
            moved.sort("sid", "_cst")
            .with_row_index("_k")
            .join(r.drop("stage"), on="sid")
            .with_columns((pl.col("_k") + n).cast(pl.UInt32).alias("_nsid"))
        )
        att = att.join(extra.select("sid", "_cst", "_nsid"), on=["sid", "_cst"], how="left").with_columns(
            pl.coalesce("_nsid", "sid").alias("sid")
        )
        r = pl.concat([r, extra.drop("sid", "_k").rename({"_cst": "stage", "_nsid": "sid"}).select(r.columns)])
    return r, att.drop("_st", "_cst", "_nsid", strict=False)


def _outermost(c: pl.DataFrame) -> pl.DataFrame:
    """The windows not inside an earlier-starting one of the same rank (``cpu_start_ns`` / ``cpu_end_ns``)."""
    c = c.sort(["rank", "cpu_start_ns", "cpu_end_ns"], descending=[False, False, True])
    prev = pl.col("cpu_end_ns").cum_max().shift(1).over("rank")
    return c.filter(prev.is_null() | (pl.col("cpu_start_ns") >= prev))


def _finish(parts: list[pl.DataFrame], done: pl.DataFrame, rest: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The stage rows of every tier with their ``tier``; every attributed or in-window interval."""
    full = [p.with_columns(pl.col("sid").cast(pl.Int64)) for p in parts if p.height]
    rows_ = pl.concat(full, how="vertical_relaxed") if full else parts[0].with_columns(pl.col("sid").cast(pl.Int64))
    rows_ = rows_.with_columns(tier_of_method(pl.col("method")).alias("tier")).sort(["rank", "cpu_start_ns"])
    done = done.with_columns(pl.col("sid").cast(pl.Int64)).join(rows_.select("sid", "tier"), on="sid", how="left")
    pieces = pl.concat([done, rest.filter(pl.col("mw").is_not_null())], how="diagonal_relaxed")
    cols = ["rank", "step", "mw", "layer", "stage", "tier", "cls", "name", "start_ns", "end_ns"]
    return rows_, pieces.select([pl.col(c) if c in pieces.columns else pl.lit(None).alias(c) for c in cols])


def detect(
    ev: pl.DataFrame,
    act: pl.DataFrame,
    mode: dict[int, str],
    steps: pl.DataFrame,
    exposed_iv: pl.DataFrame,
    presets: list[dict],  # type: ignore[type-arg]
    kernels: tuple[Row, ...] = (),
) -> StageDetection:
    """Stage rows of the ranks of ``ev``, tier by tier (the module doc).

    Args:
        ev: Events of a block of ranks.
        act: Their device activity with ``step`` (:func:`ep_trace.analysis.activity.device_activity`).
        mode: rank -> ``'gpu'`` / ``'cpu'``.
        steps: The analysed steps' windows.
        exposed_iv: Exposed-comm intervals of the ranks.
        presets: Range presets (:func:`ep_trace.analysis.stages.load_presets`).
        kernels: User ``[[kernel]]`` rows.
    """
    act = act.with_row_index("aid").with_columns(pl.col("aid").cast(pl.Int64))
    ops = moe_ops.op_items(ev)
    pc = stages.detect_containers(ev, presets)
    ranges = stages.detect_ranges(ev, presets)
    win, items = _windows(ev, ops, pc, ranges)
    found = win.filter(pl.col("kind") != "container").select(
        "rank",
        "tid",
        pl.col("start_ns").alias("cpu_start_ns"),
        pl.col("end_ns").alias("cpu_end_ns"),
        pl.lit(None, pl.Int32).alias("layer"),
    )
    cont = stage_families.container_index(_outermost(pl.concat([pc, found], how="vertical_relaxed")), steps)
    st, att = stages.attribute(ranges, act, mode, steps, exposed_iv)
    st = stage_families.layers_from_containers(st, cont)
    parts = [st]
    fam = stage_families.family_rows(act, att["aid"], cont, kernels)
    claimed = [att.join(st.select("sid", "stage"), on="sid")]
    fam_dev = pl.DataFrame()
    if fam.height:
        fr = stage_families.family_ranges(fam)
        fatt = fam.join(fr.select("rank", "run", "sid"), on=["rank", "run"], how="inner")
        fr_st = stages.measure(fr.drop("run"), fatt, exposed_iv)
        parts.append(fr_st)
        claimed.append(fatt.drop("stage").join(fr_st.select("sid", "stage"), on="sid"))
        fam_dev = fatt.join(fr_st.select("sid", "layer"), on="sid")
    done = pl.concat(
        [
            c.select("aid", "rank", "step", "cls", "name", "start_ns", "end_ns", "anchor_ns", "sid", "stage")
            for c in claimed
        ],
        how="diagonal_relaxed",
    )
    rest = _unclaimed(act, done, mode, steps)
    # copies (memcpy / memset) stay out of the name-independent tiers, as out of the families: a segment
    # says which call launched a kernel, not what a copy around it moved
    sr, satt = _segment_rows(items, win, rest.filter(pl.col("cls") != "memory"), mode, steps)
    if satt.height:
        # a segment that launched nothing is no stage row (the route segment of an op that ran on the host)
        sr = sr.filter(pl.col("sid").is_in(satt["sid"].unique().implode()))
        sr = stage_families.layers_from_containers(sr.with_columns(pl.col("sid").cast(pl.Int64) + (2 << 40)), cont)
        satt = satt.with_columns(pl.col("sid").cast(pl.Int64) + (2 << 40))
        parts.append(stages.measure(sr, satt, exposed_iv))
        done = pl.concat([done, satt.join(sr.select("sid", "stage"), on="sid")], how="diagonal_relaxed")
        rest = _unclaimed(rest, satt, mode, steps)
    cpu = [r for r, m in mode.items() if m == "cpu"]
    host = moe_windows.host_windows(cont, st)
    rest = moe_windows.sandwiched(moe_windows.assign_windows(rest, host, cpu), fam_dev)
    done = moe_windows.assign_windows(done, host, cpu)
    # family layers outside every host window: their own device window
    fam_mw = moe_windows.device_mw(pl.col("rank"), pl.col("step"), pl.col("_fl"))
    if fam_dev.height:
        done = (
            done.join(fam_dev.select("aid", pl.col("layer").alias("_fl")), on="aid", how="left")
            .with_columns(
                pl.when(pl.col("mw").is_null() & pl.col("_fl").is_not_null())
                .then(fam_mw)
                .otherwise(pl.col("mw"))
                .alias("mw"),
                pl.coalesce("layer", "_fl").alias("layer"),
            )
            .drop("_fl")
        )
    x0 = done.filter(pl.col("stage") == "expert").group_by("mw").agg(pl.col("start_ns").min().alias("_x0"))
    tr, tatt = name_tokens.token_rows(rest, x0, kernels)
    if tatt.height:
        tr = tr.with_columns(pl.col("sid").cast(pl.Int64) + (3 << 40))
        tatt = tatt.with_columns(pl.col("sid").cast(pl.Int64) + (3 << 40))
        parts.append(stages.measure(tr, tatt.drop("stage"), exposed_iv))
        done = pl.concat([done, tatt], how="diagonal_relaxed")
        rest = rest.join(tatt.select("aid"), on="aid", how="anti")
    rows_, pieces = _finish(parts, done, rest)
    return StageDetection(rows_, pieces)
