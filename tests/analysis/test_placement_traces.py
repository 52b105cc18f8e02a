"""The placement model on real traces of the reference workload (``sample_traces/``, 4 gloo ranks).

Known answers the traces carry: the demo routes every assignment to the one owner of its expert
(contiguous placement, recorded in the sidecar), so the model's routing of the sidecar's counts under
that placement must reproduce the recorded count matrix exactly, and every EP invariant holds.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import ep_trace
from ep_trace.analysis.config import AnalysisConfig, TopologySpec
from ep_trace.analysis.placement_in_force import in_force

SAMPLES = ["skewed_straggler", "balanced", "chunked_overlap", "backward"]
TWO_NODES = AnalysisConfig(topology=TopologySpec(ranks_per_node=2, source="ranks-per-node=2"))


@pytest.fixture(scope="module")
def analyses(samples_dir: Path) -> dict[str, ep_trace.Analysis]:
    return {s: ep_trace.load(samples_dir / s, TWO_NODES) for s in SAMPLES}


@pytest.mark.parametrize("sample", SAMPLES)
def test_every_invariant_holds(analyses, sample):
    inv = analyses[sample].ep_invariants
    assert inv is not None
    assert inv.select("check", "status").rows() == [
        ("assignment_conservation", "ok"),
        ("ownership", "ok"),
        ("split_consistency", "ok"),
    ]
    assert inv["violations"].sum() == 0 and inv["checked"].min() > 0


@pytest.mark.parametrize("sample", ["skewed_straggler", "chunked_overlap"])
def test_routing_rule_reproduces_the_recorded_count_matrix(analyses, sample):
    a = analyses[sample]
    rc = a.tables.routing_counts
    counts = rc.group_by("step", "layer", pl.col("rank").alias("src"), "expert").agg(pl.col("count").sum())
    current = in_force(a.tables.placement, counts.select("step", "layer"), 8, [0, 1, 2, 3])
    assert current.recorded and current.distinct == 1
    nodes = {r: r // 2 for r in range(4)}
    model = current.route(counts, nodes).rename({"rows": "model"})
    cm = a.count_matrix.filter(pl.col("direction") == "dispatch")
    measured = cm.group_by("step", "layer", "src", "dst").agg(pl.col("rows").sum().alias("measured"))
    j = measured.filter(pl.col("measured") > 0).join(
        model, on=["step", "layer", "src", "dst"], how="full", coalesce=True
    )
    assert j.height == 2 * 3 * 16  # layers x steps x pairs: every pair of the 4 ranks sends
    assert (j["model"] == j["measured"]).all()


def test_link_bytes_add_up_to_the_count_matrix(analyses):
    a = analyses["skewed_straggler"]
    assert a.link_bytes is not None
    cm = a.count_matrix.filter(pl.col("direction") == "dispatch")
    per_step = float((cm["rows"] * cm["row_bytes"]).sum()) / cm["step"].n_unique()
    got = a.link_bytes.filter(pl.col("direction") == "dispatch")["bytes"].sum()
    assert got == pytest.approx(per_step)
    # 2 nodes of 2 ranks: a rank's own rows, its node peer's and the other node's each a class
    assert set(a.link_bytes["link_class"]) == {"same_rank", "same_node", "cross_node"}


def test_proposals_even_the_load_and_node_local_cuts_cross_node_bytes(analyses):
    a = analyses["skewed_straggler"]
    p = a.placement
    assert p is not None and bool(p["recorded"][0])
    stats = p.group_by("scenario").agg(pl.col("load").max().alias("mx"), pl.col("cross_node_bytes").sum().alias("x"))
    s = {r["scenario"]: r for r in stats.iter_rows(named=True)}
    assert s["placement"]["mx"] < s["current"]["mx"]
    assert s["node_local"]["x"] < s["current"]["x"]
    assert [pr.scenario for pr in a.placement_proposals] == ["placement", "node_local"]
    for pr in a.placement_proposals:
        held = sorted({e for ex in pr.experts for e in ex})
        assert held == list(range(8)) and max(len(ex) for ex in pr.experts) <= 8 // 4 + 1


def test_placement_moves_load_onto_the_straggler_and_is_predicted_slower(analyses):
    # the README example's routing: the late rank (2, 30 ms per expert stage) holds cold experts; any
    # placement that evens the load gives it more rows, as balanced_routing does (measured slower in an
    # in-run A/B, benchmarks/README.md), and the model says so
    w = {r["scenario"]: r for r in analyses["skewed_straggler"].whatif.iter_rows(named=True)}
    assert w["balanced_routing"]["saving_ns"] < 0 and w["placement"]["saving_ns"] < 0
    assert 2 in w["placement"]["ranks"]
    from ep_trace.reports.whatif_table import whatif_rows

    row = next(r for r in whatif_rows(analyses["skewed_straggler"]) if r[0] == "placement")
    assert row[3].endswith("slower") and "work slower per row (measured)" in row[1]


def test_one_node_has_no_node_local(samples_dir: Path):
    a = ep_trace.load(samples_dir / "balanced")
    assert a.topology is not None and a.topology["node"].unique().to_list() == ["vm"]
    assert "node_local" not in set(a.whatif["scenario"]) and "placement" in set(a.whatif["scenario"])
