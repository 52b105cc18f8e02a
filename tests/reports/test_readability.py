"""Issue 13 points 1, 2 and 4 and issue 16 point 5, through the figures' data and the page's HTML.

Breakdown beside the stage breakdown, top kernels / ops, the critical path on the timeline (a
hand-built frame), the palette in every figure, zero-based heatmaps with numbers and a "vs mean"
view, one sentence instead of a 0% chart, units on every axis, captions for the notation, the
α–β line only when conclusive, CPU-only host-stall wording, the dominant-stage verdict, finding
evidence links, and rank axes that stay readable at 4,096 ranks.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import polars as pl
import pytest
from fake_analysis import make_fake_analysis
from plotdata import arr, traces

from ep_trace.analysis.result import Analysis
from ep_trace.reports import breakdown_figures, comm_figures, digest, palette, routing_figures, stage_figures, timeline
from ep_trace.reports.evidence import finding_evidence
from ep_trace.reports.html import render_report
from ep_trace.reports.rank_axis import rank_axis

ALL_FIGURES = (
    stage_figures.stage_breakdown,
    timeline.step_timeline,
    routing_figures.count_matrix_heatmap,
    routing_figures.expert_load_bars,
    routing_figures.imbalance_per_layer,
    comm_figures.overlap_per_rank,
    comm_figures.overlap_per_stage,
    comm_figures.barrier_wait_per_rank,
    comm_figures.wait_matrix_heatmap,
    comm_figures.alpha_beta_scatter,
    breakdown_figures.time_breakdown,
)


@pytest.fixture(scope="module")
def a4():
    return make_fake_analysis()


def _with_cp(a: Analysis, cp: pl.DataFrame) -> Analysis:
    return dataclasses.replace(a, critical_path=cp)


# ---- 1. breakdown, top kernels, critical path ------------------------------------------------


def test_breakdown_figure_stacks_the_six_parts_per_rank(a4):
    t = traces(breakdown_figures.time_breakdown(a4))
    # (the seventh, device copies, is left out of a CPU trace's legend: it is zero there)
    assert list(t) == ["compute", "overlapped comm", "exposed comm", "barrier wait", "host stall", "idle"]
    total = sum(arr(t[k]["y"]) for k in t)
    np.testing.assert_allclose(
        total,
        a4.steps.group_by("rank").agg(pl.col("step_time_ns").mean()).sort("rank")["step_time_ns"] / 1e6,
        rtol=1e-6,
    )
    np.testing.assert_allclose(arr(t["barrier wait"]["y"]), [2.0, 2.0, 0.0, 2.0])
    assert t["barrier wait"]["marker"]["color"] == palette.CAUSE_COLORS["barrier_wait"]
    s = breakdown_figures.breakdown_sentence(a4)
    assert s.startswith("Mean over ranks and steps: compute ") and "Largest part:" in s


def test_top_tables_carry_the_stage(a4):
    t = breakdown_figures.top_table(a4.top_kernels, a4)
    assert t.rows()[0] == ("grouped_gemm", "expert", 1_000_000.0, 2.0, 0, 1_000_000.0)  # 2 layers x 500 µs per step
    html = render_report(a4)
    assert "Top kernels by time" in html and "Top CPU ops by time" in html
    # the per-rank breakdown and the stage breakdown sit side by side in one flex row
    assert re.search(
        r'<div class="pair"><div>.*?id="fig-breakdown".*?</div><div><div id="stages"></div>.*?id="fig-stages"',
        html,
        re.S,
    )


def test_critical_path_is_drawn_over_the_timeline_when_present(a4):
    sel = timeline.timeline_selection(a4)
    st = a4.steps.filter((pl.col("rank") == 2) & (pl.col("step") == sel.step)).row(0, named=True)
    cp = pl.DataFrame(
        {
            "step": [sel.step] * 3 + [sel.step + 1],
            "seq": [0, 1, 2, 0],
            "rank": [2, 2, 0, 2],
            "start_ns": [st["start_ns"], st["start_ns"] + 1_000_000, st["start_ns"] + 2_000_000, st["start_ns"]],
            "end_ns": [
                st["start_ns"] + 1_000_000,
                st["start_ns"] + 2_000_000,
                st["start_ns"] + 2_500_000,
                st["end_ns"],
            ],
            "cause": ["compute", "transfer", "barrier_wait", "compute"],
            "stage": ["expert", "dispatch", "dispatch", "expert"],
            "name": ["gemm", "a2a", "a2a", "gemm"],
        }
    )
    assert not any("critical" in (t.get("name") or "") for t in timeline.step_timeline(a4).to_dict()["data"])
    fig = timeline.step_timeline(_with_cp(a4, cp))
    t = traces(fig)
    assert {"critical path: compute", "critical path: transfer", "critical path: barrier wait"} <= set(t)
    x = arr(t["critical path: compute"]["x"])
    assert len(x) == 3  # only the representative step's segment (1 segment x 3 points)
    np.testing.assert_allclose(x[1] - x[0], 1.0)  # 1 ms
    assert t["critical path: transfer"]["line"]["color"] == palette.CAUSE_COLORS["transfer"]
    assert fig.layout.yaxis.ticktext[0] == "critical path"
    assert "The top row is the critical path" in render_report(_with_cp(a4, cp))
    empty = _with_cp(a4, cp.head(0))
    assert breakdown_figures.critical_path_of(empty, sel.step) is None


# ---- 2. palette, heatmaps, sentences, units, captions, α–β, host stalls, expert verdict -------


def test_every_figure_uses_the_palette_for_stages_and_causes(a4):
    stage_fig = traces(stage_figures.stage_breakdown(a4))
    for stage, tr in stage_fig.items():
        assert tr["marker"]["color"] == palette.STAGE_COLORS[stage]
    tl = traces(timeline.step_timeline(a4))
    assert tl["dispatch"]["line"]["color"] == palette.STAGE_COLORS["dispatch"]
    assert tl["barrier wait"]["line"]["color"] == palette.CAUSE_COLORS["barrier_wait"]
    assert tl["exposed comm"]["line"]["color"] == palette.CAUSE_COLORS["exposed_comm"]
    ov = traces(comm_figures.overlap_per_rank(a4))
    assert ov["exposed |C \\ K|"]["marker"]["color"] == palette.CAUSE_COLORS["exposed_comm"]
    assert ov["overlapped |C ∩ K|"]["marker"]["color"] == palette.CAUSE_COLORS["overlapped_comm"]
    bw = traces(comm_figures.barrier_wait_per_rank(a4))
    assert bw["barrier wait"]["marker"]["color"] == palette.CAUSE_COLORS["barrier_wait"]
    # non-stage series never borrow a stage or cause colour
    taken = set(palette.STAGE_COLORS.values()) | set(palette.CAUSE_COLORS.values())
    for fn in (routing_figures.imbalance_per_layer, routing_figures.expert_load_bars):
        for tr in fn(a4).to_dict()["data"]:
            assert tr.get("marker", {}).get("color") not in taken


def test_heatmaps_start_at_zero_with_numbers_and_a_vs_mean_view(a4):
    d = routing_figures.count_matrix_heatmap(a4).to_dict()
    hm = d["data"][0]
    assert hm["zmin"] == 0.0 and hm["colorscale"][0][1] == "#FFFFFF" and hm["texttemplate"]
    buttons = d["layout"]["updatemenus"][0]["buttons"]
    assert [b["label"] for b in buttons] == ["absolute (rows)", "vs mean (%)"]
    rel = arr(buttons[1]["args"][0]["z"][0])
    z = arr(hm["z"])
    np.testing.assert_allclose(rel, (z / z.mean() - 1) * 100, atol=0.01)
    assert buttons[1]["args"][0]["zmin"][0] == -buttons[1]["args"][0]["zmax"][0]  # centred on the mean
    assert buttons[1]["args"][0]["colorscale"][0] == palette.DIVERGING
    wm = comm_figures.wait_matrix_heatmap(a4).to_dict()["data"][0]
    assert wm["zmin"] == 0.0 and wm["texttemplate"]
    big = routing_figures.count_matrix_heatmap(
        make_fake_analysis(n_ranks=64, steps=2, layers=2, experts=64, with_events=False)
    )
    assert big.to_dict()["data"][0].get("texttemplate") is None  # 4,096 cells: numbers on hover only


def test_zero_overlap_becomes_one_sentence():
    a = make_fake_analysis()
    rs = a.rank_summary.with_columns(pl.col("comm_ns").alias("exposed_comm_ns"))
    b = dataclasses.replace(a, rank_summary=rs)
    assert comm_figures.overlap_per_rank(b) is None and comm_figures.overlap_per_stage(b) is None
    s = comm_figures.overlap_sentence(b)
    assert s.startswith("No communication is hidden under compute on any rank (overlap efficiency 0%)")
    html = render_report(b)
    assert s in html and 'id="fig-overlap-rank"' not in html and "overlapped |C ∩ K|" not in html


def test_every_axis_has_a_title_with_its_unit(a4):
    for fn in ALL_FIGURES:
        fig = fn(a4)
        assert fig is not None, fn.__name__
        lay = fig.to_dict()["layout"]
        for ax in ("xaxis", "yaxis"):
            assert lay.get(ax, {}).get("title", {}).get("text"), (fn.__name__, ax)
    assert "ms" in timeline.step_timeline(a4).layout.xaxis.title.text
    assert "(B" in comm_figures.alpha_beta_scatter(a4).layout.xaxis.title.text


def test_jargon_is_explained_under_its_figure(a4):
    html = render_report(a4)
    caps = re.findall(r'<p class="caption">(.*?)</p>', html)
    joined = " ".join(caps)
    for term in (
        "|C ∩ K| is communication hidden",
        "I_e = max_e n_e / mean_e n_e",
        "I_r = max_r L_r",
        "α–β model: T = α + B/β",
    ):
        assert term in joined, term


def test_alpha_beta_line_only_when_conclusive(a4):
    weak = dataclasses.replace(a4, alpha_beta=a4.alpha_beta.with_columns(pl.lit(0.12).alias("r2")))
    t = traces(comm_figures.alpha_beta_scatter(weak))
    assert list(t) == ["intra_host calls (fit inconclusive, r² = 0.12)"]  # no fitted line
    assert "inconclusive (r² &lt; 0.8)" in render_report(weak) or "inconclusive (r² < 0.8)" in render_report(weak)
    assert any(k.startswith("intra_host fit") for k in traces(comm_figures.alpha_beta_scatter(a4)))


def test_host_stalls_say_compute_thread_on_cpu_runs(samples_dir):
    import ep_trace

    a = ep_trace.load(samples_dir / "skewed_straggler")
    assert (a.rank_summary["mode"] == "cpu").all()
    html = render_report(a)
    stalls = html[html.index('<section id="stalls">') : html.index('<section id="load">')]
    assert "device idle" not in stalls and "compute thread idle" in stalls


def test_expert_stage_at_90_percent_gets_the_verdict():
    a = make_fake_analysis(straggler=None, findings=False)
    # a toy MoE: the expert GEMM busy 90% of every rank's step
    st = (
        a.stages.join(a.steps.select("rank", "step", "step_time_ns"), on=["rank", "step"])
        .with_columns(
            pl.when(pl.col("stage") == "expert")
            .then((pl.col("step_time_ns") * 0.9 / pl.col("layer").n_unique()).cast(pl.Int64))
            .otherwise(pl.col("busy_ns"))
            .alias("busy_ns")
        )
        .drop("step_time_ns")
    )
    v = digest.verdict(dataclasses.replace(a, stages=st))
    assert v.headline.startswith("The expert stage takes 90.0% of the step on rank ")
    assert "compute-bound in the expert GEMMs" in v.detail
    assert digest.verdict(a).headline != v.headline  # a normal split keeps the usual verdict


# ---- 4. evidence links ------------------------------------------------------------------------


def test_every_finding_links_to_its_section_and_trace_window(a4):
    ev = finding_evidence(a4)
    assert [e.fid for e in ev] == [f"F{i + 1}" for i in range(len(a4.findings))]
    top = ev[0]
    assert top.section == "wait" and top.rank == 2 and top.step == timeline.timeline_selection(a4).step
    st = a4.steps.filter((pl.col("rank") == 2) & (pl.col("step") == top.step)).row(0, named=True)
    assert (top.start_ns, top.end_ns) == (st["start_ns"], st["end_ns"])
    html = render_report(a4)
    for e in ev:
        row = re.search(rf'<tr id="finding-{e.fid}">(.*?)</tr>', html).group(1)
        assert f'href="#{e.section}"' in row and f"rank{e.rank}.ep-annotated.json.gz" in row
        assert f"search <code>{e.fid}</code>" in row
        assert f'id="{e.section}"' in html  # a section, or the stage figure's anchor inside one


# ---- issue 16.5: large jobs ---------------------------------------------------------------------


def test_rank_axis_groups_hosts_and_keeps_the_slowest():
    ranks = pl.DataFrame({"rank": range(4096), "host": [f"node{r // 8}" for r in range(4096)]})
    st = pl.DataFrame(
        {"rank": range(4096), "step_time_ns": [10 + (r == 1234) * 100 + (r == 77) * 50 for r in range(4096)]}
    )
    ax = rank_axis(ranks, st, max_bars=64, keep_slowest=8)
    assert ax.aggregated and ax.how == "block of 73" and len(ax.labels) == 8 + 56  # 4,088 ranks in 56 blocks
    assert ax.labels[:2] == ("r1234 (slow)", "r77 (slow)")
    small = rank_axis(ranks.head(64), st.head(64))
    assert not small.aggregated and len(small.labels) == 64
    hosts = rank_axis(ranks.head(256), st.head(256), max_bars=64)
    assert hosts.how == "host" and "node1 (8 ranks)" in hosts.labels


@pytest.mark.slow
def test_4096_rank_report_stays_small():
    # routing off: a dense 4,096² count matrix is 16.7M rows per step (the benchmark covers it)
    a = make_fake_analysis(
        n_ranks=4096, steps=2, layers=1, experts=64, ranks_per_host=8, with_events=False, with_routing=False
    )
    html = render_report(a)
    assert len(html.encode()) < 10_000_000
    for fn in (breakdown_figures.time_breakdown, comm_figures.overlap_per_rank, comm_figures.barrier_wait_per_rank):
        x = fn(a).to_dict()["data"][0]["x"]
        slow = a.rank_summary.sort("step_time_ns", descending=True)["rank"][0]
        assert len(x) <= 64 and f"r{slow} (slow)" in list(x) and sum("(slow)" in v for v in x) == 8, fn.__name__
    assert len(stage_figures.stage_breakdown(a).to_dict()["data"][0]["x"]) <= 64


def test_legend_rows_follow_plotly_wrapping():
    from ep_trace.reports.plot_layout import legend_below, legend_rows

    assert legend_rows(["a", "b"]) == 1  # fits on one row
    assert legend_rows(["barrier wait", "transfer", "idle", "compute", "exposed comm"], 220) == 5  # one column
    assert legend_rows(["r0", "r1", "r2", "r3", "r4", "r5"], 220) == 2  # 4 columns of 54 px
    fig = breakdown_figures.time_breakdown(make_fake_analysis())
    # the figure grows by the legend's rows: the plot area keeps its height on a phone
    assert fig.layout.legend.yref == "container" and fig.layout.margin.b >= 64 + 20 * 6
    assert fig.layout.height - fig.layout.margin.b - fig.layout.margin.t >= 200
    assert legend_below(fig) is fig
