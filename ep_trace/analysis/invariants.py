"""The last pass of :func:`~ep_trace.analysis.engine.analyze`: physical invariants, checked on every
analysis; a finding or a figure that breaks one is withheld, never published.

The invariants (:data:`INVARIANTS`; docs/metrics.md "Invariants"), each per (rank, step) unless said:

* ``parts_in_step`` / ``parts_sum_to_step``: every part of the step breakdown (compute, overlapped
  and exposed comm, barrier wait, copy, host stall, idle) lies in [0, step] and the parts add up to
  the step (their shares lie in [0, 1] and sum to 1);
* ``compute_le_step``: compute |K| (the device work the step launched) <= step;
* ``comm_le_step``: overlapped and exposed comm <= communication |C| <= step;
* ``wait_in_step``: 0 <= barrier wait <= step;
* ``stage_le_step``: a stage's busy time <= step (the verdict's "stage takes x % of the step");
* ``whatif_ge_kept_work``: no what-if predicts a step shorter than the device work its edit keeps:
  the mean over ranks of |K| less the busy time of the stages the edit shortens (``balanced_routing``:
  expert; ``fused_permute``: permute / unpermute; ``all``: both), the ranks it edits as a whole left
  out (``no_straggler``'s late rank), taken at the step where it is smallest (:data:`EDITS`);
* ``removal_le_baseline``: an edit that only takes time away (:data:`REMOVALS`: a late rank's lead,
  exposed transfer time, half the dispatch bytes, host stalls, launch gaps, half the permute ops)
  never predicts a longer step than the replayed baseline: the replay is a longest-path computation
  over the step graph, monotone in every duration, so a longer prediction means the trace's graph is
  not one the replay can trust (a fuzzed trace whose ops outlast their parents predicted 885 ms for
  ``full_overlap`` against a 133 ms baseline);
* ``step_nonnegative``: no replayed or predicted step is negative (the ``all`` row, every edit at
  once, falls with any what-if withheld for either);
* ``saving_in_step``: a finding's saving lies in [0, step] (the longest step of any rank).

Withholding: a breakdown row, a what-if row, a replay row or the stage rows of a (rank, step) that
break an invariant are dropped from their frame; a step figure that breaks one in some step of a
rank is set to null in the rank's rows of ``steps`` and ``rank_summary`` (they print as "–"); a finding is withheld when its
what-if is, when one of its ranks has a withheld step figure or breakdown, or when its own saving
breaks ``saving_in_step``. Each withheld finding (and each withheld group of figures) becomes one
:class:`~ep_trace.analysis.result.Withheld` line saying which invariant broke and why
(``Analysis.withheld``; the terminal, the report and the summary's ``withheld`` print it).

:func:`summary_violations` checks the same invariants on a published summary (what a reader of the
JSON can check: means per rank, what-if rows with their ``kept_work_ns``, findings): the property
tests and the fuzz suite hold every summary to it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, cast

import polars as pl

from ep_trace.analysis.breakdown import BREAKDOWN_PARTS
from ep_trace.analysis.finding_common import fmt_ns
from ep_trace.analysis.result import Analysis, Finding, Withheld

__all__ = ["INVARIANTS", "EDITS", "REMOVALS", "TOLERANCE_NS", "violations", "enforce", "summary_violations"]

#: Name -> what it states (the withheld lines and docs/metrics.md quote it).
INVARIANTS: dict[str, str] = {
    "parts_in_step": "every part of the step breakdown lies in [0, step]",
    "parts_sum_to_step": "the parts of the step breakdown add up to the step",
    "compute_le_step": "compute <= step",
    "comm_le_step": "overlapped, exposed comm <= communication <= step",
    "wait_in_step": "0 <= barrier wait <= step",
    "stage_le_step": "a stage's busy time <= step",
    "whatif_ge_kept_work": "a what-if's step >= the device work its edit keeps",
    "removal_le_baseline": "an edit that only removes time does not lengthen the step",
    "step_nonnegative": "replayed and predicted steps >= 0",
    "saving_in_step": "0 <= a finding's saving <= step",
}

#: What each what-if edit shortens: ``(stages whose device work it may shorten, whether it edits
#: its rows' ranks as a whole)``; every other piece of compute is kept at its measured length
#: (:mod:`ep_trace.analysis.whatif`: overlap, FP8, host stalls, launch gaps and chunking move or
#: shorten transfers and gaps only; chunking's pieces cost at least the whole). ``all`` is checked
#: with its stages and ``no_straggler``'s ranks.
EDITS: dict[str, tuple[tuple[str, ...], bool]] = {
    "no_straggler": ((), True),
    "balanced_routing": (("expert",), False),
    "full_overlap": ((), False),
    "fp8_dispatch": ((), False),
    "no_host_stalls": ((), False),
    "no_launch_gaps": ((), False),
    "fused_permute": (("permute", "unpermute"), False),
    "chunked_pipeline": ((), False),
    "all": (("expert", "permute", "unpermute"), False),
}

#: Slack of every comparison, ns: the resolution of microsecond Kineto timestamps (older torch), and
#: Kineto's display widening of annotation spans (1-2 ns, kineto.md section 7).
TOLERANCE_NS = 1_000

#: The what-ifs (ep_trace.analysis.whatif) whose edit only shortens durations or gaps of the step graph:
#: their saving is never negative (``removal_le_baseline``). The others move work (``balanced_routing``,
#: ``placement``, ``node_local``), add calls (``chunked_pipeline``) or combine them (``all``).
REMOVALS = frozenset(
    {"no_straggler", "full_overlap", "fp8_dispatch", "no_host_stalls", "no_launch_gaps", "fused_permute"}
)

#: Columns of ``steps`` / ``rank_summary`` withheld with each step invariant.
_STEP_COLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "compute_le_step": (("compute_ns",), ("compute_ns",)),
    "comm_le_step": (
        ("comm_ns", "overlapped_ns", "exposed_comm_ns"),
        ("comm_ns", "exposed_comm_ns", "exposed_comm_p50_ns", "exposed_comm_p95_ns", "overlap_efficiency"),
    ),
    "wait_in_step": (("barrier_wait_ns", "transfer_ns"), ("barrier_wait_ns", "barrier_wait_p95_ns", "transfer_ns")),
}
_V = {"invariant": pl.Utf8, "what": pl.Utf8, "name": pl.Utf8, "rank": pl.Int32, "step": pl.Int64, "reason": pl.Utf8}


def _say(template: str, at: bool = True) -> pl.Expr:
    """The reason of a violation row: ``template`` with each ``{column}`` (ns) in words (3 significant
    digits, :func:`fmt_ns`), after ``'rank r, step s: '`` when ``at``."""
    pieces: list[pl.Expr] = [pl.format("rank {}, step {}: ", "rank", "step")] if at else []
    for i, part in enumerate(re.split(r"\{(\w+)\}", template)):
        if i % 2:
            pieces.append(pl.col(part).map_elements(fmt_ns, return_dtype=pl.Utf8))
        elif part:
            pieces.append(pl.lit(part))
    return pl.concat_str(pieces)


def _rows(df: pl.DataFrame, invariant: str, what: str, name: pl.Expr | str, reason: pl.Expr) -> pl.DataFrame:
    """Violation rows (:data:`_V`) of the rows of ``df`` (which break ``invariant``)."""
    return df.select(
        pl.lit(invariant).alias("invariant"),
        pl.lit(what).alias("what"),
        (pl.lit(name) if isinstance(name, str) else name).cast(pl.Utf8).alias("name"),
        pl.col("rank").cast(pl.Int32) if "rank" in df.columns else pl.lit(None, pl.Int32).alias("rank"),
        pl.col("step").cast(pl.Int64) if "step" in df.columns else pl.lit(None, pl.Int64).alias("step"),
        reason.alias("reason"),
    )


def _step_checks(s: pl.DataFrame) -> list[pl.DataFrame]:
    """compute / comm / wait of every (rank, step) against its step."""
    if s.is_empty():
        return []
    t, tol, wait = pl.col("step_time_ns"), TOLERANCE_NS, pl.col("barrier_wait_ns")
    over = lambda c: pl.col(c).is_not_null() & (pl.col(c) > t + tol)  # noqa: E731
    comm_bad = (
        over("comm_ns")
        | (pl.col("exposed_comm_ns") > pl.col("comm_ns") + tol)
        | (pl.col("overlapped_ns") > pl.min_horizontal("comm_ns", "compute_ns") + tol)
    )
    comm_why = "communication {comm_ns} (exposed {exposed_comm_ns}, overlapped {overlapped_ns}), step {step_time_ns}"
    return [
        _rows(
            s.filter(over("compute_ns")),
            "compute_le_step",
            "rank_figures",
            "compute",
            _say("compute {compute_ns} > step {step_time_ns}"),
        ),
        _rows(s.filter(comm_bad), "comm_le_step", "rank_figures", "communication", _say(comm_why)),
        _rows(
            s.filter(wait.is_not_null() & ((wait < 0) | (wait > t + tol))),
            "wait_in_step",
            "rank_figures",
            "barrier wait",
            _say("barrier wait {barrier_wait_ns} vs step {step_time_ns}"),
        ),
    ]


def _breakdown_checks(bd: pl.DataFrame | None) -> list[pl.DataFrame]:
    """Each part of every (rank, step) breakdown in [0, step]; the parts add up to the step."""
    if bd is None or bd.is_empty():
        return []
    t, tol = pl.col("step_time_ns"), TOLERANCE_NS
    out_of = [(pl.col(p) < 0) | (pl.col(p) > t + tol) for p in BREAKDOWN_PARTS]
    name = pl.coalesce([pl.when(o).then(pl.lit(p[:-3])) for o, p in zip(out_of, BREAKDOWN_PARTS, strict=True)])
    value = pl.coalesce([pl.when(o).then(pl.col(p)) for o, p in zip(out_of, BREAKDOWN_PARTS, strict=True)])
    b = bd.with_columns(name.alias("_part"), value.alias("_v"), pl.sum_horizontal(BREAKDOWN_PARTS).alias("_sum"))
    part_why = pl.concat_str(pl.format("rank {}, step {}: {} ", "rank", "step", "_part"), _say("{_v}", at=False))
    return [
        _rows(
            b.filter(pl.any_horizontal(out_of)),
            "parts_in_step",
            "breakdown",
            "breakdown",
            pl.concat_str(part_why, _say(" outside [0, step {step_time_ns}]", at=False)),
        ),
        _rows(
            b.filter((pl.col("_sum") - t).abs() > tol),
            "parts_sum_to_step",
            "breakdown",
            "breakdown",
            _say("parts sum to {_sum}, step {step_time_ns}"),
        ),
    ]


def _stage_checks(stages: pl.DataFrame, steps: pl.DataFrame) -> list[pl.DataFrame]:
    """The busy time of each stage of a (rank, step), all its layers and micro-batches, <= the step."""
    if stages.is_empty() or steps.is_empty():
        return []
    busy = (
        stages.filter(pl.col("step").is_not_null())
        .group_by(["rank", "step", "stage"])
        .agg(pl.col("busy_ns").sum())
        .join(steps.select("rank", "step", "step_time_ns"), on=["rank", "step"])
    )
    why = pl.concat_str(pl.format("rank {}, step {}: {} ", "rank", "step", "stage"), _say("busy {busy_ns}", at=False))
    return [
        _rows(
            busy.filter(pl.col("busy_ns") > pl.col("step_time_ns") + TOLERANCE_NS),
            "stage_le_step",
            "stage",
            pl.col("stage"),
            pl.concat_str(why, _say(" > step {step_time_ns}", at=False)),
        )
    ]


def kept_work(a: Analysis) -> pl.DataFrame:
    """``scenario, kept_work_ns`` of every what-if row: the device work its edit keeps (:data:`EDITS`),
    the min over steps of the mean over ranks of |K| less the busy time of the stages it shortens,
    0 for the ranks it edits as a whole; null for a scenario :data:`EDITS` does not know."""
    wf = a.whatif
    schema = {"scenario": pl.Utf8, "kept_work_ns": pl.Int64}
    if wf is None or wf.is_empty() or a.steps.is_empty():
        return pl.DataFrame(schema=schema)
    k = a.steps.select("rank", "step", pl.col("compute_ns").fill_null(0).cast(pl.Float64))
    busy = (
        a.stages.filter(pl.col("step").is_not_null())
        .group_by(["rank", "step", "stage"])
        .agg(pl.col("busy_ns").sum().cast(pl.Float64))
        if a.stages.height
        else pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int64, "stage": pl.Utf8, "busy_ns": pl.Float64})
    )
    ranks_of = {r["scenario"]: [int(x) for x in r["ranks"] or []] for r in wf.iter_rows(named=True)}
    out: list[tuple[str, int | None]] = []
    for sc in wf["scenario"].to_list():
        if sc not in EDITS:
            out.append((sc, None))
            continue
        stages, whole = EDITS[sc]
        gone = ranks_of[sc] if whole else ranks_of.get("no_straggler", []) if sc == "all" else []
        edited = (
            busy.filter(pl.col("stage").is_in(list(stages))).group_by(["rank", "step"]).agg(pl.col("busy_ns").sum())
        )
        per = (
            k.join(edited, on=["rank", "step"], how="left")
            .with_columns(
                pl.when(pl.col("rank").is_in(gone))
                .then(0.0)
                .otherwise((pl.col("compute_ns") - pl.col("busy_ns").fill_null(0.0)).clip(0.0))
                .alias("_kept")
            )
            .group_by("step")
            .agg(pl.col("_kept").mean())
        )
        out.append((sc, int(cast(float, per["_kept"].min()))))
    return pl.DataFrame(out, schema=schema, orient="row")


def _model_checks(a: Analysis, kept: pl.DataFrame) -> list[pl.DataFrame]:
    """What-if rows above the work their edit keeps; no negative replayed or predicted step."""
    out = []
    if a.whatif is not None and a.whatif.height:
        w = a.whatif.drop("kept_work_ns", strict=False).join(kept, on="scenario", how="left")
        p = pl.col("predicted_step_ns")
        below = (p >= 0) & (p < pl.col("kept_work_ns") - TOLERANCE_NS)
        kept_why = "predicted step {predicted_step_ns} < the {kept_work_ns} of device work the edit keeps"
        longer = pl.col("scenario").is_in(list(REMOVALS)) & (pl.col("saving_ns") < -TOLERANCE_NS)
        base = (p + pl.col("saving_ns")).alias("baseline_ns")
        longer_why = "predicted step {predicted_step_ns} > the replayed baseline {baseline_ns}, though the edit only removes time"
        rows = [
            _rows(
                w.filter(p < 0),
                "step_nonnegative",
                "whatif",
                pl.col("scenario"),
                _say("predicted step {predicted_step_ns}", at=False),
            ),
            _rows(w.filter(below), "whatif_ge_kept_work", "whatif", pl.col("scenario"), _say(kept_why, at=False)),
            _rows(
                w.filter(longer).with_columns(base),
                "removal_le_baseline",
                "whatif",
                pl.col("scenario"),
                _say(longer_why, at=False),
            ),
        ]
        out += rows + [_all_of(w, pl.concat(rows))]
    if a.replay is not None and a.replay.height:
        r = a.replay.filter((pl.col("replayed_ns") < 0) | (pl.col("measured_ns") < 0))
        out.append(
            _rows(r, "step_nonnegative", "replay", "replay", _say("replayed {replayed_ns}, measured {measured_ns}"))
        )
    return out


def _all_of(w: pl.DataFrame, bad: pl.DataFrame) -> pl.DataFrame:
    """The ``all`` row when it holds a withheld edit: every edit at once includes each one that saves on
    its own, so it stands or falls with them (the DeepEP training trace: ``no_launch_gaps`` below
    its kept work, ``all`` 606 µs shorter still)."""
    held = bad.filter(pl.col("name") != "all")
    if held.is_empty() or "all" in bad["name"].to_list() or "all" not in w["scenario"].to_list():
        return bad.clear()
    names = ", ".join(sorted(set(held["name"].to_list())))
    return _rows(
        w.filter(pl.col("scenario") == "all"),
        str(held["invariant"][0]),
        "whatif",
        "all",
        pl.lit(f"every edit at once includes the withheld {names}"),
    )


def violations(a: Analysis) -> pl.DataFrame:
    """Every broken invariant of ``a``'s frames: ``invariant, what, name, rank, step, reason`` (one row
    per (rank, step) or what-if row; findings are judged by :func:`enforce`)."""
    parts = [
        *_step_checks(a.steps),
        *_breakdown_checks(a.breakdown),
        *_stage_checks(a.stages, a.steps),
        *_model_checks(a, kept_work(a)),
    ]
    parts = [p for p in parts if p.height]
    return pl.concat(parts) if parts else pl.DataFrame(schema=_V)


def enforce(a: Analysis) -> Analysis:
    """``a`` with every figure and finding that breaks an invariant withheld (see the module doc), the
    what-if rows' ``kept_work_ns`` added, and ``withheld`` saying what and why."""
    v = violations(a)
    kept = kept_work(a)
    whatif = (
        a.whatif.drop("kept_work_ns", strict=False).join(kept, on="scenario", how="left")
        if a.whatif is not None
        else None
    )
    findings, lines = _judge_findings(a, v)
    if v.is_empty() and not lines:
        return dataclasses.replace(a, whatif=whatif)
    steps, rank_summary = _null_step_figures(a.steps, a.rank_summary, v)
    key = ["rank", "step"]
    drop = lambda what: v.filter(pl.col("what") == what)  # noqa: E731
    breakdown = (
        a.breakdown.join(drop("breakdown").select(key).unique(), on=key, how="anti")
        if a.breakdown is not None
        else None
    )
    stage_rows = drop("stage").select(*key, pl.col("name").alias("stage")).unique()
    stages = (
        a.stages.join(stage_rows, on=[*key, "stage"], how="anti", nulls_equal=True) if stage_rows.height else a.stages
    )
    if whatif is not None:
        whatif = whatif.filter(~pl.col("scenario").is_in(drop("whatif")["name"].implode()))
    replay = a.replay.join(drop("replay").select(key).unique(), on=key, how="anti") if a.replay is not None else None
    return dataclasses.replace(
        a,
        steps=steps,
        rank_summary=rank_summary,
        breakdown=breakdown,
        stages=stages,
        whatif=whatif,
        replay=replay,
        findings=findings,
        withheld=(*lines, *_figure_lines(v)),
    )


def _null_step_figures(
    steps: pl.DataFrame, rank_summary: pl.DataFrame, v: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The step figures that break a step invariant in some step of a rank set to null in all the
    rank's rows of ``steps`` and in its ``rank_summary`` row (a mean or a percentile over its steps
    would hold the broken one, or print beside a withheld mean)."""
    for inv, (step_cols, rank_cols) in _STEP_COLS.items():
        bad = v.filter(pl.col("invariant") == inv).select("rank", "step").unique()
        if bad.is_empty():
            continue
        hit = pl.col("rank").is_in(bad["rank"].implode())
        steps = steps.with_columns(pl.when(hit).then(None).otherwise(pl.col(c)).alias(c) for c in step_cols)
        rank_summary = rank_summary.with_columns(
            pl.when(hit).then(None).otherwise(pl.col(c)).alias(c) for c in rank_cols if c in rank_summary.columns
        )
    return steps, rank_summary


def _grouped(v: pl.DataFrame) -> pl.DataFrame:
    """One row per (invariant, what, name): its ranks, its first reason and how many rows broke it."""
    return (
        v.sort(["what", "name", "rank", "step"], nulls_last=True)
        .group_by(["invariant", "what", "name"], maintain_order=True)
        .agg(pl.col("rank").drop_nulls().unique().sort().alias("ranks"), pl.col("reason").first(), pl.len().alias("n"))
    )


def _reason(r: dict[str, Any]) -> str:
    more = int(r["n"]) - 1
    return str(r["reason"]) + (f" (and {more} more step{'s' if more > 1 else ''})" if more > 0 else "")


def _figure_lines(v: pl.DataFrame) -> list[Withheld]:
    return [
        Withheld(r["what"], r["name"], tuple(int(x) for x in r["ranks"]), r["invariant"], _reason(r))
        for r in _grouped(v).iter_rows(named=True)
    ]


def _judge_findings(a: Analysis, v: pl.DataFrame) -> tuple[tuple[Finding, ...], list[Withheld]]:
    """The findings kept, and one line per finding withheld: its what-if was withheld, one of its ranks
    has a withheld step figure or breakdown, or its saving lies outside [0, step]."""
    g = _grouped(v)
    by_scenario = {r["name"]: r for r in g.filter(pl.col("what") == "whatif").iter_rows(named=True)}
    by_rank: dict[int, dict[str, Any]] = {}
    for r in _grouped(v.filter(pl.col("what").is_in(["rank_figures", "breakdown"]))).iter_rows(named=True):
        for x in r["ranks"]:
            by_rank.setdefault(int(x), r)
    longest = int(cast(int, a.steps["step_time_ns"].max()) or 0) if a.steps.height else 0
    kept: list[Finding] = []
    lines: list[Withheld] = []
    for f in a.findings:
        wf = f.evidence.get("whatif")
        sc = wf.get("scenario") if isinstance(wf, dict) else None
        hit = by_scenario.get(sc) if sc is not None else None
        hit = hit or next((by_rank[r] for r in f.ranks if r in by_rank), None)
        if hit is not None:
            lines.append(Withheld("finding", f.kind, f.ranks, hit["invariant"], _reason(hit)))
        elif f.est_saving_ns < 0 or (longest and f.est_saving_ns > longest + TOLERANCE_NS):
            why = f"saving {fmt_ns(f.est_saving_ns)} per step vs the longest step {fmt_ns(longest)}"
            lines.append(Withheld("finding", f.kind, f.ranks, "saving_in_step", why))
        else:
            kept.append(_without_withheld_evidence(f, by_scenario))
    return tuple(kept), lines


def _without_withheld_evidence(f: Finding, withheld: dict[str, Any]) -> Finding:
    """``f`` without the evidence entries that quote a withheld what-if row (e.g. an exposed-comm
    finding's ``bound_full_overlap`` beside its own ``fp8_dispatch`` what-if): a withheld figure is
    not published through a finding that stands on another."""
    ev = {k: v for k, v in f.evidence.items() if not (isinstance(v, dict) and v.get("scenario") in withheld)}
    return f if len(ev) == len(f.evidence) else dataclasses.replace(f, evidence=ev)


def _f(x: Any) -> float | None:
    """``x`` as a number, None when it is not one (null, a string, a bool)."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def summary_violations(s: dict[str, Any]) -> list[str]:
    """The invariants a published summary (docs/summary.md) breaks, one line each (empty: none).

    On what the summary holds: per rank the means per step against the rank's longest step, the
    breakdown's means (each part in [0, step], the parts summing to the step within their rounding),
    the stages' busy time per step, the what-if rows against their ``kept_work_ns``, the replay, and
    every finding's saving against the longest step.
    """
    out: list[str] = []
    tol = TOLERANCE_NS
    ranks = [r for r in s.get("ranks") or [] if isinstance(r, dict)]
    longest_of = {r.get("rank"): v for r in ranks if (v := _f(r.get("step_time_max_ns"))) is not None}
    longest = max(longest_of.values(), default=None)
    for r in ranks:
        st, rk = _f(r.get("step_time_max_ns")), r.get("rank")
        for c, inv in (
            ("compute_ns", "compute_le_step"),
            ("comm_ns", "comm_le_step"),
            ("exposed_comm_ns", "comm_le_step"),
            ("barrier_wait_ns", "wait_in_step"),
        ):
            x = _f(r.get(c))
            if x is not None and st is not None and not 0 <= x <= st + tol:
                out.append(f"{inv}: rank {rk} {c} {x:.0f} outside [0, step_time_max_ns {st:.0f}]")
        comm, exp, oe = _f(r.get("comm_ns")), _f(r.get("exposed_comm_ns")), _f(r.get("overlap_efficiency"))
        if comm is not None and exp is not None and exp > comm + tol:
            out.append(f"comm_le_step: rank {rk} exposed_comm_ns {exp:.0f} > comm_ns {comm:.0f}")
        if oe is not None and not 0 <= oe <= 1:
            out.append(f"comm_le_step: rank {rk} overlap_efficiency {oe} outside [0, 1]")
    for b in s.get("breakdown") or []:
        st, parts = _f(b.get("step_time_ns")), [_f(b.get(p)) for p in BREAKDOWN_PARTS]
        known = [p for p in parts if p is not None]
        if st is None or len(known) < len(parts):
            continue
        if any(not 0 <= p <= st + tol for p in known):
            out.append(f"parts_in_step: rank {b.get('rank')} breakdown {known} vs step {st:.0f}")
        if abs(sum(known) - st) > len(known) + 1:  # means per step, each rounded to 1 ns
            out.append(f"parts_sum_to_step: rank {b.get('rank')} parts sum to {sum(known):.0f}, step {st:.0f}")
    for x in s.get("stages") or []:
        busy, st = _f(x.get("busy_ns")), longest_of.get(x.get("rank"))
        if busy is not None and st is not None and busy > st + tol:
            out.append(f"stage_le_step: rank {x.get('rank')} {x.get('stage')} busy {busy:.0f} > step {st:.0f}")
    for w in s.get("whatif") or []:
        p, k = _f(w.get("predicted_step_ns")), _f(w.get("kept_work_ns"))
        if p is not None and p < 0:
            out.append(f"step_nonnegative: what-if {w.get('scenario')} predicts {p:.0f}")
        elif p is not None and k is not None and p < k - tol:
            out.append(f"whatif_ge_kept_work: what-if {w.get('scenario')} predicts {p:.0f} < kept work {k:.0f}")
        sv = _f(w.get("saving_ns"))
        if w.get("scenario") in REMOVALS and sv is not None and sv < -tol:
            out.append(f"removal_le_baseline: what-if {w.get('scenario')} saves {sv:.0f} (a longer step)")
    for r in ((s.get("replay") or {}).get("per_rank")) or []:
        rep = _f(r.get("replayed_ns"))
        if rep is not None and rep < 0:
            out.append(f"step_nonnegative: rank {r.get('rank')} replayed {rep:.0f}")
    for f in s.get("findings") or []:
        x = _f(f.get("est_saving_ns"))
        if x is not None and (x < 0 or (longest is not None and x > longest + tol)):
            out.append(f"saving_in_step: finding {f.get('kind')} saves {x:.0f} of a longest step {longest}")
    return out
