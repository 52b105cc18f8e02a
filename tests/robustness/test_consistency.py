"""Issue 40, item 1: sidecars and rank sets that contradict their traces or each other.

Each test builds the input that used to be analysed as if whole (a wrong number without a word, or a
crash), from a copy of ``sample_traces/balanced`` (4 ranks, 8 experts, top-2, 512 tokens per rank
and layer), and pins the one-line error word for word, or the named exclusion with --keep-going.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import ep_trace
from ep_trace.cli import main
from ep_trace.errors import RankConflictError, ResourceLimitError, TraceFormatError
from ep_trace.parsers import read_trace_dir

ROOT = Path(__file__).resolve().parents[2]
BALANCED = ROOT / "sample_traces" / "balanced"
FIX = (
    "the sidecar is corrupt or holds lines of another rank or run; re-capture it or remove it "
    "(--keep-going leaves it out)"
)

Recs = list[dict[str, Any]]


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    d = tmp_path / "demo"
    shutil.copytree(BALANCED, d, ignore=shutil.ignore_patterns("README.md"))
    return d


def edit_sidecar(p: Path, fn: Callable[[Recs], Any]) -> None:
    recs = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    fn(recs)
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))


def meta(recs: Recs) -> dict[str, Any]:
    return next(r for r in recs if r["type"] == "meta")


def edit_header(p: Path, fn: Callable[[dict[str, Any]], Any]) -> None:
    doc = json.loads(gzip.decompress(p.read_bytes()))
    fn(doc)
    p.write_bytes(gzip.compress(json.dumps(doc).encode(), 1))


def refused(demo: Path, exc_type: type[Exception] = TraceFormatError) -> str:
    with pytest.raises(exc_type) as exc:
        read_trace_dir(demo)
    return str(exc.value)


# --- sidecars --------------------------------------------------------------------------------


def test_routing_counts_ten_times_tokens_x_top_k(demo: Path) -> None:
    sc = demo / "rank1.ep.jsonl"

    def tenfold(recs: Recs) -> None:
        r = next(r for r in recs if r["type"] == "routing")
        r["expert_counts"] = [10 * c for c in r["expert_counts"]]

    edit_sidecar(sc, tenfold)
    assert refused(demo) == (
        f"{sc}: line 2: 'expert_counts' sum to 10,240, not tokens x top_k = 512 x 2 = 1,024; the counts are "
        "corrupt or not this rank's; a router that drops or pads assignments records them as 'dropped' / "
        "'padded' (docs/sidecar.md); else re-capture the sidecar (--keep-going leaves it out)"
    )
    t = read_trace_dir(demo, on_error="skip")  # --keep-going: the sidecar is left out, the rank named
    assert [(i.level, i.rank) for i in t.load_report] == [("error", 1), ("warning", 1)]
    assert t.load_report[0].message.startswith("sidecar left out: ")
    assert t.load_report[1].message == (
        "no sidecar for rank 1: expert load, the count matrix and I_e / I_r cover ranks 0, 2, 3 only"
    )
    assert sorted(t.routing_counts["rank"].unique().to_list()) == [0, 2, 3]


def test_dropped_and_padded_assignments_are_accounted(demo: Path) -> None:
    def drop(recs: Recs) -> None:
        r = next(r for r in recs if r["type"] == "routing")
        r["expert_counts"][0] -= 21  # 21 assignments dropped at capacity, 4 padding rows added
        r["expert_counts"][1] += 4
        r["dropped"], r["padded"] = 21, 4

    edit_sidecar(demo / "rank1.ep.jsonl", drop)
    assert read_trace_dir(demo).routing_counts.height == 4 * 6 * 8


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("top_k", -2, "'top_k' is -2; it must be at least 1"),
        ("top_k", 9, "'top_k' is 9 but 'num_experts' is 8: a token cannot go to more experts than exist"),
        ("num_experts", 0, "'num_experts' is 0; it must be at least 1"),
        ("num_experts", 16, "'placement' has 8 entries but 'num_experts' is 16"),
        ("world_size", "4", "'world_size' is '4' (str), not an integer"),
        ("ep_group_ranks", [0, 2, 3], "'ep_group_ranks' (0, 2, 3) does not hold the sidecar's rank 1"),
    ],
)
def test_meta_out_of_range(demo: Path, key: str, value: Any, problem: str) -> None:
    sc = demo / "rank1.ep.jsonl"
    edit_sidecar(sc, lambda recs: meta(recs).__setitem__(key, value))
    assert refused(demo) == f"{sc}: meta: {problem}; {FIX}"


@pytest.mark.parametrize("n", [1_000_000, 10_000_000])
def test_num_experts_beyond_the_cap_is_refused_before_allocating(demo: Path, n: int) -> None:
    """1,000,000 gave I_e = 138,143 (or a segfault); 10,000,000 exhausted 4 GB."""
    sc = demo / "rank1.ep.jsonl"

    def huge(recs: Recs) -> None:
        meta(recs)["num_experts"] = n
        for r in recs:
            if r["type"] == "routing":
                r["expert_counts"] = r["expert_counts"] + [0] * (n - 8)

    edit_sidecar(sc, huge)
    assert refused(demo, ResourceLimitError) == (
        f"{sc}: meta: 'num_experts' is {n:,}, above the cap of 65,536 experts; if the model really routes to that "
        f"many experts, set EP_TRACE_MAX_EXPERTS={n}; else {FIX}"
    )


def test_placement_must_be_a_partition_unless_replicas_are_declared(demo: Path) -> None:
    sc = [demo / f"rank{r}.ep.jsonl" for r in range(4)]
    for p in sc:
        edit_sidecar(p, lambda recs: meta(recs).__setitem__("placement", [[0, 1, 2]] + [[r // 2] for r in range(1, 8)]))
    assert refused(demo) == (
        f"{sc[0]}: meta: 'placement' holds 10 expert copies for 8 experts (expert 0 on ranks 0, 1, 2) but "
        "'redundant_experts' is 0: each expert has one rank plus the declared replicas; declare the replicas as "
        "meta 'redundant_experts' (docs/sidecar.md), or re-capture the sidecar (--keep-going leaves it out)"
    )
    for p in sc:  # declared (vLLM EPLB's num_redundant_experts): accepted
        edit_sidecar(p, lambda recs: meta(recs).__setitem__("redundant_experts", 2))
    t = read_trace_dir(demo)
    assert t.placement.filter(pl.col("expert") == 0)["rank"].sort().to_list() == [0, 1, 2]


def test_sidecars_with_different_placements(demo: Path) -> None:
    a, b = demo / "rank0.ep.jsonl", demo / "rank2.ep.jsonl"
    edit_sidecar(b, lambda recs: meta(recs).__setitem__("placement", [[1], [0]] + meta(recs)["placement"][2:]))
    assert refused(demo, RankConflictError) == (
        f"{b}: sidecar placement differs from {a} (expert 0 on ranks [0] in one, [1] in the other); the sidecars "
        "are from different runs: put one run per directory, or re-capture (--keep-going does not mix them)"
    )


@pytest.mark.parametrize("kind", ["routing", "a2a"])
def test_lines_of_another_rank_appended(demo: Path, kind: str) -> None:
    sc = demo / "rank1.ep.jsonl"
    other = [json.loads(line) for line in (demo / "rank2.ep.jsonl").read_text().splitlines()]
    edit_sidecar(sc, lambda recs: recs.extend(r for r in other if r["type"] == kind))
    first = {"routing": ("step 0, layer 0, micro-batch 0", 2, 29), "a2a": ("step 0, call 0", 3, 29)}[kind]
    assert (
        refused(demo) == f"{sc}: line {first[2]}: a second record for {first[0]} (the first is line {first[1]}); {FIX}"
    )


def test_send_splits_longer_than_the_group(demo: Path) -> None:
    sc = demo / "rank1.ep.jsonl"
    edit_sidecar(sc, lambda recs: next(r for r in recs if r["type"] == "a2a")["send_splits"].append(3))
    assert refused(demo) == f"{sc}: line 3: 'send_splits' has 5 entries but the group has 4 ranks; {FIX}"


def test_every_step_shifted_to_match_no_traced_step(demo: Path) -> None:
    sc = demo / "rank1.ep.jsonl"
    edit_sidecar(sc, lambda recs: [r.__setitem__("step", r["step"] + 100) for r in recs if "step" in r])
    assert refused(demo) == (
        f"{sc}: line 2: step 100 is no ProfilerStep of its trace {demo / 'rank1.pt.trace.json.gz'} (steps 0, 1, 2); "
        "the records are shifted or from another run; re-capture the sidecar or remove it (--keep-going leaves it out)"
    )


def test_layer_of_a_billion(demo: Path) -> None:
    sc = demo / "rank1.ep.jsonl"
    edit_sidecar(sc, lambda recs: next(r for r in recs if r["type"] == "routing").__setitem__("layer", 10**9))
    assert refused(demo) == f"{sc}: line 2: 'layer' is 1,000,000,000, outside [0, 65,536); {FIX}"


def test_one_of_four_sidecars_deleted(demo: Path, tmp_path: Path) -> None:
    """Imbalance from 3 of 4 ranks used to be shown as the job's, without a word."""
    (demo / "rank3.ep.jsonl").unlink()
    a = ep_trace.load(demo)
    assert [(i.file, i.rank, i.level, i.message) for i in a.load_report] == [
        (
            str(demo / "rank3.ep.jsonl"),
            3,
            "warning",
            "no sidecar for rank 3: expert load, the count matrix and I_e / I_r cover ranks 0, 1, 2 only",
        )
    ]
    note = (
        "Expert load, I_e / I_r and the count matrix count the routing of 3 of 4 ranks (0-2): "
        "rank 3 has no sidecar routing records."
    )
    assert note in a.notes
    s = a.summary()
    assert s["imbalance"]["routing_missing_ranks"] == [3] and s["missing_ranks"] == []
    from ep_trace.reports.html_sections import routing_coverage_html

    assert routing_coverage_html(a) == (
        '<p class="note"><b>Partial routing</b>: these figures count the routing of 3 of 4 ranks; '
        "rank 3 has no sidecar routing records (see the load report).</p>"
    )


# --- rank sets -------------------------------------------------------------------------------


def test_one_rank_file_missing_is_named(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (demo / "rank2.pt.trace.json.gz").unlink()
    (demo / "rank2.ep.jsonl").unlink()
    a = ep_trace.load(demo)
    assert [(i.file, i.rank, i.message) for i in a.load_report] == [
        (str(demo), 2, "world size 4 but no trace file for 1 rank (2): every figure covers ranks 0, 1, 3 only")
    ]
    assert a.summary()["missing_ranks"] == [2]
    note = "Rank 2 has no trace file (world size 4): every figure covers the other 3 ranks only."
    assert note in a.notes
    code = main(["analyze", str(demo), "-o", str(demo.parent / "r.html"), "--no-cache"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0 and note in out  # the terminal says it too


@pytest.mark.parametrize(
    ("edit", "problem", "fix"),
    [
        (
            lambda d: d["distributedInfo"].__setitem__("rank", 4),
            "'rank' 4 is not below 'world_size' 4",
            "the file is from another job or its rank is wrong; pass --rank-map R=PATH to set its rank "
            "(--keep-going skips it)",
        ),
        (
            lambda d: d["distributedInfo"].__setitem__("world_size", "4"),
            "'world_size' is '4' (str), not an integer",
            "the trace header is damaged; re-export the trace (--keep-going skips it)",
        ),
        (
            lambda d: d["ep_trace"].__setitem__("rank", 3),
            "'rank' 1 disagrees with the ep_trace header's rank 3",
            "one of them was edited, or the file comes from another rank: pass --rank-map R=PATH to say which rank "
            "it is (--keep-going skips it)",
        ),
        (
            lambda d: d["distributedInfo"]["pg_config"][0].__setitem__("ranks", [0, 1, 2, 7]),
            "process group '0' of 'pg_config' lists rank 7, outside world size 4",
            "the trace header is damaged or from another job; re-export the trace (--keep-going skips it)",
        ),
        (
            lambda d: d["distributedInfo"]["pg_config"][0].__setitem__("pg_size", 2),
            "the default process group has 2 ranks but 'world_size' is 4",
            "the trace header is damaged or from another job; re-export the trace (--keep-going skips it)",
        ),
    ],
    ids=["rank_beyond_world", "world_size_string", "ep_trace_rank", "pg_rank_outside", "pg_size"],
)
def test_rank_header_contradictions(demo: Path, edit: Any, problem: str, fix: str) -> None:
    p = demo / "rank1.pt.trace.json.gz"
    edit_header(p, edit)
    assert refused(demo) == f"{p}: distributedInfo: {problem}; {fix}"
    t = read_trace_dir(demo, on_error="skip")  # --keep-going: the rank is left out and named twice
    assert sorted(t.ranks["rank"].to_list()) == [0, 2, 3]
    assert [(i.level, i.rank) for i in t.load_report if i.file == str(p)] == [("error", 1)]
    assert any(i.message.startswith("world size 4 but no trace file for 1 rank (1)") for i in t.load_report)
    assert 1 not in t.routing_counts["rank"].to_list() and 1 not in t.routing_matrix["src"].to_list()


def test_rank_map_settles_an_ep_trace_rank_disagreement(demo: Path) -> None:
    p = demo / "rank1.pt.trace.json.gz"
    edit_header(p, lambda d: d["ep_trace"].__setitem__("rank", 3))
    t = read_trace_dir(demo, rank_map={p.name: 1})
    assert sorted(t.ranks["rank"].to_list()) == [0, 1, 2, 3]


def test_violation_is_one_line_exit_2(demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit_sidecar(demo / "rank1.ep.jsonl", lambda recs: meta(recs).__setitem__("top_k", -2))
    code = main(["analyze", str(demo), "-o", str(demo.parent / "r.html"), "--no-cache"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "rank1.ep.jsonl: meta: 'top_k' is -2; it must be at least 1" in err
