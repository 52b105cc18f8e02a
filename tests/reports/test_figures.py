"""Figures checked through their data (fig.to_dict()), with values known from fake_analysis."""

from __future__ import annotations

import numpy as np
import pytest
from fake_analysis import make_fake_analysis
from plotdata import arr, traces

from ep_trace.reports import comm_figures, routing_figures, stage_figures, timeline


@pytest.fixture(scope="module")
def a4():
    return make_fake_analysis()


@pytest.fixture(scope="module")
def a64():
    return make_fake_analysis(n_ranks=64, steps=4, layers=4, experts=64, with_events=False)


def test_stage_breakdown_busy_and_window_per_rank(a4):
    t = traces(stage_figures.stage_breakdown(a4))
    assert list(t) == ["route", "permute", "dispatch", "expert", "combine", "unpermute"]
    x = t["dispatch"]["x"]
    assert list(x[0][:4]) == ["r0", "r1", "r2", "r3"] and list(x[1]) == ["busy"] * 4 + ["window"] * 4
    # dispatch: 2 layers x 300 µs busy; the window adds 2 x 1 ms of waiting for straggler rank 2.
    np.testing.assert_allclose(arr(t["dispatch"]["y"]), [0.6, 0.6, 0.6, 0.6, 2.6, 2.6, 0.6, 2.6])
    # expert: rank 2 computes 1 ms longer per layer.
    np.testing.assert_allclose(arr(t["expert"]["y"])[:4], [1.0, 1.0, 3.0, 1.0])


def test_timeline_selection_median_step_and_all_ranks(a4):
    sel = timeline.timeline_selection(a4)
    # Step lengths are equal, so the median over the 3 steps sorted by (length, step) is step 1.
    assert sel.step == 1 and sel.ranks == (0, 1, 2, 3) and not sel.sampled and sel.min_interval_ns == 0


def _boxes(fig, name):
    """(row labels, durations ms) of the bars of one timeline trace (3 points per segment)."""
    d = fig.to_dict()
    tr = next(t for t in d["data"] if t["name"] == name)
    x, y = arr(tr["x"]), arr(tr["y"])
    yaxis = d["layout"]["yaxis"]
    label = dict(zip(arr(yaxis["tickvals"]).tolist(), yaxis["ticktext"], strict=False))
    return [label[c] for c in y[0::3].tolist()], np.round(x[1::3] - x[0::3], 4)


def test_timeline_draws_waits_on_the_comm_rows(a4):
    fig = timeline.step_timeline(a4)
    rows, durs = _boxes(fig, "barrier wait")
    assert sorted(rows) == ["r0 comm"] * 2 + ["r1 comm"] * 2 + ["r3 comm"] * 2  # the straggler never waits
    np.testing.assert_allclose(durs, [1.0] * 6)  # 2 dispatches x 3 waiting ranks, 1 ms each
    rows, durs = _boxes(fig, "expert")
    assert dict(zip(rows, durs, strict=False))["r2 stages"] == 1.5  # the straggler's expert stage: 500 µs + 1 ms
    names = [t["name"] for t in fig.to_dict()["data"] if t.get("showlegend") is not False]
    assert names == [
        "route",
        "permute",
        "dispatch",
        "expert",
        "combine",
        "unpermute",
        "comm",
        "barrier wait",
        "exposed comm",
    ]
    hover = next(t for t in fig.to_dict()["data"] if t["name"] == "barrier wait (hover)")
    assert hover["hovertext"][0] == "wait for rank 2: 1000.0 µs"


def test_timeline_samples_large_jobs_keeping_the_straggler(a64):
    sel = timeline.timeline_selection(a64)
    assert sel.sampled and len(sel.ranks) == 16 and sel.n_ranks_total == 64
    assert 2 in sel.ranks and 0 in sel.ranks and 63 in sel.ranks
    fig = timeline.step_timeline(a64, sel)
    rows, _ = _boxes(fig, "comm")
    assert {r.split()[0] for r in rows} == {f"r{r}" for r in sel.ranks}
    assert "16 of 64 ranks" in fig.layout.title.text
    # one step of 16 ranks x 4 layers holds fewer than 1500 intervals, so per-interval hover labels are kept
    assert any(t["name"].endswith("(hover)") for t in fig.to_dict()["data"])
    big = timeline.step_timeline(a64, sel, hover_limit=100)
    assert not any(t["name"].endswith("(hover)") for t in big.to_dict()["data"])


def test_count_matrix_rows_per_step_and_local_ratio(a4):
    fig = routing_figures.count_matrix_heatmap(a4)
    z = arr(fig.to_dict()["data"][0]["z"])
    # experts 0,1 live on rank 0: (410 + 88) rows from every source per layer, 2 layers; others 2 x 88 x 2.
    assert z.shape == (4, 4)
    np.testing.assert_allclose(z[:, 0], [996.0] * 4)
    np.testing.assert_allclose(z[0], [996.0, 352.0, 352.0, 352.0])
    assert "local ratio 25%" in fig.layout.title.text


def test_count_matrix_is_binned_beyond_max_cells(a64):
    fig = routing_figures.count_matrix_heatmap(a64, max_cells=16)
    d = fig.to_dict()["data"][0]
    assert arr(d["z"]).shape == (16, 16) and d["x"][0] == "r0-3" and d["x"][-1] == "r60-63"
    assert "binned by 4" in fig.layout.title.text


def test_expert_load_and_imbalance(a4):
    t = traces(routing_figures.expert_load_bars(a4))
    assert list(t) == ["layer 0 (I_e 3.20)", "layer 1 (I_e 3.20)"]
    np.testing.assert_allclose(arr(t["layer 0 (I_e 3.20)"]["y"]), [1640.0] + [352.0] * 7)
    imb = traces(routing_figures.imbalance_per_layer(a4))
    np.testing.assert_allclose(arr(imb["I_e (P50 over steps)"]["y"]), [3.1969, 3.1969], atol=1e-4)
    np.testing.assert_allclose(arr(imb["I_r (P50 over steps)"]["y"]), [1.9415, 1.9415], atol=1e-4)


def test_overlap_wait_and_matrix(a4):
    ov = traces(comm_figures.overlap_per_rank(a4))
    np.testing.assert_allclose(arr(ov["exposed |C \\ K|"]["y"]), [2.16, 2.16, 0.66, 2.16])
    np.testing.assert_allclose(arr(ov["overlapped |C ∩ K|"]["y"]), [0.72, 0.72, 0.22, 0.72])
    bw = traces(comm_figures.barrier_wait_per_rank(a4))
    np.testing.assert_allclose(arr(bw["barrier wait"]["y"]), [2.0, 2.0, 0.0, 2.0])
    np.testing.assert_allclose(arr(bw["transfer"]["y"]), [0.88] * 4)
    z = arr(comm_figures.wait_matrix_heatmap(a4).to_dict()["data"][0]["z"])
    expected = np.zeros((4, 4))
    expected[[0, 1, 3], 2] = 6.0  # 3 steps x 2 layers x 1 ms, all waited for rank 2
    np.testing.assert_allclose(z, expected)
    st = traces(comm_figures.overlap_per_stage(a4))
    assert list(st["exposed |C \\ K|"]["x"]) == ["dispatch", "combine"]


def test_alpha_beta_scatter_and_fit_line(a4):
    t = traces(comm_figures.alpha_beta_scatter(a4))
    name = "intra_host fit: α=25.0 µs, β=12.50 GB/s, r²=0.97 (latency bound)"
    assert set(t) == {"intra_host calls", name}
    line = t[name]
    x, y = arr(line["x"]), arr(line["y"])
    np.testing.assert_allclose(y, 25.0 + x / 12.5e9 * 1e6, atol=1e-3)
    assert len(arr(t["intra_host calls"]["x"])) == a4.calls.height


def test_every_figure_tolerates_empty_frames():
    a = make_fake_analysis(with_routing=False, straggler=None)
    assert routing_figures.count_matrix_heatmap(a) is None
    assert routing_figures.expert_load_bars(a) is None
    assert routing_figures.imbalance_per_layer(a) is None
    assert comm_figures.wait_matrix_heatmap(a) is None  # nobody waited
    assert stage_figures.stage_breakdown(a) is not None


def test_stage_breakdown_becomes_a_heatmap_for_many_ranks(a64):
    d = stage_figures.stage_breakdown(a64).to_dict()["data"]
    assert len(d) == 1 and d[0]["type"] == "heatmap"
    assert d[0]["y"][:4] == ["route busy", "route window", "permute busy", "permute window"] and len(d[0]["x"]) == 64
    z = arr(d[0]["z"])
    row = d[0]["y"].index("dispatch window")
    # 4 layers x (300 µs + 2 ms / 4 layers of wait on everyone but the straggler rank 2) per step
    assert z[row, 0] == pytest.approx(3.2) and z[row, 2] == pytest.approx(1.2)
