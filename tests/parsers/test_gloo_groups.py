"""gloo calls' process groups from their worker threads (parsers/kineto_gloo_groups.py).

The real case is ``tests/data/ep2_gloo`` (tests/data/ep2_gloo/make_ep2_gloo.py, torch 2.13 gloo, 4 ranks,
EP groups {0, 1} {2, 3}, expert-data-parallel groups {0, 2} {1, 3}, the world): the generator's
program is known, so each call's group is known independently of the worker threads: per step, three
all-to-alls on the rank's EP group, then the expert all-reduce on its EDP group, then the dense
all-reduce on the world.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from ep_trace.parsers.dispatch import read_trace_dir
from ep_trace.parsers.kineto_gloo_groups import assign_threads

DATA = Path(__file__).resolve().parents[1] / "data" / "ep2_gloo"

#: The groups torch named (distributedInfo.pg_config of the 4 files): created in the generator's order.
WORLD, EP01, EP23, EDP02, EDP13 = "0", "1", "2", "3", "4"
RANKS = {WORLD: [0, 1, 2, 3], EP01: [0, 1], EP23: [2, 3], EDP02: [0, 2], EDP13: [1, 3]}


def test_one_assignment_by_order_count_and_size() -> None:
    # rank 0 of the EP-2 trace: six threads, groups world (4), EP (2), EDP (2); the EP threads ran
    # all-to-alls with split lists of 2, the others all-reduces (no size)
    assert assign_threads([set(), set(), {2}, {2}, set(), set()], [4, 2, 2]) == [0, 0, 1, 1, 2, 2]
    # one world thread seen: still one way to place five threads in order, two per group at most
    assert assign_threads([set(), {2}, {2}, set(), set()], [4, 2, 2]) == [0, 1, 1, 2, 2]
    # sizes decide where order and counts do not: a size-2 thread cannot be the world's
    assert assign_threads([{2}, set()], [4, 2]) == [1, 1]


def test_no_assignment_when_ambiguous_or_impossible() -> None:
    assert assign_threads([set(), set()], [4, 2, 2]) is None  # which two of three groups ran?
    assert assign_threads([set()] * 5, [4, 2]) is None  # more threads than two groups hold
    assert assign_threads([{3}], [4, 2]) is None  # a size no group has
    assert assign_threads([set()], []) is None  # no pg_config
    assert assign_threads([], [4]) is None


@pytest.fixture(scope="module")
def colls() -> pl.DataFrame:
    return read_trace_dir(DATA).collectives


def _expected(rank: int) -> list[str]:
    """The group of each of the rank's calls in issue order, from the generator's program."""
    ep = EP01 if rank < 2 else EP23
    edp = EDP02 if rank % 2 == 0 else EDP13
    return [ep, ep, ep, edp, WORLD] * 3


def test_ep2_gloo_calls_carry_their_group(colls: pl.DataFrame) -> None:
    for r in range(4):
        mine = colls.filter(pl.col("rank") == r).sort("cpu_start_ns")
        assert (
            mine["collective"].to_list() == ["all_to_all", "all_to_allv", "all_to_allv", "allreduce", "allreduce"] * 3
        )
        assert mine["pg_name"].to_list() == _expected(r)
        assert mine["group_ranks"].to_list() == [RANKS[g] for g in _expected(r)]
        assert mine["group_size"].to_list() == [len(RANKS[g]) for g in _expected(r)]
        assert mine["backend"].unique().to_list() == ["gloo"]
    # the ordinal counts a rank's calls within each group
    per = colls.group_by("rank", "pg_name").agg(pl.col("ordinal").sort()).sort("rank", "pg_name")
    assert all(o == list(range(len(o))) for o in per["ordinal"].to_list())


def test_without_pg_config_no_group_is_guessed(colls: pl.DataFrame, tmp_path: Path) -> None:
    """A file without distributedInfo.pg_config (torch < 2.4) keeps its gloo calls groupless."""
    import gzip
    import json

    for r in range(4):
        doc = json.loads(gzip.decompress((DATA / f"rank{r}.pt.trace.json.gz").read_bytes()))
        doc["distributedInfo"].pop("pg_config")
        (tmp_path / f"rank{r}.pt.trace.json").write_text(json.dumps(doc))
    t = read_trace_dir(tmp_path)
    assert t.collectives["pg_name"].null_count() == t.collectives.height == colls.height
