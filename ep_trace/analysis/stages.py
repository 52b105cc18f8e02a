"""Stage attribution: which host ranges are EP stages, and which device work belongs to each.

Detection is layered; the tiers *combine* instead of excluding each other:

1. host ranges, best tier first (the ``[[range]]`` rows of the knowledge table, ``ep_trace/families.toml``):
   ep-trace's own ``ep:<stage>...`` names
   (tier 0, parsed by :data:`ep_trace.stage_names.STAGE_NAME_RE`), a user ``--stages`` file (tier 1,
   added to the built-ins), framework ranges (Megatron-Core, TransformerEngine, vLLM, SGLang,
   TensorRT-LLM; tier 2), plain PyTorch collectives (tier 3). The choice is made *per rank and time
   window*: a range is dropped only where it overlaps a range of a better tier on the same rank, so
   a trace where ep-trace wraps only some layers still gets the framework's ranges for the others;
2. kernel families (:mod:`ep_trace.analysis.stage_families`) for the device kernels no range claimed,
   on every rank, with the framework's MoE layer ranges ("containers") as context;
3. the name-independent tiers (:mod:`ep_trace.analysis.stage_tiers`): module frames, CPU ops, name
   tokens inside an MoE window.

The method is reported per row (``ep_trace``, ``preset:<name>``, ``kernel_family``, ``module:<class>``,
``cpu_op``, ``name_token``) and its tier in ``tier`` (:data:`ep_trace.analysis.stage_tiers.TIERS`).

Attribution: a device interval belongs to the innermost stage range of its rank — on the thread of
its anchor when both are known — whose host span contains the interval's *launch* time (Kineto and
nsys alike). CPU compute pieces (CPU-only traces)
lie on the same thread as the ranges, so they are clipped to each range they overlap instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import tomllib

from ep_trace.analysis.intervals import range_join, union, union_length
from ep_trace.analysis.name_filter import matching_names
from ep_trace.analysis.steps import assign_step
from ep_trace.errors import ConfigError
from ep_trace.knowledge import Row, range_presets, user_kernel_rows
from ep_trace.stage_names import STAGE_NAME_RE

__all__ = [
    "load_presets",
    "load_user_kernels",
    "detect_ranges",
    "detect_containers",
    "attribute",
    "attach",
    "measure",
    "USER_TIER",
]

#: Tier of a user ``--stages`` preset that names none.
USER_TIER = 1

_RANGE_SCHEMA: dict[str, Any] = {
    "rank": pl.Int32,
    "tid": pl.Int64,
    "stage": pl.Utf8,
    "layer": pl.Int32,
    "microbatch": pl.Int32,
    "phase": pl.Utf8,
    "cpu_start_ns": pl.Int64,
    "cpu_end_ns": pl.Int64,
    "method": pl.Utf8,
    "tier": pl.Int32,
}


def _user_doc(user: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(user).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(
            f"--stages: cannot read presets from {user}: {exc}; use [[preset]] tables with name and pattern"
        ) from exc


def load_presets(user: Path | None = None) -> list[dict]:
    """Built-in range presets (the knowledge table's ``[[range]]`` rows) plus the ``[[preset]]`` tables
    of an optional user TOML file (added, never replacing).

    Raises:
        ConfigError: the user file is unreadable or an entry lacks ``name`` / ``pattern``.
    """
    presets = range_presets()
    if user is not None:
        doc = _user_doc(user)
        extra = doc.get("preset", [])
        if not extra and not doc.get("kernel"):
            raise ConfigError(
                f"--stages: cannot read presets from {user}: no [[preset]] or [[kernel]] table; "
                "use [[preset]] tables with name and pattern"
            )
        for i, p in enumerate(extra):
            if "name" not in p or "pattern" not in p:
                raise ConfigError(f"--stages: {user}: preset[{i}] needs 'name' and 'pattern'")
            try:  # polars' (Rust) regex dialect: no look-around, no back-references
                pl.Series([""], dtype=pl.Utf8).str.contains(p["pattern"])
            except pl.exceptions.ComputeError as exc:
                raise ConfigError(
                    f"--stages: {user}: preset[{i}] pattern {p['pattern']!r} is not a valid regex; "
                    "use the Rust regex syntax (no look-around)"
                ) from exc
        # a user file adds to the built-ins; its ranges win where they overlap a framework range
        presets = presets + [{"tier": USER_TIER, **p} for p in extra]
    return presets


def load_user_kernels(user: Path | None = None) -> tuple[Row, ...]:
    """The ``[[kernel]]`` rows of a user ``--stages`` file (kernel-name stage families, tried before
    the built-in ones; the snippet of the coverage section has this layout), or ``()``.

    Raises:
        ConfigError: the file is unreadable or a row is malformed.
    """
    if user is None:
        return ()
    return user_kernel_rows(_user_doc(user), Path(user))


def _phase(expr: pl.Expr) -> pl.Expr:
    return pl.when(expr.is_in(["B", "W", "bwd"])).then(pl.lit("bwd")).otherwise(pl.lit("fwd"))


def _dedupe_nested(df: pl.DataFrame) -> pl.DataFrame:
    """Drop a range contained in an earlier range of the same (rank, stage) — e.g. ``nccl:all_to_all``
    inside ``c10d::alltoall_base_``."""
    return (
        df.sort(["rank", "stage", "cpu_start_ns", "cpu_end_ns"], descending=[False, False, False, True])
        .with_columns(pl.col("cpu_end_ns").cum_max().shift(1).over(["rank", "stage"]).alias("_pm"))
        .filter(pl.col("_pm").is_null() | (pl.col("cpu_end_ns") > pl.col("_pm")))
        .drop("_pm")
    )


def _preset_ranges(host: pl.DataFrame, presets: list[dict]) -> list[pl.DataFrame]:
    parts = []
    names = host.get_column("name").unique()  # each pattern is matched against the distinct names
    for p in presets:
        hits = matching_names(names, p["pattern"])
        if hits.is_empty():
            continue
        m = host.filter(pl.col("name").is_in(hits.implode()))
        g = pl.col("name").str.extract_groups(p["pattern"])
        fields = m.select(g.alias("_g"))["_g"].struct.fields

        def grp(f: str, fields: list[str] = fields) -> pl.Expr:
            return pl.col("_g").struct.field(f) if f in fields else pl.lit(None, pl.Utf8)

        stage = pl.lit(p["stage"]) if "stage" in p else grp("stage")
        phase = pl.lit(p["phase"]) if "phase" in p else _phase(grp("phase"))
        parts.append(
            m.with_columns(g.alias("_g")).select(
                "rank",
                "tid",
                stage.alias("stage"),
                grp("layer").cast(pl.Int32).alias("layer"),
                grp("microbatch").cast(pl.Int32).alias("microbatch"),
                phase.alias("phase"),
                pl.col("start_ns").alias("cpu_start_ns"),
                pl.col("end_ns").alias("cpu_end_ns"),
                pl.lit(f"preset:{p['name']}").alias("method"),
                pl.lit(int(p.get("tier", USER_TIER)), pl.Int32).alias("tier"),
            )
        )
    return parts


def _host(events: pl.DataFrame) -> pl.DataFrame:
    # lazy: only the five columns are gathered, not every column of the events table
    return (
        events.lazy()
        # Python frames too: a preset may name a framework's method frame (Megatron-Core's MoELayer)
        .filter(pl.col("kind").is_in(["cpu_annotation", "cpu_op", "python_frame"]))
        .select("rank", "tid", "name", "start_ns", "end_ns")
        .collect()
    )


def detect_ranges(events: pl.DataFrame, presets: list[dict]) -> pl.DataFrame:
    """Stage ranges of every rank, tiers layered per rank and time window.

    A range of tier ``t`` is kept unless it overlaps (host time, same rank) a range of a tier better
    than ``t``; container presets (``kind = "container"``) are left to :func:`detect_containers`.

    Returns:
        Columns ``rank, tid, stage, layer, microbatch, phase, cpu_start_ns, cpu_end_ns, method, tier``.
    """
    host = _host(events)
    ep = (
        host.filter(pl.col("name").str.starts_with("ep:"))
        .with_columns(pl.col("name").str.extract_groups(STAGE_NAME_RE.pattern).alias("_g"))
        .filter(pl.col("_g").struct.field("stage").is_not_null())
    )
    parts = [
        ep.select(
            "rank",
            "tid",
            pl.col("_g").struct.field("stage").alias("stage"),
            pl.col("_g").struct.field("layer").cast(pl.Int32).alias("layer"),
            pl.col("_g").struct.field("microbatch").cast(pl.Int32).alias("microbatch"),
            pl.col("_g").struct.field("phase").alias("phase"),
            pl.col("start_ns").alias("cpu_start_ns"),
            pl.col("end_ns").alias("cpu_end_ns"),
            pl.lit("ep_trace").alias("method"),
            pl.lit(0, pl.Int32).alias("tier"),
        )
    ]
    parts += _preset_ranges(host, [p for p in presets if p.get("kind", "stage") == "stage"])
    out = pl.concat([x.cast(pl.Schema(_RANGE_SCHEMA)) for x in parts], how="vertical").with_row_index("_r")
    # per window: drop a range that overlaps a range of a better tier on its rank
    pairs = range_join(
        out.select("rank", "_r", "tier", "cpu_start_ns", "cpu_end_ns"),
        out.select(
            "rank",
            pl.col("_r").alias("_r2"),
            pl.col("tier").alias("_t2"),
            pl.col("cpu_start_ns").alias("_s2"),
            pl.col("cpu_end_ns").alias("_e2"),
        ),
        ("cpu_start_ns", "cpu_end_ns"),
        ("_s2", "_e2"),
    )
    beaten = pairs.filter(
        (pl.col("_t2") < pl.col("tier"))
        & (pl.col("_s2") < pl.col("cpu_end_ns"))
        & (pl.col("_e2") > pl.col("cpu_start_ns"))
    )["_r"].unique()
    out = out.filter(~pl.col("_r").is_in(beaten.implode())).drop("_r")
    return _dedupe_nested(out)


def detect_containers(events: pl.DataFrame, presets: list[dict]) -> pl.DataFrame:
    """MoE layer ranges (container presets) of every rank, outermost only.

    Returns:
        Columns ``rank, tid, cpu_start_ns, cpu_end_ns, layer`` (``layer`` from the range name's
        ``(?P<layer>...)`` group, else null; the detector numbers containers within a step).
    """
    parts = _preset_ranges(_host(events), [p for p in presets if p.get("kind") == "container"])
    if not parts:
        return pl.DataFrame(
            schema={
                "rank": pl.Int32,
                "tid": pl.Int64,
                "cpu_start_ns": pl.Int64,
                "cpu_end_ns": pl.Int64,
                "layer": pl.Int32,
            }
        )
    c = pl.concat([x.cast(pl.Schema(_RANGE_SCHEMA)) for x in parts], how="vertical")
    c = (
        c.sort(["rank", "cpu_start_ns", "cpu_end_ns"], descending=[False, False, True])
        .with_columns(pl.col("cpu_end_ns").cum_max().shift(1).over("rank").alias("_pm"))
        .filter(pl.col("_pm").is_null() | (pl.col("cpu_start_ns") >= pl.col("_pm")))
    )
    return c.select("rank", "tid", "cpu_start_ns", "cpu_end_ns", "layer")


def attribute(
    ranges: pl.DataFrame, act: pl.DataFrame, mode: dict[int, str], windows: pl.DataFrame, exposed: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Attribute device work to stage ranges and measure each stage.

    Args:
        ranges: Output of :func:`detect_ranges`.
        act: Device activity (:func:`ep_trace.analysis.activity.device_activity`), with ``step``.
        mode: rank -> ``'gpu'`` / ``'cpu'``.
        windows: Step windows.
        exposed: Exposed-comm intervals ``rank, start_ns, end_ns`` (C \\ K of the rank).

    Returns:
        ``(stages, attributed)``: the canonical stages table plus ``comm_ns, overlapped_ns,
        exposed_comm_ns``; and the attributed activity rows (``sid`` = stage row id).
    """
    ranges = assign_step(ranges, windows, "cpu_start_ns").with_row_index("sid")
    att = attach(ranges, act, mode)
    return measure(ranges, att, exposed), att


def attach(ranges: pl.DataFrame, act: pl.DataFrame, mode: dict[int, str]) -> pl.DataFrame:
    """The activity rows each range of ``ranges`` (with ``sid``) holds: a device interval by its launch
    (innermost range), a CPU compute piece clipped to every range it overlaps (the module doc)."""
    cpu_ranks = [r for r, m in mode.items() if m == "cpu"]
    if "aid" not in act.columns:
        act = act.with_row_index("aid")
    is_cpu_compute = pl.col("rank").is_in(cpu_ranks) & (pl.col("cls") == "compute")
    rsel = ranges.select("sid", "rank", "tid", "cpu_start_ns", "cpu_end_ns")
    # same thread when both sides know it; ranks whose ranges carry no thread fall back to rank-only
    threaded_ranks = rsel.filter(pl.col("tid").is_not_null())["rank"].unique().implode()
    same_thread = pl.col("anchor_tid").is_not_null() & pl.col("rank").is_in(threaded_ranks)
    pt = act.filter(~is_cpu_compute)
    pts = pl.concat(
        [
            range_join(
                pt.filter(same_thread).rename({"anchor_tid": "tid"}),
                rsel,
                ("anchor_ns", "anchor_ns"),
                ("cpu_start_ns", "cpu_end_ns"),
                by=("rank", "tid"),
            ).drop("tid"),
            range_join(
                pt.filter(~same_thread).drop("anchor_tid"),
                rsel.drop("tid"),
                ("anchor_ns", "anchor_ns"),
                ("cpu_start_ns", "cpu_end_ns"),
            ),
        ],
        how="diagonal_relaxed",
    )
    # innermost range (latest start) wins for nested ranges
    pts = pts.sort(["cpu_start_ns", "cpu_end_ns", "sid"], descending=[True, False, False]).unique("aid", keep="first")
    cc = act.filter(is_cpu_compute)
    clipped = (
        pl.concat(
            [
                range_join(
                    cc.filter(same_thread).rename({"anchor_tid": "tid"}),
                    rsel,
                    ("start_ns", "end_ns"),
                    ("cpu_start_ns", "cpu_end_ns"),
                    by=("rank", "tid"),
                ).drop("tid"),
                range_join(
                    cc.filter(~same_thread).drop("anchor_tid"),
                    rsel.drop("tid"),
                    ("start_ns", "end_ns"),
                    ("cpu_start_ns", "cpu_end_ns"),
                ),
            ],
            how="diagonal_relaxed",
        )
        .with_columns(
            pl.max_horizontal("start_ns", "cpu_start_ns").alias("start_ns"),
            pl.min_horizontal("end_ns", "cpu_end_ns").alias("end_ns"),
        )
        .filter(pl.col("end_ns") > pl.col("start_ns"))
    )
    return pl.concat([pts, clipped], how="vertical_relaxed").drop(["cpu_start_ns", "cpu_end_ns"])


def measure(ranges: pl.DataFrame, att: pl.DataFrame, exposed: pl.DataFrame) -> pl.DataFrame:
    """Window, busy, comm, overlapped and exposed comm of every stage row ``sid`` from its attributed rows."""
    busy = union_length(att, ["sid"], "busy_ns")
    win = att.group_by("sid").agg(pl.col("start_ns").min(), pl.col("end_ns").max())
    cu = union(att.filter(pl.col("cls") == "comm").select("sid", "rank", "start_ns", "end_ns"), ["sid", "rank"])
    comm = cu.group_by("sid").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("comm_ns"))
    xj = range_join(cu, exposed.rename({"start_ns": "x_s", "end_ns": "x_e"}), ("start_ns", "end_ns"), ("x_s", "x_e"))
    xlen = (
        xj.select(
            "sid", (pl.min_horizontal("end_ns", "x_e") - pl.max_horizontal("start_ns", "x_s")).clip(0).alias("_x")
        )
        .group_by("sid")
        .agg(pl.col("_x").sum().alias("exposed_comm_ns"))
    )
    st = (
        ranges.join(win, on="sid", how="left")
        .join(busy, on="sid", how="left")
        .join(comm, on="sid", how="left")
        .join(xlen, on="sid", how="left")
        .with_columns(
            (pl.col("end_ns") - pl.col("start_ns")).fill_null(0).alias("window_ns"),
            pl.col("busy_ns").fill_null(0),
            pl.col("comm_ns").fill_null(0),
            pl.col("exposed_comm_ns").fill_null(0),
        )
        .with_columns((pl.col("comm_ns") - pl.col("exposed_comm_ns")).alias("overlapped_ns"))
    )
    cols = [
        "rank",
        "step",
        "layer",
        "microbatch",
        "phase",
        "stage",
        "cpu_start_ns",
        "cpu_end_ns",
        "start_ns",
        "end_ns",
        "window_ns",
        "busy_ns",
        "method",
        "comm_ns",
        "overlapped_ns",
        "exposed_comm_ns",
        "sid",
    ]
    return st.select(cols).sort(["rank", "cpu_start_ns"])
