"""Stage coverage: how much of the MoE time got a stage, by tier, and what did not.

MoE time of a (rank, step): |union of the device intervals that got an MoE stage (any tier), and of
the unclaimed ones inside an MoE window| (:mod:`ep_trace.analysis.stage_tiers`: a framework MoE op or
range, an ``nn.Module`` MoE block, an op window, a layer's span of stage ranges, or the device span of
a CUDA-graph-replayed layer's family kernels). Copies (memcpy / memset) are no MoE time. On CPU ranks
the intervals are the compute pieces, clipped to the windows. Covered = |union of the attributed ones|; per tier, the time the tier added
over the better tiers (|U_<=t| - |U_<t|: the tiers' figures add up to the covered time even where
streams overlap); unassigned = MoE time - covered.

The unassigned kernels (by name, over every rank and step) come with the stage their neighbours in
the window suggest and a ``[[kernel]]`` snippet for ``--stages`` that would claim them.
"""

from __future__ import annotations

import re
from typing import Any, cast

import polars as pl

from ep_trace.analysis.intervals import union_length
from ep_trace.analysis.moe_windows import MOE_STAGES
from ep_trace.analysis.stage_tiers import TIERS

__all__ = ["coverage", "unassigned", "snippet", "pattern_of", "combine_unassigned", "summarize", "WARN_SHARE"]

#: Below this share of the MoE time covered, the terminal and the report warn.
WARN_SHARE = 0.9
_META = set("\\.^$|?*+()[]{}")


def _moe(pieces: pl.DataFrame) -> pl.DataFrame:
    return pieces.filter(
        pl.col("step").is_not_null()
        & (pl.col("cls").cast(pl.Utf8) != "memory")
        & (pl.col("stage").is_in(MOE_STAGES) | (pl.col("stage").is_null() & pl.col("mw").is_not_null()))
    )


def coverage(pieces: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step): ``moe_ns, covered_ns, unassigned_ns, share`` and ``<tier>_ns`` per tier.

    Args:
        pieces: :attr:`ep_trace.analysis.stage_tiers.StageDetection.attributed`.
    """
    key = ["rank", "step"]
    m = _moe(pieces)
    out = union_length(m, key, "moe_ns")
    if out.is_empty():
        return out.with_columns(
            *(pl.lit(0, pl.Int64).alias(c) for c in ("covered_ns", "unassigned_ns")),
            pl.lit(None, pl.Float64).alias("share"),
            *(pl.lit(0, pl.Int64).alias(f"{t}_ns") for t in TIERS),
        )
    prev = ""
    for i, t in enumerate(TIERS):
        upto = union_length(m.filter(pl.col("tier").is_in(TIERS[: i + 1])), key, "_u")
        out = out.join(upto, on=key, how="left").with_columns(pl.col("_u").fill_null(0))
        gain = pl.col("_u") - (pl.col(prev) if prev else pl.lit(0))
        out = out.with_columns(gain.alias(f"{t}_ns"), pl.col("_u").alias("_cum")).drop("_u")
        out = out.rename({"_cum": f"_c{i}"})
        prev = f"_c{i}"
    out = out.rename({prev: "covered_ns"}).drop([f"_c{i}" for i in range(len(TIERS) - 1)])
    return out.with_columns(
        (pl.col("moe_ns") - pl.col("covered_ns")).clip(0).alias("unassigned_ns"),
        (pl.col("covered_ns") / pl.col("moe_ns")).alias("share"),
    ).select("rank", "step", "moe_ns", "covered_ns", "unassigned_ns", "share", *(f"{t}_ns" for t in TIERS))


def unassigned(pieces: pl.DataFrame) -> pl.DataFrame:
    """The unclaimed kernels inside MoE windows, by name: ``name, total_ns, count, guess`` (the stage of
    the nearest attributed interval before it in its window, else after it), largest first."""
    m = _moe(pieces).sort("rank", "mw", "start_ns")
    if m.is_empty():
        return pl.DataFrame(schema={"name": pl.Utf8, "total_ns": pl.Int64, "count": pl.UInt32, "guess": pl.Utf8})
    by = ["rank", "mw"]
    near = pl.coalesce(
        pl.col("stage").forward_fill().over(by), pl.col("stage").backward_fill().over(by), pl.lit("expert")
    )
    u = m.with_columns(near.alias("guess")).filter(pl.col("stage").is_null() & (pl.col("name") != "cpu compute"))
    return combine_unassigned(
        u.group_by("name", "guess").agg(
            (pl.col("end_ns") - pl.col("start_ns")).sum().alias("total_ns"), pl.len().alias("count")
        )
    )


def combine_unassigned(parts: pl.DataFrame) -> pl.DataFrame:
    """Per-name totals of ``name, guess, total_ns, count`` rows (blocks of ranks): the guess that holds
    most of the name's time."""
    if parts.is_empty():
        return pl.DataFrame(schema={"name": pl.Utf8, "total_ns": pl.Int64, "count": pl.UInt32, "guess": pl.Utf8})
    g = parts.group_by("name", "guess").agg(pl.col("total_ns").sum(), pl.col("count").sum())
    best = g.sort("total_ns", "guess", descending=[True, False]).unique("name", keep="first").select("name", "guess")
    tot = g.group_by("name").agg(pl.col("total_ns").sum(), pl.col("count").sum().cast(pl.UInt32))
    return tot.join(best, on="name").sort("total_ns", "name", descending=[True, False])


def pattern_of(name: str) -> str:
    """A regex for a kernel name and its template / argument variants: the kernel's qualified name,
    escaped, anchored at the start (after an optional ``void``); for a short wrapper whose first
    template argument names the kernel (``cutlass::device_kernel<flash::FlashAttnBwd<...>>``,
    ``cutlass::Kernel<cutlass_80_tensorop_...>``) that argument instead, unanchored."""
    head = name.removeprefix("void ").strip().split("(", 1)[0]
    m = re.match(r"([A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)\s*(?:<\s*([A-Za-z_]\w*(?:::[A-Za-z_]\w*)*))?", head)
    if m is None:
        return "^" + "".join("\\" + c if c in _META else c for c in name) + "$"
    fn, arg = m.group(1), m.group(2)
    wrapper = fn.count("::") <= 1 and arg is not None and ("::" in arg or len(arg) > len(fn.split("::")[-1]))
    if wrapper and arg is not None:
        return rf"{arg}\b"
    return rf"^(?:void\s+)?{fn}\b"


def snippet(rows: pl.DataFrame, limit: int = 5) -> str:
    """A ``--stages`` TOML snippet claiming the first ``limit`` rows of :func:`unassigned`."""
    out = []
    for r in rows.head(limit).iter_rows(named=True):
        example = r["name"].replace("\\", "\\\\").replace('"', '\\"')
        out.append(
            "[[kernel]]\n"
            f'framework = "mine"\npattern = \'{pattern_of(r["name"])}\'\nstage = "{r["guess"]}"\n'
            f'examples = ["{example}"]\nsource = "seen in my trace"\n'
        )
    return "\n".join(out)


def summarize(cov: pl.DataFrame | None, un: pl.DataFrame | None, top: int = 10) -> dict[str, Any] | None:
    """The coverage as plain data (the JSON summary's ``stage_coverage``, the terminal and the report).

    Returns:
        None without MoE time; else ``share`` (covered / MoE time over every rank and step), ``warn``
        (share < :data:`WARN_SHARE`), ``moe_ns`` / ``covered_ns`` / ``unassigned_ns`` (means per rank and
        step), ``by_tier`` (each tier's share of the MoE time), ``min_share`` (the worst rank and step),
        ``per_rank`` and ``unassigned_top`` (per-step time, guessed stage, ``pattern``) and ``snippet``.
    """
    if cov is None or cov.is_empty() or int(cov["moe_ns"].sum()) <= 0:
        return None
    n = cov.height
    moe = int(cov["moe_ns"].sum())
    per_rank = (
        cov.group_by("rank")
        .agg(pl.col("moe_ns").sum(), pl.col("covered_ns").sum(), pl.col("unassigned_ns").sum(), pl.len().alias("_n"))
        .sort("rank")
        .select(
            "rank",
            (pl.col("covered_ns") / pl.col("moe_ns")).alias("share"),
            (pl.col("moe_ns") / pl.col("_n")).round(0).cast(pl.Int64).alias("moe_ns"),
            (pl.col("unassigned_ns") / pl.col("_n")).round(0).cast(pl.Int64).alias("unassigned_ns"),
        )
    )
    rows = un.head(top) if un is not None else pl.DataFrame()
    share = float(cov["covered_ns"].sum()) / moe
    return {
        "share": share,
        "warn": share < WARN_SHARE,
        "moe_ns": round(moe / n),
        "covered_ns": round(int(cov["covered_ns"].sum()) / n),
        "unassigned_ns": round(int(cov["unassigned_ns"].sum()) / n),
        "by_tier": {t: float(cov[f"{t}_ns"].sum()) / moe for t in TIERS},
        "min_share": float(cast(float, cov["share"].min())),
        "per_rank": per_rank.to_dicts(),
        "unassigned_top": [
            {
                "name": r["name"],
                "per_step_ns": round(r["total_ns"] / n),
                "count": r["count"],
                "guess": r["guess"],
                "pattern": pattern_of(r["name"]),
            }
            for r in rows.iter_rows(named=True)
        ],
        "snippet": snippet(rows) if rows.height else "",
    }
