"""Trace directories: dispatch, merge checks, sidecars (demo gloo traces), Parquet, cache and CLI."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest

from ep_trace.cli import main
from ep_trace.errors import BadInputError, NothingToAnalyzeError, RankConflictError, TraceFormatError
from ep_trace.parsers import dispatch, ingest, load_trace_dir, read_parquet, read_sidecar, read_trace_dir, write_parquet
from ep_trace.parsers.dispatch import detect_format


@pytest.fixture(scope="module")
def balanced(samples_dir) -> Path:
    d = samples_dir / "balanced"
    if not (d / "rank0.ep.jsonl").exists():
        pytest.skip("sample_traces/balanced not generated yet (ep-trace demo)")
    return d


@pytest.fixture(scope="module")
def balanced_tables(balanced):
    return read_trace_dir(balanced)


def _sidecar_records(path: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == kind]


@pytest.mark.parametrize("name", ["balanced", "skewed_straggler", "chunked_overlap", "backward"])
def test_demo_splits_equal_the_sidecar(samples_dir, name):
    balanced = samples_dir / name
    if not (balanced / "rank0.ep.jsonl").exists():
        pytest.skip(f"sample_traces/{name} not generated yet (ep-trace demo)")
    t = read_trace_dir(balanced)
    assert t.ranks["rank"].to_list() == [0, 1, 2, 3]
    assert t.ranks["has_sidecar"].all() and t.ranks["job_id"].n_unique() == 1 and set(t.ranks["backend"]) == {"gloo"}
    for r in range(4):
        # records are written as calls complete (async chunks finish out of order): issue order = (step, call)
        a2a = sorted(_sidecar_records(balanced / f"rank{r}.ep.jsonl", "a2a"), key=lambda a: (a["step"], a["call"]))
        c = t.collectives.filter((pl.col("rank") == r) & pl.col("collective").str.starts_with("all_to_all")).sort(
            "coll_id"
        )
        assert c.height == len(a2a) and set(c["splits_source"]) == {"concrete_inputs"}  # parsed from the trace itself
        assert c["in_splits"].to_list() == [a["send_splits"] for a in a2a]
        assert c["out_splits"].to_list() == [a["recv_splits"] for a in a2a]
        assert c["direction"].to_list() == [a["direction"] for a in a2a]
        assert c["layer"].to_list() == [a["layer"] for a in a2a]
        assert c.filter(pl.col("direction") != "count")["n_kernels"].min() == 1  # each call got its gloo worker range
        tok = c.filter(pl.col("direction") != "count")
        assert tok["row_bytes"].to_list() == [a["row_bytes"] for a in a2a if a["direction"] != "count"]
        assert set(c["n_kernels"]) == {1} and c["group_ranks"].to_list() == [[0, 1, 2, 3]] * c.height


def test_demo_routing_tables(balanced, balanced_tables):
    t = balanced_tables
    meta = _sidecar_records(balanced / "rank0.ep.jsonl", "meta")
    E = next(m["num_experts"] for m in meta if m.get("num_experts"))
    routing = [r for k in range(4) for r in _sidecar_records(balanced / f"rank{k}.ep.jsonl", "routing")]
    assert t.routing_counts.height == len(routing) * E
    assert t.routing_counts["count"].sum() == sum(sum(r["expert_counts"]) for r in routing)
    assert t.placement.height == E and set(t.routing_matrix["source"]) == {"sidecar"}
    disp = t.routing_matrix.filter(pl.col("direction") == "dispatch")
    a2a = [
        a
        for k in range(4)
        for a in _sidecar_records(balanced / f"rank{k}.ep.jsonl", "a2a")
        if a["direction"] == "dispatch"
    ]
    assert disp["rows"].sum() == sum(sum(a["send_splits"]) for a in a2a)


@pytest.mark.parametrize("clock_skew_ns", [0, 3600 * 10**9])
def test_sidecar_replaces_truncated_splits(tmp_path, kt, clock_skew_ns):
    send = list(range(1, 41))
    trunc = "[" + ", ".join(map(str, send[:30])) + ", ...]"
    meta = {
        "Collective name": "all_to_allv",
        "dtype": "Float",
        "In msg nelems": sum(send) * 4,
        "Group size": 40,
        "In split size": trunc,
        "Out split size": trunc,
        "Process Group Name": "1",
        "Process Group Ranks": trunc,
    }
    kt.write_trace(tmp_path / "rank0.pt.trace.json", kt.nccl_call(10, 10, 500, meta), world_size=40)
    start = kt.BASE + 5_000 + clock_skew_ns  # skewed by an hour: no window matches, paired by order
    lines = [
        {"type": "meta", "v": 1, "rank": 0, "world_size": 40, "job_id": "j"},
        {
            "type": "a2a",
            "v": 1,
            "step": 0,
            "layer": 2,
            "microbatch": 0,
            "direction": "dispatch",
            "call": 0,
            "send_splits": send,
            "recv_splits": send[::-1],
            "row_bytes": 16,
            "group_ranks": list(range(40)),
            "start_ns": start,
            "end_ns": start + 10**6,
        },
    ]
    (tmp_path / "rank0.ep.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    c = read_trace_dir(tmp_path).collectives.row(0, named=True)
    assert (c["splits_source"], c["splits_truncated"], c["in_splits"], c["out_splits"]) == (
        "sidecar",
        False,
        send,
        send[::-1],
    )
    assert (c["layer"], c["direction"], c["row_bytes"], c["group_ranks"]) == (2, "dispatch", 16, list(range(40)))


def test_sidecar_errors_and_warnings(tmp_path, kt):
    kt.write_trace(tmp_path / "rank0.pt.trace.json", [kt.x("cpu_op", "a", 1, 1)])
    ok = {"type": "meta", "v": 1, "rank": 0, "world_size": 2}
    sc = tmp_path / "rank0.ep.jsonl"
    sc.write_text(json.dumps(ok) + '\n{"type": "routing", "v": 1, "step": 0, "lay')
    assert [i.level for i in read_sidecar(sc).issues] == ["warning"]
    sc.write_text(json.dumps(ok) + "\n{oops\n" + json.dumps(ok) + "\n")
    with pytest.raises(TraceFormatError, match=r"rank0.ep.jsonl: line 2: malformed JSON"):
        read_trace_dir(tmp_path)
    sc.write_text(json.dumps(dict(ok, v=9)) + "\n")
    with pytest.raises(TraceFormatError, match="version 9 is newer"):
        read_sidecar(sc)
    sc.write_text(json.dumps(ok) + "\n")
    (tmp_path / "rank1.ep.jsonl").write_text(json.dumps(dict(ok, rank=1)) + "\n")
    t = read_trace_dir(tmp_path)
    # the sidecar without a trace, and rank 1 of world size 2 without a trace file (issue 40)
    assert [(i.rank, i.level) for i in t.load_report] == [(1, "warning"), (1, "warning")]


def test_conflicts_name_the_files(tmp_path, kt):
    a = kt.write_trace(tmp_path / "a.json", [kt.x("cpu_op", "a", 1, 1)], rank=0, world_size=2)
    b = kt.write_trace(tmp_path / "b.json", [kt.x("cpu_op", "a", 1, 1)], rank=0, world_size=2)
    with pytest.raises(RankConflictError, match=f"rank 0 appears in two files: {a} and {b}"):
        read_trace_dir(tmp_path)
    kt.write_trace(b, [kt.x("cpu_op", "a", 1, 1)], rank=1, world_size=4)
    with pytest.raises(RankConflictError, match="world sizes differ"):
        read_trace_dir(tmp_path)
    kt.write_trace(b, [kt.x("cpu_op", "a", 1, 1)], rank=1, world_size=2, extra={"ep_trace": {"job_id": "x"}})
    kt.write_trace(a, [kt.x("cpu_op", "a", 1, 1)], rank=0, world_size=2, extra={"ep_trace": {"job_id": "y"}})
    with pytest.raises(RankConflictError, match="job ids differ"):
        read_trace_dir(tmp_path)
    kt.write_trace(a, [kt.x("cpu_op", "a", 1, 1)], rank=5, world_size=2, extra={"ep_trace": {"job_id": "x"}})
    with pytest.raises(TraceFormatError, match="distributedInfo: 'rank' 5 is not below 'world_size' 2"):
        read_trace_dir(tmp_path)  # (refused per file since issue 40: --keep-going skips it)
    pg = lambda n: {
        "backend": "nccl",
        "rank": n,
        "world_size": 2,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1][:: 1 - 2 * n]}],
    }
    kt.write_trace(a, [kt.x("cpu_op", "a", 1, 1)], rank=None, extra={"distributedInfo": pg(0)})
    kt.write_trace(b, [kt.x("cpu_op", "a", 1, 1)], rank=None, extra={"distributedInfo": pg(1)})
    with pytest.raises(RankConflictError, match="default process groups differ"):
        read_trace_dir(tmp_path)


def test_skip_lists_unreadable_ranks(tmp_path, kt):
    kt.write_trace(tmp_path / "rank0.json", [kt.x("cpu_op", "a", 1, 1)], rank=0)
    (tmp_path / "rank1.pt.trace.json.gz").write_bytes(b"\x1f\x8bgarbage")
    with pytest.raises(TraceFormatError, match="rank1.pt.trace.json.gz: invalid or truncated gzip"):
        read_trace_dir(tmp_path)
    seen = []
    t = read_trace_dir(tmp_path, on_error="skip", progress=lambda s, d, n: seen.append((s, d, n)))
    assert t.ranks["rank"].to_list() == [0]
    issue, missing = t.load_report
    assert issue.level == "error" and issue.file.endswith("rank1.pt.trace.json.gz") and "skipped" in issue.message
    assert missing.message == "world size 2 but no trace file for 1 rank (1): every figure covers rank 0 only"
    assert issue.rank == 1
    assert seen[-1] == ("read", 2, 2)
    (tmp_path / "rank0.json").write_bytes(b"")  # now nothing is readable: an error, never an empty analysis
    with pytest.raises(BadInputError) as exc:
        read_trace_dir(tmp_path, on_error="skip")
    assert str(exc.value) == (
        f"{tmp_path}: no readable trace file (2 skipped); the first: {tmp_path / 'rank0.json'}: empty file; "
        "re-export the trace (torch.profiler export_chrome_trace) or remove the file"
    )


def test_detect_format(tmp_path):
    (tmp_path / "nsysdir").mkdir()
    (tmp_path / "nsysdir" / "StringIds.parquet").write_bytes(b"")
    names = {
        "rank0.pt.trace.json.gz": "kineto",
        "x.json": "kineto",
        "a.sqlite": "nsys",
        "a.nsys-rep": "nsys",
        "rank0.ep-events.parquet": "cupti",
        "rank3.ep.jsonl": "sidecar",
        "events.parquet": None,
        "load_report.json": None,
        ".hidden.json": None,
        "notes.txt": None,
    }
    for n, f in names.items():
        assert detect_format(tmp_path / n) == f, n
    assert detect_format(tmp_path / "nsysdir") == "nsys"
    (tmp_path / "empty").mkdir()
    with pytest.raises(NothingToAnalyzeError, match="empty: no trace files found"):  # exit code 1
        dispatch.discover(tmp_path / "empty")
    with pytest.raises(NothingToAnalyzeError, match="empty: no nsys files found"):
        dispatch.discover(tmp_path / "empty", "nsys")
    with pytest.raises(
        TraceFormatError, match="notes.txt: no trace files found"
    ):  # a file of no trace format: bad input
        (tmp_path / "notes.txt").write_text("x")
        dispatch.discover(tmp_path / "notes.txt")
    with pytest.raises(TraceFormatError, match="missing: no such file or directory"):
        dispatch.discover(tmp_path / "missing")


def test_parquet_round_trip_and_ingest_cache(balanced, tmp_path, monkeypatch):
    src = tmp_path / "in"
    shutil.copytree(balanced, src)
    out = tmp_path / "out"
    t, cached = ingest(src, out)
    tables = ("ranks", "events", "collectives", "routing_counts", "routing_matrix", "placement", "stages")
    assert not cached and sorted(p.name for p in out.iterdir()) == sorted(
        [*tables, "load_report.json", "manifest.json"]
    )
    # one partition per batch of rank files (the 4 small demo ranks are one batch); empty tables have none
    assert [p.name for p in (out / "events").iterdir()] == ["part-000000.parquet"]
    assert not any((out / "stages").iterdir())
    back = read_parquet(out)
    for name in ("ranks", "events", "collectives", "routing_counts", "routing_matrix", "placement"):
        assert back.table(name).equals(t.table(name)), name
    import duckdb
    import pandas as pd

    assert duckdb.sql(f"select count(*) from '{out}/events/*.parquet'").fetchall()[0][0] == t.events.height
    assert (
        pd.read_parquet(out / "collectives")["in_splits"].dropna().map(len).sum()
        == t.collectives["in_splits"].list.len().sum()
    )
    # kind is a polars Enum (dictionary-encoded in Parquet): other readers see plain text values
    n_ops = t.events.filter(pl.col("kind") == "cpu_op").height
    assert (
        n_ops
        and duckdb.sql(f"select count(*) from '{out}/events/*.parquet' where kind = 'cpu_op'").fetchall()[0][0] == n_ops
    )
    assert (pd.read_parquet(out / "events", columns=["kind"])["kind"].astype(str) == "cpu_op").sum() == n_ops
    n_ua = t.events.filter(pl.col("category") == "user_annotation").height  # category is Categorical
    assert (
        n_ua
        and duckdb.sql(f"select count(*) from '{out}/events/*.parquet' where category = 'user_annotation'").fetchall()[
            0
        ][0]
        == n_ua
    )
    # a directory written before kind / category were Enum / Categorical (schema version 1) still reads
    old = tmp_path / "old"
    shutil.copytree(out, old)
    for name in ("ranks", "events", "collectives", "routing_counts", "routing_matrix", "placement", "stages"):
        (old / name).rename(old / "_d")
        parts = sorted((old / "_d").glob("*.parquet"))
        df = pl.concat([pl.read_parquet(f) for f in parts]) if parts else t.table(name).clear()
        if name == "events":
            df = df.with_columns(pl.col("kind", "category").cast(pl.Utf8))
        df.write_parquet(old / f"{name}.parquet")  # the layout before partitions: one file per table
        shutil.rmtree(old / "_d")
    assert read_parquet(old).events.equals(t.events)
    monkeypatch.setattr(dispatch, "read_trace_dir", lambda *a, **k: pytest.fail("parsed although unchanged"))
    t2, cached = ingest(src, out)
    assert cached and t2.events.equals(t.events)
    monkeypatch.undo()
    f = src / "rank2.pt.trace.json.gz"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert ingest(src, out)[1] is False
    cache = tmp_path / "cache"
    a = load_trace_dir(src, cache_dir=cache)
    assert len(list(cache.iterdir())) == 1 and load_trace_dir(src, cache_dir=cache).collectives.equals(a.collectives)


def test_write_parquet_keeps_load_report(tmp_path, kt):
    kt.write_trace(tmp_path / "in" / "rank_4.json", [kt.x("cpu_op", "a", 1, 1)], rank=None) if (
        tmp_path / "in"
    ).mkdir() is None else None
    t = read_trace_dir(tmp_path / "in")
    write_parquet(t, tmp_path / "o")
    assert read_parquet(tmp_path / "o").load_report == t.load_report and t.load_report[0].rank == 4


def test_cli_ingest(tmp_path, kt, capsys):
    kt.write_trace(tmp_path / "in" / "rank0.json", [kt.x("cpu_op", "a", 1, 1)], rank=0) if (
        tmp_path / "in"
    ).mkdir() is None else None
    assert main(["ingest", str(tmp_path / "in"), "-o", str(tmp_path / "o")]) == 0
    assert "1 ranks, 1 events" in capsys.readouterr().out
    (tmp_path / "in" / "rank1.json").write_bytes(b"")
    assert main(["ingest", str(tmp_path / "in"), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "rank1.json: empty file" in err
    assert main(["ingest", str(tmp_path / "in"), "-o", str(tmp_path / "o"), "--keep-going"]) == 0
    report = json.loads((tmp_path / "o" / "load_report.json").read_text())
    assert [(r["level"], Path(r["file"]).name) for r in report] == [("error", "rank1.json"), ("warning", "in")]
    assert main(["ingest", str(tmp_path / "in"), "-o", str(tmp_path / "o"), "--format", "xml"]) == 2


def test_process_pool_gives_the_same_tables_and_errors(external_dir, tmp_path, kt):
    d = external_dir / "kineto" / "hta_torchrec_pair"
    one, two = read_trace_dir(d), read_trace_dir(d, jobs=2)
    for name in ("ranks", "events", "collectives", "routing_matrix"):
        assert two.table(name).equals(one.table(name)), name
    kt.write_trace(tmp_path / "rank0.json", [kt.x("cpu_op", "a", 1, 1), kt.x("cpu_op", "b", 2, -1)], rank=0)
    kt.write_trace(tmp_path / "rank1.json", [kt.x("cpu_op", "a", 1, 1)], rank=1)
    with pytest.raises(TraceFormatError) as ei:
        read_trace_dir(tmp_path, jobs=2)
    assert (
        str(ei.value)
        == f"{tmp_path / 'rank0.json'}: traceEvents[1]: negative duration (dur=-1.0); the trace is corrupt; re-export it"
    )
    t = read_trace_dir(tmp_path, jobs=2, on_error="skip")
    assert t.ranks["rank"].to_list() == [1]
    assert [(i.rank, i.level) for i in t.load_report] == [(0, "error"), (0, "warning")]  # skipped, then missing


def test_merge_of_cached_directories_keeps_the_events_on_disk(tmp_path, samples_dir):
    import shutil
    from functools import partial

    from ep_trace.parsers import load_trace_dir, read_trace_dirs

    dirs = []
    for name, ranks in (("node0", (0, 1)), ("node1", (2, 3))):
        d = tmp_path / name
        d.mkdir()
        for r in ranks:
            for suffix in ("pt.trace.json.gz", "ep.jsonl"):
                shutil.copy(samples_dir / "balanced" / f"rank{r}.{suffix}", d)
        dirs.append(d)
    merged = read_trace_dirs(dirs, reader=partial(load_trace_dir, cache_dir=tmp_path / "cache"))
    eager = read_trace_dirs(dirs)
    assert merged.events_scan is not None and merged.events.height == 0
    assert merged.table("events").equals(eager.events)
    assert merged.ranks.equals(eager.ranks) and merged.collectives.equals(eager.collectives)
