"""The knowledge table (``ep_trace/families.toml``): every row's examples match that row first, the
tables derived from it agree with it, and docs/frameworks.md holds its current rendering."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from ep_trace import knowledge
from ep_trace.analysis.kernel_families import KERNEL_FAMILIES, stage_table
from ep_trace.analysis.stage_families import family_label_expr
from ep_trace.analysis.stages import load_presets
from ep_trace.comm_classifier import COMM_KERNEL_PATTERNS, FAMILY_COLLECTIVE, comm_family, comm_family_expr
from ep_trace.errors import ConfigError

DOC = Path(__file__).resolve().parents[1] / "docs" / "frameworks.md"


def _cases(section: str) -> list[tuple[int, str]]:
    return [(i, ex) for i, r in enumerate(knowledge.rows(section)) for ex in r.examples]


def test_every_row_has_a_source_and_a_real_example():
    for section in knowledge.SECTIONS:
        for r in knowledge.rows(section):
            assert r.source and r.examples, (section, r.pattern)


@pytest.mark.parametrize(("section"), ["kernel", "cpu_op", "module", "token"])
def test_every_example_matches_its_own_row_first(section):
    table = knowledge.rows(section)
    wrong = [(i, ex) for i, ex in _cases(section) if knowledge.first_match(ex, table) is not table[i]]
    assert wrong == []


def test_the_polars_path_gives_the_same_rows_as_python_re():
    """The detector matches with polars (Rust regex); the rows must mean the same there."""
    cases = _cases("kernel")
    df = pl.DataFrame({"name": [ex for _, ex in cases]})
    got = df.select(
        knowledge.first_match_expr(
            pl.col("name"), tuple((str(i), r.pattern) for i, r in enumerate(knowledge.kernel_rows()))
        )
    ).to_series()
    assert got.to_list() == [str(i) for i, _ in cases]


def test_range_examples_match_and_give_a_stage():
    for r in knowledge.rows("range"):
        for ex in r.examples:
            m = re.search(r.pattern, ex)
            assert m is not None, (r.pattern, ex)
            assert r.stage or m.groupdict().get("stage"), (r.pattern, ex)


def test_comm_and_stage_come_from_the_same_row():
    """A kernel is communication exactly where its row says so, and the stage detector reads the same
    row: DeepEP's dispatch / combine / notify kernels are both communication and a stage, its layout
    kernel neither communication nor unknown."""
    for r in knowledge.kernel_rows():
        for ex in r.examples:
            assert comm_family(ex) == r.comm, ex
    names = pl.DataFrame({"name": [ex for r in knowledge.kernel_rows() for ex in r.examples]})
    out = names.select(comm_family_expr(pl.col("name")).alias("comm"), family_label_expr(pl.col("name")).alias("stage"))
    want = [(r.comm, r.stage) for r in knowledge.kernel_rows() for _ in r.examples]
    assert list(zip(out["comm"], out["stage"], strict=True)) == want
    deepep = [r for r in knowledge.kernel_rows() if r.framework == "DeepEP"]
    assert {(r.comm, r.stage) for r in deepep} == {
        (None, "permute"),
        ("deepep", "notify"),
        ("deepep", "dispatch"),
        ("deepep", "combine"),
        ("deepep", None),
    }


def test_the_issue_names_get_their_stage():
    """The kernels that found no stage before this table (issue 38), each with its row's stage."""
    cases = {
        "void moe::dev::routing::routingRenormalize::routingIndicesHistogramScoresKernel<P>(P)": (None, "route"),
        "void moe::dev::routing::routingIndicesHistogramKernel<P>(P)": (None, "permute"),
        "void moe::dev::routing::routingIndicesOffsetsKernel<P>(P)": (None, "permute"),
        "aiter::topksoftmax_4x128x8_bf16": (None, "route"),
        "void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*)": ("deepep", "dispatch"),
        "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*)": ("deepep", "combine"),
        "void dpsk::ep::internode::notify_dispatch<false, 8>(int const*)": ("deepep", "notify"),
        "void dpsk::ep::internode::cached_notify<false>(int)": ("deepep", "notify"),
        "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*)": (None, "permute"),
    }
    for name, (comm, stage) in cases.items():
        row = knowledge.first_match(name, knowledge.kernel_rows())
        assert row is not None and (row.comm, row.stage) == (comm, stage), name


def test_derived_tables():
    assert [f.regex for f in KERNEL_FAMILIES] == [r.pattern for r in knowledge.kernel_rows() if r.stage]
    assert [rx for _, rx in COMM_KERNEL_PATTERNS] == [r.pattern for r in knowledge.kernel_rows() if r.comm]
    assert FAMILY_COLLECTIVE["deepep"] == "all_to_allv" and "nccl" not in FAMILY_COLLECTIVE
    assert len(stage_table()) == len(knowledge.kernel_rows())
    assert [p["pattern"] for p in load_presets()] == [r.pattern for r in knowledge.rows("range")]


def test_a_user_kernel_row_comes_first(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text("[[kernel]]\npattern = '^my_router_kernel'\nstage = \"route\"\n")
    from ep_trace.analysis.stages import load_user_kernels

    extra = load_user_kernels(f)
    df = pl.DataFrame({"name": ["my_router_kernel_v2", "fused_moe_kernel"]})
    assert df.select(family_label_expr(pl.col("name"), extra)).to_series().to_list() == ["route", "expert"]
    f.write_text('[[kernel]]\npattern = \'^x\'\nstage = "route"\ncomm = "nccl"\n')
    with pytest.raises(ConfigError, match=r"kernel\[0\] needs 'pattern' and 'stage' \(and no 'comm'\)"):
        load_user_kernels(f)
    f.write_text("[[kernel]]\npattern = '^x'\nstage = \"routing\"\n")
    with pytest.raises(ConfigError, match="stage / role 'routing' is not one of"):
        load_user_kernels(f)


def test_the_doc_holds_the_current_table():
    text = DOC.read_text()
    start, end = text.index(knowledge.DOC_BEGIN), text.index(knowledge.DOC_END) + len(knowledge.DOC_END)
    assert text[start:end] == knowledge.render_markdown(), (
        "docs/frameworks.md is stale: replace its generated block with `python -m ep_trace.knowledge`"
    )
