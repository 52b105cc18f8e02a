"""Collective fields computed once per signature (``parsers/kineto_coll_fields.py``): the signature
holds every key the fields are read from, per-call values stay per call, and the vectorised marker
grouping keeps the marker-by-marker rule where the two could differ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ep_trace.parsers import kineto_collectives, read_kineto
from ep_trace.parsers.kineto_coll_fields import META_KEYS, OP_KEYS, call_signature, fields_from
from ep_trace.parsers.read_pool import read_kineto_files

from .conftest import A2AV_META


class _Recording(dict):  # type: ignore[type-arg]
    """A dict that notes every key read from it (``get``, ``[]``, ``in``)."""

    def __init__(self, d: dict[str, Any], seen: set[str]) -> None:
        super().__init__(d)
        self.seen = seen

    def get(self, k: Any, default: Any = None) -> Any:
        self.seen.add(k)
        return super().get(k, default)

    def __getitem__(self, k: Any) -> Any:
        self.seen.add(k)
        return super().__getitem__(k)

    def __contains__(self, k: object) -> bool:
        self.seen.add(k)  # type: ignore[arg-type]
        return super().__contains__(k)


def _recorded(seen: dict[str, set[str]]):  # noqa: ANN202 - a test double
    real = fields_from

    def spy(meta, launcher, by, kept, dist, world, source):  # noqa: ANN001, ANN202
        rec_kept = dict(kept)
        for kind in ("c10d", "func", "title"):
            m = by.get(kind)
            if m is not None and m["event_id"] in kept:
                rec_kept[m["event_id"]] = _Recording(kept[m["event_id"]], seen[kind])
        rec_dist = _Recording(dist, seen["dist"])
        return real(_Recording(meta, seen["meta"]), launcher, by, rec_kept, rec_dist, world, source)

    return spy


def _real_traces(external_dir: Path, samples_dir: Path) -> list[Path]:
    return sorted((external_dir / "kineto").rglob("*.json.gz")) + sorted(samples_dir.rglob("*.pt.trace.json.gz"))


def test_signature_holds_every_key_the_fields_read(external_dir, samples_dir, monkeypatch, tmp_path, kt):
    # every real trace plus inline ones reaching the branches the real ones do not (legacy size keys,
    # 2.3's Process Group ID, send / recv peers, the functional wrapper, gloo Concrete Inputs)
    seen: dict[str, set[str]] = {k: set() for k in ("meta", "c10d", "func", "title", "dist")}
    monkeypatch.setattr(kineto_collectives, "fields_from", _recorded(seen))
    legacy = {"Collective name": "send", "In msg size": 4, "Out msg size": 4, "Process Group ID": 7, "Dst Rank": 1}
    inline = [
        kt.nccl_call(0, 10, 500, A2AV_META),
        kt.nccl_call(200, 20, 510, legacy),
        kt.nccl_call(400, 30, 520, {**legacy, "Collective name": "recv", "Src Rank": 1}),
        [
            kt.x("cpu_op", "_c10d_functional::all_to_all_single", 600, 50, **{"Concrete Inputs": ["", "[2]", "[1]"]}),
            kt.x("cpu_op", "c10d::alltoall_base_", 700, 40, **{"Concrete Inputs": ["", "", "", "[1, 1]", "[2, 0]"]}),
        ],
    ]
    paths = [kt.write_trace(tmp_path / f"{i}.json", evs) for i, evs in enumerate(inline)]
    read_kineto_files(_real_traces(external_dir, samples_dir) + paths, None)
    assert seen["meta"] - {"Seq", "Comms Id"} <= set(META_KEYS)
    assert seen["dist"] <= {"pg_config"}  # with world_size (passed as `world`), what dist_key holds
    for kind in ("c10d", "func", "title"):
        assert seen[kind] <= set(OP_KEYS[kind]), kind
    assert {"In msg size", "Process Group ID", "Dst Rank", "Src Rank"} <= seen["meta"]  # the branches were reached
    assert all(seen[k] for k in ("meta", "c10d", "func", "title")), seen


def test_ranks_of_a_batch_share_signatures_only_with_the_same_process_groups(tmp_path, kt):
    # no ranks or start / stride in the metadata: the group comes from distributedInfo.pg_config,
    # which differs between the two files, so the shared signature must not carry one file's group
    meta = {"Collective name": "allreduce", "Group size": 2, "Process Group Name": "5"}
    paths = []
    for rank, ranks in ((0, [0, 2]), (1, [1, 3])):
        extra = {
            "distributedInfo": {
                "backend": "nccl",
                "rank": rank,
                "world_size": 4,
                "pg_config": [{"pg_name": "5", "ranks": ranks}],
            }
        }
        paths.append(kt.write_trace(tmp_path / f"rank{rank}.json", kt.nccl_call(0, 10, 500, meta), extra=extra))
    got = read_kineto_files(paths, None)
    assert [r[0].collectives["group_ranks"].to_list() for r in got] == [[[0, 2]], [[1, 3]]]


def test_calls_sharing_a_signature_keep_their_own_seq_and_comms_id(tmp_path, kt):
    evs = [
        *kt.nccl_call(0, 10, 500, {**A2AV_META, "Seq": 41, "Comms Id": 2**63 + 5}),
        *kt.nccl_call(300, 20, 510, {**A2AV_META, "Seq": 42, "Comms Id": 7}),
        *kt.nccl_call(600, 30, 520, {**A2AV_META, "Seq": 43}),
    ]
    c = read_kineto(kt.write_trace(tmp_path / "a.json", evs)).collectives.sort("coll_id")
    assert c["seq"].to_list() == [41, 42, 43]
    assert c["comms_id"].to_list() == [2**63 + 5, 7, None]
    assert c["in_splits"].to_list() == [[3, 5]] * 3 and c["group_ranks"].to_list() == [[0, 1]] * 3


def test_bad_comms_id_on_a_later_call_of_a_shared_signature_names_that_call(tmp_path, kt):
    evs = [
        *kt.nccl_call(0, 10, 500, {**A2AV_META, "Comms Id": 1}),
        *kt.nccl_call(300, 20, 510, {**A2AV_META, "Comms Id": -1}),
    ]
    bad = next(i for i, e in enumerate(evs) if e["name"] == "c10d::alltoall_base_" and e["ts"] == 300)
    with pytest.raises(Exception, match=rf"traceEvents\[{bad}\]: 'Comms Id' -1 is not an unsigned 64-bit integer"):
        read_kineto(kt.write_trace(tmp_path / "a.json", evs))


def test_signature_is_not_shared_when_null_or_big_ints_could_collide():
    names = ("c10d::allreduce_", None, None)
    assert call_signature({"Collective name": "allreduce", "dtype": None}, names, {}, {}, {}) is None
    assert call_signature({"Collective name": "allreduce", "Group size": 2**70}, names, {}, {}, {}) is None
    a = call_signature({"Collective name": "allreduce", "Group size": 1}, names, {}, {}, {})
    b = call_signature({"Collective name": "allreduce", "Group size": 1.0}, names, {}, {}, {})
    c = call_signature({"Collective name": "allreduce", "Group size": True}, names, {}, {}, {})
    assert a is not None and len({a, b, c}) == 3  # 1, 1.0 and true are told apart
    # only the keys the fields read: per-call ids do not split a signature
    assert call_signature({**A2AV_META, "External id": 1, "Seq": 1}, names, {}, {}, {}) == call_signature(
        {**A2AV_META, "External id": 2, "Seq": 2}, names, {}, {}, {}
    )


def test_member_ending_after_its_root_keeps_the_marker_rule(tmp_path, kt):
    # record_param_comms starts inside the c10d op but ends after it; the title starting after the
    # c10d op's end is a call of its own (the root's end decides, not the latest end seen)
    evs = [
        kt.x("cpu_op", "c10d::allreduce_", 0, 100),
        kt.x("cpu_op", "record_param_comms", 50, 100, **{"Collective name": "allreduce", "Group size": 2}),
        kt.x("user_annotation", "nccl:all_reduce", 120, 10),
    ]
    c = read_kineto(kt.write_trace(tmp_path / "a.json", evs)).collectives.sort("coll_id")
    assert c.select("op_name", "collective", "cpu_start_ns").rows() == [
        ("c10d::allreduce_", "allreduce", kt.BASE),
        ("nccl:all_reduce", "allreduce", kt.BASE + 120_000),
    ]
    assert c["group_size"].to_list() == [2, None]


def test_vectorised_grouping_equals_the_marker_rule(tmp_path, kt):
    # nested markers on two threads, a sibling starting exactly at the root's end (a new call)
    evs = [
        kt.x("cpu_op", "c10d::allreduce_", 0, 100, tid=1),
        kt.x("user_annotation", "nccl:all_reduce", 10, 20, tid=1),
        kt.x("cpu_op", "c10d::broadcast_", 100, 10, tid=1),
        kt.x("cpu_op", "c10d::barrier", 5, 10, tid=2),
        kt.x("user_annotation", "nccl:all_reduce", 6, 2, tid=2),
    ]
    t = read_kineto(kt.write_trace(tmp_path / "a.json", evs))
    c = t.collectives.sort("cpu_start_ns", "op_name")
    assert c["op_name"].to_list() == ["c10d::allreduce_", "c10d::barrier", "c10d::broadcast_"]
    assert c["collective"].to_list() == ["allreduce", "barrier", "broadcast"]
    assert t.collectives.filter(pl.col("collective") == "barrier")["backend"].to_list() == ["nccl"]


def _marker_rule(rows: list[tuple[int, int | None, int, int, int]]) -> list[int]:
    """The grouping rule marker by marker (the reference): a marker starting before the end of its
    thread's current root joins that call, else it is the root of the next one."""
    out: list[int] = []
    key = end = None
    for f, pid, tid, s, e in rows:
        if (f, pid, tid) != key or end is None or s >= end:
            out.append(len(out))
            key, end = (f, pid, tid), e
        else:
            out.append(out[-1])
    return [sorted(set(out)).index(g) for g in out]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 1), st.sampled_from([None, 7]), st.integers(1, 2), st.integers(0, 60), st.integers(0, 40)
        ),
        max_size=40,
    )
)
def test_vectorised_marker_groups_equal_the_marker_rule(markers):
    from ep_trace.parsers.kineto_collectives import FILE, _group_ids

    df = pl.DataFrame(
        [(f, pid, tid, s, s + d) for f, pid, tid, s, d in markers],
        schema={FILE: pl.Int32, "pid": pl.Int64, "tid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64},
        orient="row",
    ).sort([FILE, "pid", "tid", "start_ns", "end_ns"], descending=[False, False, False, False, True], nulls_last=True)
    assert _group_ids(df).to_list() == _marker_rule(df.rows())
