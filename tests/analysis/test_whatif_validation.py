"""Reality check of the simulated savings at small size: paired 2-rank demo runs (slow; see
benchmarks/whatif_validate.py for the full figures). The machine is shared, so the tolerances are
wide; the injected sleep is the ground truth of the straggler pair (it does not depend on CPU load)."""

from __future__ import annotations

import polars as pl
import pytest

from ep_trace import load
from ep_trace.analysis.imbalance import run_aggregate
from ep_trace.workloads.demo import DemoConfig, run_demo


@pytest.mark.slow
def test_straggler_pair_predicted_saving(tmp_path):
    # 2 layers x 40 ms sleep in rank 1's expert stages: 80 ms per step to be saved
    run_demo(DemoConfig(ranks=2, steps=4, tokens=256, straggler="1:40"), tmp_path / "a")
    a = load([tmp_path / "a"])
    top = a.findings[0]
    assert top.kind == "straggler_wait" and top.ranks == (1,)
    assert top.evidence["whatif"]["scenario"] == "no_straggler"
    assert 0.5 * 80e6 <= top.est_saving_ns <= 1.5 * 80e6
    assert float(a.replay["error_pct"].max()) <= 2.0
    # (the measured A - B difference of one small pair is not asserted: on the shared 2-core machine
    # it swings by more than the 80 ms at stake; benchmarks/whatif_validate.py repeats interleaved pairs)


@pytest.mark.slow
def test_skewed_routing_is_imbalance_not_straggler(tmp_path, validation):
    # expert 1 (on rank 0) takes 45 % of the assignments: rank 0 is late because it carries more tokens
    run_demo(DemoConfig(ranks=2, steps=4, tokens=2048, skew="hot:1:0.45"), tmp_path)
    a = load([tmp_path])
    # what the counts say is deterministic (seeded routing): 2.16x the rows on rank 0, I_e 3.59, I_r 1.37
    rows = dict(a.rank_load.group_by("rank").agg(pl.col("recv_rows").sum()).iter_rows())
    assert rows == {0: 44824, 1: 20712}
    agg = run_aggregate(a.imbalance)
    assert agg["I_e"] == pytest.approx(3.594, abs=1e-3) and agg["I_r"] == pytest.approx(1.368, abs=1e-3)
    bal = a.whatif.filter(pl.col("scenario") == "balanced_routing").row(0, named=True)
    assert bal["ranks"] == [0]
    kinds = {f.kind: f for f in a.findings}
    if "routing_imbalance" in kinds:
        assert kinds["routing_imbalance"].ranks == (0,)
        assert kinds["routing_imbalance"].evidence["hot_experts"][0]["expert"] == 1
    # What balancing saves is priced from each rank's measured expert time per row. On a quiet machine
    # rank 0's is ~2x rank 1's and balancing saves 7-23 ms; with one busy loop beside the run (the CI
    # machine's load) the two ranks' per-row costs drift apart (42.3 vs 26.5 ms for 2.16x the rows) and
    # the saving fell to -2.0..+3.1 ms in 5 runs, 2 of them without the finding (stop 28): the verdict
    # itself is asserted on a quiet machine only (--validation; benchmarks/whatif_validate.py pairs it).
    if validation:
        assert "routing_imbalance" in kinds and bal["saving_ns"] > 0
        assert not ("straggler_wait" in kinds and kinds["straggler_wait"].ranks == (0,))


@pytest.mark.slow
def test_pipelining_is_not_advised_where_transfers_cannot_hide(tmp_path):
    # 2 gloo ranks pinned to one core between them (each transfer is CPU work of gloo's worker thread,
    # which then competes with the compute it should hide behind): the sidecar records the cores, the
    # model keeps the transfers in the step, and no finding advises chunked pipelining
    import os

    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(old)})  # inherited by the spawned ranks
    try:
        run_demo(DemoConfig(ranks=2, steps=4, tokens=512), tmp_path)
    finally:
        os.sched_setaffinity(0, old)
    a = load([tmp_path])
    assert a.tables.ranks["cpu_cores"].to_list() == [1, 1]
    w = dict(a.whatif.select("scenario", "saving_ns").iter_rows())
    assert w["full_overlap"] == 0 and w["chunked_pipeline"] < 0
    assert any("gloo's transfer thread has no spare core" in n for n in a.notes)
    assert all("pipelining" not in f.title for f in a.findings)


def test_in_run_pairs_measure_neighbouring_steps():
    """benchmarks/whatif_validate.py's in-run estimator: each even (A) step against the odd (B) step
    after it; a drift both sides share cancels (known answer: B is 5 ms shorter at every point)."""
    import importlib
    import pathlib
    import sys

    import polars as pl

    bench = pathlib.Path(__file__).parents[2] / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        wv = importlib.import_module("whatif_validate")
    finally:
        sys.path.remove(str(bench))
    steps = list(range(2, 42))
    # machine speed drifts by 30 ms over the run, far more than the 5 ms effect; step 41's B is missing
    t = [50e6 + 0.75e6 * s - (5e6 if s % 2 else 0.0) for s in steps[:-1]]
    pairs = wv._step_pairs(pl.DataFrame({"step": steps[:-1], "step_time_ns": t}))
    assert len(pairs) == 19 and pairs[0] == (50e6 + 1.5e6, 50e6 + 2.25e6 - 5e6)
    d = [a - b for a, b in pairs]
    assert d == [pytest.approx(5e6 - 0.75e6)] * 19  # the drift of one step is left, no more
    lo, hi = wv._paired_median_ci(d)
    assert lo == pytest.approx(4.25e6) and hi == pytest.approx(4.25e6)
