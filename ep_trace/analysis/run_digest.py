"""One run reduced to what ``ep-trace compare`` and its regression gate need: a :class:`RunDigest`.

A digest comes from an :class:`Analysis` (a trace directory) or from a saved JSON summary
(docs/summary.md), so that a trace directory can be compared with a summary saved by CI. From a summary
with the ``step_spread`` section (schema 3) the digest is the one its trace directory gives (the same
functions of :mod:`ep_trace.analysis.step_spread` fill both); an older summary holds no per-step spread
of its stages, ranks or imbalance, and those figures' noise is unknown (``None``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

from ep_trace.analysis.imbalance import run_aggregate
from ep_trace.analysis.step_spread import STAGES_SCHEMA, imbalance_spread, rank_spread, slowest_step, stage_spread

if TYPE_CHECKING:
    from ep_trace.analysis.result import Analysis

__all__ = ["RunDigest", "RANK_COLS", "digest_analysis", "digest_summary"]

#: Per-rank columns of :attr:`RunDigest.ranks` (ns per step; ``_sd_ns`` = sd over steps; n_steps a count).
RANK_COLS = (
    "step_time_ns",
    "step_time_mean_ns",
    "comm_ns",
    "exposed_comm_ns",
    "barrier_wait_ns",
    "transfer_ns",
    "n_steps",
    "exposed_comm_sd_ns",
    "barrier_wait_sd_ns",
)
_FINDINGS_SCHEMA = {"kind": pl.Utf8, "severity": pl.Utf8, "title": pl.Utf8, "est_saving_ns": pl.Int64}
_IMBALANCE_SCHEMA = {"metric": pl.Utf8, "value": pl.Float64, "sd": pl.Float64, "n": pl.Int64}


@dataclass(frozen=True)
class RunDigest:
    """What compare needs from one run.

    Attributes:
        label: Name shown (directory or file).
        ranks: rank + :data:`RANK_COLS` (ns per step; step_time_ns is the P50 over steps, step_time_mean_ns
            the mean; ``*_sd_ns`` the standard deviation over steps, null when unknown).
        stages: :data:`~ep_trace.analysis.step_spread.STAGES_SCHEMA` (ns per step, mean over ranks;
            ``window_sd_ns`` null when unknown).
        findings: kind, severity, title, est_saving_ns.
        step_spread_ns: Step-to-step spread (std over steps of the slowest rank's step), the run's noise.
        n_steps: Steps analysed.
        pipelined: The run's dispatch -> expert -> combine ran in chunks (micro-batches > 0), so its stage
            windows overlap each other.
        imbalance: metric (``I_e``, ``I_r``), value (whole-run), sd (over steps), n (steps); no row when
            the run has no routing data.
    """

    label: str
    ranks: pl.DataFrame
    stages: pl.DataFrame
    findings: pl.DataFrame
    #: Standard deviation over steps of the per-step step time (slowest rank), ns; None when unknown.
    step_spread_ns: float | None = None
    #: Steps behind the step statistics.
    n_steps: int = 0
    #: Stages ran in chunks (their windows overlap).
    pipelined: bool = False
    #: Whole-run I_e / I_r with their spread over steps.
    imbalance: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=_IMBALANCE_SCHEMA))

    @property
    def step_stat(self) -> str:
        """``'mean'`` when every rank has a mean step time, else ``'P50'``."""
        col = self.ranks["step_time_mean_ns"]
        return "mean" if self.ranks.height and col.null_count() == 0 else "P50"

    def step_time_ns(self, stat: str | None = None) -> float | None:
        """The slowest rank's step time, ns: ``stat`` ``'mean'`` or ``'P50'`` (default: :attr:`step_stat`)."""
        if self.ranks.height == 0:
            return None
        v = self.ranks["step_time_mean_ns" if (stat or self.step_stat) == "mean" else "step_time_ns"].max()
        return None if v is None else float(v)  # type: ignore[arg-type]


def _rank_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    data: dict[str, list[Any]] = {"rank": [int(r["rank"]) for r in rows]}
    for c in RANK_COLS:
        data[c] = [None if r.get(c) is None else float(r[c]) for r in rows]
    return pl.DataFrame(data, schema={"rank": pl.Int64, **{c: pl.Float64 for c in RANK_COLS}}).sort("rank")


def _imbalance_frame(values: Mapping[str, Any], spread: Mapping[str, Any]) -> pl.DataFrame:
    """Rows of ``I_e`` / ``I_r`` that have a value: ``spread[name]`` is ``(sd, n)``."""
    rows = [
        {"metric": k, "value": float(values[k]), "sd": spread.get(k, (None, 0))[0], "n": spread.get(k, (None, 0))[1]}
        for k in ("I_e", "I_r")
        if values.get(k) is not None
    ]
    return pl.DataFrame(rows, schema=_IMBALANCE_SCHEMA)


def digest_analysis(analysis: Analysis, label: str) -> RunDigest:
    """Reduce an :class:`Analysis` to a :class:`RunDigest`."""
    rs = analysis.rank_summary
    cols = [c for c in RANK_COLS if c in rs.columns and c != "n_steps"]
    rows = rs.select("rank", *cols).with_columns(pl.col("rank").cast(pl.Int64))
    spread = rank_spread(analysis.steps).drop([c for c in cols if c != "rank"], strict=False)
    rows = rows.join(spread, on="rank", how="left")
    st = analysis.stages
    pipelined = bool(st.height and "microbatch" in st.columns and (st["microbatch"].fill_null(0) > 0).any())
    findings = pl.DataFrame(
        [
            {"kind": f.kind, "severity": f.severity, "title": f.title, "est_saving_ns": int(f.est_saving_ns)}
            for f in analysis.findings
        ],
        schema=_FINDINGS_SCHEMA,
    )
    _, sd, n = slowest_step(analysis.steps)
    ib = analysis.imbalance
    whole = run_aggregate(ib) if {"n_e_max", "n_e_mean", "L_max", "L_mean"} <= set(ib.columns) else {}
    imb = _imbalance_frame(whole, imbalance_spread(ib))
    return RunDigest(label, _rank_frame(rows.to_dicts()), stage_spread(st), findings, sd, n, pipelined, imb)


def _records(obj: Any, key_name: str) -> list[dict[str, Any]]:
    """A list of records, or a mapping {key: record} turned into records carrying ``key_name``."""
    if obj is None:
        return []
    if isinstance(obj, Mapping):
        return [{key_name: k, **(v if isinstance(v, Mapping) else {"value": v})} for k, v in obj.items()]
    return [dict(r) for r in obj]


def _mapping(obj: Any) -> Mapping[str, Any]:
    return obj if isinstance(obj, Mapping) else {}


def _summary_stages(summary: Mapping[str, Any], spread: Mapping[str, Any]) -> pl.DataFrame:
    """The stages of a summary: ``step_spread.stages`` (schema 3), else the per-rank means, noise unknown."""
    if spread.get("stages") is not None:
        return pl.DataFrame(_records(spread["stages"], "stage"), schema=STAGES_SCHEMA).sort("stage")
    srows = _records(summary.get("stages"), "stage")
    if not srows:
        return pl.DataFrame(schema=STAGES_SCHEMA)
    df = pl.DataFrame(
        [
            {
                "rank": r.get("rank"),
                "stage": str(r["stage"]),
                "busy_ns": float(r.get("busy_ns") or 0),
                "window_ns": float(r.get("window_ns") or 0),
            }
            for r in srows
        ]
    )
    return (
        df.group_by("rank", "stage")
        .agg(pl.col("busy_ns").sum(), pl.col("window_ns").sum())
        .group_by("stage")
        .agg(pl.col("busy_ns").mean(), pl.col("window_ns").mean())
        # per-rank means without steps: no stage noise (the tolerance rule applies)
        .with_columns(pl.lit(None, pl.Float64).alias("window_sd_ns"), pl.lit(0, pl.Int64).alias("n_steps"))
        .cast(STAGES_SCHEMA)  # type: ignore[arg-type]
        .sort("stage")
    )


def digest_summary(summary: Mapping[str, Any], label: str) -> RunDigest:
    """Reduce a saved JSON summary (``Analysis.summary()``, docs/summary.md) to a :class:`RunDigest`.

    Raises:
        BadInputError: naming ``label`` when the JSON is not an ep-trace summary.
    """
    from ep_trace.errors import BadInputError

    if not isinstance(summary, Mapping) or "schema_version" not in summary or "ranks" not in summary:
        raise BadInputError(
            f"{label}: not an ep-trace summary (no 'schema_version' / 'ranks'); pass a file written by 'ep-trace analyze --json'"
        )
    spread = _mapping(summary.get("step_spread"))
    per_rank = {int(r["rank"]): r for r in _records(spread.get("ranks"), "rank")}
    ranks = _rank_frame([{**per_rank.get(int(r["rank"]), {}), **r} for r in _records(summary.get("ranks"), "rank")])
    frows = [
        {
            "kind": str(f.get("kind")),
            "severity": str(f.get("severity")),
            "title": str(f.get("title", f.get("kind"))),
            "est_saving_ns": int(f.get("est_saving_ns") or 0),
        }
        for f in _records(summary.get("findings"), "kind")
    ]
    ov = summary.get("overall") or {}
    sd = ov.get("step_time_spread_ns") if isinstance(ov, Mapping) else None
    imb = _mapping(summary.get("imbalance"))
    imb_spread = {
        k: (v.get("sd"), int(v.get("n") or 0))
        for k, v in _mapping(spread.get("imbalance")).items()
        if isinstance(v, Mapping)
    }
    return RunDigest(
        label,
        ranks,
        _summary_stages(summary, spread),
        pl.DataFrame(frows, schema=_FINDINGS_SCHEMA),
        None if sd is None else float(sd),
        len(summary.get("steps") or []),
        imbalance=_imbalance_frame(imb, imb_spread),
    )
