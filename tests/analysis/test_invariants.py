"""The invariants pass (ep_trace/analysis/invariants.py): exact withholding on handmade figures, and the
property that every published summary holds the invariants, over every real trace of
../shared/external, every sample trace and the EP-2 gloo test trace (the fuzz suite's cases are
held to the same check by tests/robustness/fuzz_worker.py)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import polars as pl
import pytest

import ep_trace
from ep_trace.analysis import analyze, invariants, rank_tables
from ep_trace.analysis.result import Analysis, Finding, Withheld

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from invariants_census import inputs  # noqa: E402

MS = 1_000_000


@pytest.fixture(scope="module")
def carrier() -> Analysis:
    """A real small analysis whose frames the tests replace by handmade ones."""
    from tests.analysis.conftest import gpu_job

    return analyze(gpu_job([200_000, 250_000, 300_000, 500_000], 600_000))


def _steps(rows: list[tuple[int, int, int, int]]) -> pl.DataFrame:
    """``(rank, step, step_time_ns, compute_ns)`` -> a steps frame (comm 10 ms, no wait)."""
    return pl.DataFrame(
        [
            {
                "rank": r,
                "step": s,
                "start_ns": 0,
                "end_ns": t,
                "step_time_ns": t,
                "comm_ns": 10 * MS,
                "compute_ns": k,
                "overlapped_ns": 0,
                "exposed_comm_ns": 10 * MS,
                "barrier_wait_ns": 0,
                "transfer_ns": 10 * MS,
            }
            for r, s, t, k in rows
        ],
        schema_overrides={"rank": pl.Int32},
    )


def _stages(rows: list[tuple[int, int, str, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {"rank": r, "step": s, "stage": st, "busy_ns": b, "window_ns": b, "exposed_comm_ns": 0, "tier": "range"}
            for r, s, st, b in rows
        ],
        schema_overrides={"rank": pl.Int32},
    )


def _whatif(rows: list[tuple[str, int, list[int]]]) -> pl.DataFrame:
    return pl.DataFrame(
        [{"scenario": s, "predicted_step_ns": p, "saving_ns": 100 * MS - p, "ranks": r, "chunks": None} for s, p, r in rows],
        schema={"scenario": pl.Utf8, "predicted_step_ns": pl.Int64, "saving_ns": pl.Int64, "ranks": pl.List(pl.Int32), "chunks": pl.Int32},
    )  # fmt: skip


def _finding(kind: str, ranks: tuple[int, ...], scenario: str | None, saving: int = MS) -> Finding:
    ev = {"whatif": {"scenario": scenario}} if scenario else {}
    return Finding(kind, "medium", f"{kind} title", saving, ev, "remedy", ranks)


def _handmade(carrier: Analysis, **frames) -> Analysis:
    """Two ranks, two steps of 100 ms; compute r0: 60, 70 ms, r1: 80, 50 ms; expert busy r0 s1 20 ms,
    r1 s1 30 ms; permute r1 s2 10 ms."""
    steps = _steps(
        [(0, 1, 100 * MS, 60 * MS), (0, 2, 100 * MS, 70 * MS), (1, 1, 100 * MS, 80 * MS), (1, 2, 100 * MS, 50 * MS)]
    )
    stages = _stages([(0, 1, "expert", 20 * MS), (1, 1, "expert", 30 * MS), (1, 2, "permute", 10 * MS)])
    st = frames.get("steps", steps)
    rs = rank_tables.rank_summary(st, carrier.tables.ranks, {0: "gpu", 1: "gpu"}).with_columns(
        pl.lit(0).alias("wait_uncertainty_ns")
    )
    base = dict(steps=steps, stages=stages, rank_summary=rs, breakdown=None, replay=None, whatif=None, findings=())
    return dataclasses.replace(carrier, **{**base, **frames})  # fmt: skip


def test_kept_work_of_each_edit(carrier: Analysis) -> None:
    """min over steps of the mean over ranks of |K| less the stages the edit shortens (edited ranks: 0)."""
    wf = _whatif(
        [
            ("balanced_routing", 50 * MS, [0, 1]),  # step 1: (60-20 + 80-30)/2 = 45; step 2: (70 + 50)/2 = 60
            ("no_straggler", 50 * MS, [1]),  # step 1: (60 + 0)/2 = 30; step 2: (70 + 0)/2 = 35
            ("full_overlap", 50 * MS, [0, 1]),  # min(70, 60)
            ("fused_permute", 50 * MS, [0, 1]),  # step 2: (70 + 50-10)/2 = 55; step 1: 70
            ("all", 50 * MS, [0, 1]),  # no_straggler's rank 1 out, expert and permute off: min(20, 35)
            ("some_future_edit", 50 * MS, [0]),  # not in EDITS: not judged
        ]
    )
    kept = invariants.kept_work(_handmade(carrier, whatif=wf))
    assert kept.rows() == [
        ("balanced_routing", 45 * MS),
        ("no_straggler", 30 * MS),
        ("full_overlap", 60 * MS),
        ("fused_permute", 55 * MS),
        ("all", 20 * MS),
        ("some_future_edit", None),
    ]


def test_a_whatif_below_its_kept_work_is_withheld_with_its_finding(carrier: Analysis) -> None:
    wf = _whatif([("balanced_routing", 44 * MS, [0, 1]), ("full_overlap", 60 * MS, [0, 1]), ("all", -MS, [0, 1])])
    a = _handmade(
        carrier,
        whatif=wf,
        findings=(
            _finding("routing_imbalance", (1,), "balanced_routing"),
            _finding("exposed_comm", (0,), "full_overlap"),
        ),
    )
    out = invariants.enforce(a)
    assert out.whatif is not None and out.whatif.select("scenario", "kept_work_ns").rows() == [
        ("full_overlap", 60 * MS)
    ]
    assert [f.kind for f in out.findings] == ["exposed_comm"]
    assert [w.line() for w in out.withheld] == [
        "withheld finding routing_imbalance (rank 1): breaks whatif_ge_kept_work: predicted step 44.0 ms < the 45.0 ms "
        "of device work the edit keeps",
        "withheld whatif all: breaks step_nonnegative: predicted step -1.00 ms",
        "withheld whatif balanced_routing: breaks whatif_ge_kept_work: predicted step 44.0 ms < the 45.0 ms of device "
        "work the edit keeps",
    ]
    s = out.summary()
    assert [w["name"] for w in s["withheld"]] == ["routing_imbalance", "all", "balanced_routing"]
    assert invariants.summary_violations(s) == []


def test_all_falls_with_a_withheld_edit(carrier: Analysis) -> None:
    """``all`` (kept work 45 ms) predicts 50 ms, above its own bound, but includes balanced_routing,
    which predicts 44 ms against its 45 ms: withheld with it."""
    wf = _whatif([("balanced_routing", 44 * MS, [0, 1]), ("full_overlap", 60 * MS, [0, 1]), ("all", 50 * MS, [0, 1])])
    out = invariants.enforce(_handmade(carrier, whatif=wf))
    assert out.whatif is not None and out.whatif["scenario"].to_list() == ["full_overlap"]
    assert out.withheld[0] == Withheld(
        "whatif", "all", (), "whatif_ge_kept_work", "every edit at once includes the withheld balanced_routing"
    )


def test_compute_beyond_the_step_withholds_the_rank_figures_and_its_findings(carrier: Analysis) -> None:
    """The DeepEP training case of issue 39: a compute union of 124.3 ms per 112.2 ms step."""
    steps = _steps([(0, 1, 112_200_000, 124_300_000), (0, 2, 100 * MS, 70 * MS), (1, 1, 100 * MS, 80 * MS)])
    a = _handmade(
        carrier,
        steps=steps,
        findings=(_finding("host_bound", (0,), "no_launch_gaps"), _finding("straggler_wait", (1,), "no_straggler")),
    )
    out = invariants.enforce(a)
    assert [f.kind for f in out.findings] == ["straggler_wait"]
    assert out.rank_summary.sort("rank")["compute_ns"].to_list()[0] is None
    assert out.rank_summary.sort("rank")["compute_ns"].to_list()[1] is not None
    assert out.steps.filter(pl.col("rank") == 0)["compute_ns"].to_list() == [None, None]
    assert [w.line() for w in out.withheld] == [
        "withheld finding host_bound (rank 0): breaks compute_le_step: rank 0, step 1: compute 124 ms > step 112 ms",
        "withheld rank figures compute (rank 0): breaks compute_le_step: rank 0, step 1: compute 124 ms > step 112 ms",
    ]


def test_breakdown_stage_wait_and_saving(carrier: Analysis) -> None:
    bd = pl.DataFrame(
        {
            "rank": [0, 0],
            "step": [1, 2],
            **{p: [10 * MS, 10 * MS] for p in invariants.BREAKDOWN_PARTS},
            "step_time_ns": [70 * MS, 60 * MS],  # step 1's parts add up; step 2's sum to 70 ms
        },
        schema_overrides={"rank": pl.Int32},
    )
    steps = _steps([(0, 1, 70 * MS, 10 * MS), (0, 2, 60 * MS, 10 * MS)]).with_columns(
        pl.Series("barrier_wait_ns", [90 * MS, 0])
    )
    stages = _stages([(0, 2, "combine", 40 * MS), (0, 2, "combine", 30 * MS)])  # two layers: 70 ms in a 60 ms step
    a = _handmade(
        carrier,
        steps=steps,
        stages=stages,
        breakdown=bd,
        findings=(_finding("small_message_latency", (), None, 71 * MS),),
    )
    out = invariants.enforce(a)
    assert out.findings == ()
    assert out.breakdown is not None and out.breakdown["step"].to_list() == [1]
    assert out.stages.height == 0
    assert out.steps["barrier_wait_ns"].to_list() == [None, None]
    assert out.withheld == (
        Withheld("finding", "small_message_latency", (), "saving_in_step", "saving 71.0 ms per step vs the longest step 70.0 ms"),
        Withheld("breakdown", "breakdown", (0,), "parts_sum_to_step", "rank 0, step 2: parts sum to 70.0 ms, step 60.0 ms"),
        Withheld("rank_figures", "barrier wait", (0,), "wait_in_step", "rank 0, step 1: barrier wait 90.0 ms vs step 70.0 ms"),
        Withheld("stage", "combine", (0,), "stage_le_step", "rank 0, step 2: combine busy 70.0 ms > step 60.0 ms"),
    )  # fmt: skip


def test_summary_violations_word_for_word() -> None:
    s = {
        "ranks": [
            {"rank": 0, "step_time_max_ns": 100, "compute_ns": 5000, "comm_ns": 50, "exposed_comm_ns": 2000},
            {"rank": 1, "step_time_max_ns": 100, "overlap_efficiency": 1.5, "barrier_wait_ns": -1},
        ],
        "breakdown": [{"rank": 0, "step_time_ns": 100, **{p: 10 for p in invariants.BREAKDOWN_PARTS}}],
        "whatif": [{"scenario": "all", "predicted_step_ns": 10, "kept_work_ns": 5000}],
        "findings": [{"kind": "exposed_comm", "est_saving_ns": 9000}],
    }
    assert invariants.summary_violations(s) == [
        "compute_le_step: rank 0 compute_ns 5000 outside [0, step_time_max_ns 100]",
        "comm_le_step: rank 0 exposed_comm_ns 2000 outside [0, step_time_max_ns 100]",
        "comm_le_step: rank 0 exposed_comm_ns 2000 > comm_ns 50",
        "wait_in_step: rank 1 barrier_wait_ns -1 outside [0, step_time_max_ns 100]",
        "comm_le_step: rank 1 overlap_efficiency 1.5 outside [0, 1]",
        "parts_sum_to_step: rank 0 parts sum to 70, step 100",
        "whatif_ge_kept_work: what-if all predicts 10 < kept work 5000",
        "saving_in_step: finding exposed_comm saves 9000 of a longest step 100.0",
    ]


def test_every_invariant_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    assert [k for k in invariants.INVARIANTS if f"`{k}`" not in doc] == []
    # every what-if scenario the model makes is judged (FRAME_DOCS lists them)
    from ep_trace.analysis.result import FRAME_DOCS

    scen = FRAME_DOCS["whatif"]["scenario"]
    assert all(f"'{s}'" in scen for s in invariants.EDITS)


@pytest.mark.parametrize("path", inputs([]), ids=lambda p: p.name)
def test_published_summaries_hold_the_invariants(path: Path) -> None:
    a = ep_trace.load([path])
    assert invariants.violations(a).is_empty()
    s = a.summary()
    assert invariants.summary_violations(s) == []
    kinds = {f.kind for f in a.findings}
    assert not any(w.what == "finding" and w.name in kinds for w in a.withheld)
    assert len(s["withheld"]) == len(a.withheld)


def test_an_edit_that_only_removes_time_never_lengthens_the_step(carrier: Analysis) -> None:
    """removal_le_baseline: full_overlap predicting 130 ms against the replayed 100 ms is withheld (the
    replay is monotone in every duration), balanced_routing moving work may predict a longer step; the
    exposed-comm finding standing on fp8_dispatch stays, without its bound quoting the withheld row."""
    wf = _whatif(
        [("full_overlap", 130 * MS, [0, 1]), ("fp8_dispatch", 95 * MS, [0, 1]), ("balanced_routing", 130 * MS, [0, 1])]
    )
    f = _finding("exposed_comm", (0,), "fp8_dispatch")
    f = dataclasses.replace(f, evidence={**f.evidence, "bound_full_overlap": {"scenario": "full_overlap"}})
    out = invariants.enforce(_handmade(carrier, whatif=wf, findings=(f,)))
    assert out.whatif is not None and out.whatif["scenario"].to_list() == ["fp8_dispatch", "balanced_routing"]
    assert [w.line() for w in out.withheld] == [
        "withheld whatif full_overlap: breaks removal_le_baseline: predicted step 130 ms > the replayed baseline "
        "100 ms, though the edit only removes time"
    ]
    assert [x.kind for x in out.findings] == ["exposed_comm"]
    assert out.findings[0].evidence == {"whatif": {"scenario": "fp8_dispatch"}}
    s = {"whatif": [{"scenario": "no_straggler", "predicted_step_ns": 9, "saving_ns": -5000}]}
    assert invariants.summary_violations(s) == ["removal_le_baseline: what-if no_straggler saves -5000 (a longer step)"]
