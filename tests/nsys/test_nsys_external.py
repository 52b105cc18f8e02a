"""read_nsys on every real export in ../shared/external/nsys/, checked against plain SQL counts."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import polars as pl
import pytest

from ep_trace.parsers.nsys import read_nsys
from ep_trace.schema import TraceTables

FILES = [
    "flameox/nsight-2025.5.2.sqlite",
    "nsys_ai_2gpu/mfu_2gpu_before.sqlite",
    "nsys_ai_2gpu/mock.sqlite",
    "pipit_saxpy/saxpy-mpi-cuda_nsys_perlmutter0.sqlite",
]
GPU_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
)
_cache: dict[str, TraceTables] = {}


def _read(path: Path) -> TraceTables:
    if str(path) not in _cache:
        _cache[str(path)] = read_nsys(path)
    return _cache[str(path)]


def _sql(path: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def _tables(path: Path) -> set[str]:
    return {r[0] for r in _sql(path, "SELECT name FROM sqlite_master WHERE type='table'")}


def _count(path: Path, query: str) -> int:
    return int(_sql(path, query)[0][0])


@pytest.mark.parametrize("rel", FILES)
def test_counts_match_plain_sql(external_dir: Path, rel: str) -> None:
    path = external_dir / "nsys" / rel
    tt = _read(path)
    ev = tt.events
    tables = _tables(path)
    kinds = dict(ev.group_by("kind").len().rows())

    n_kernels = _count(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    assert ev.filter(pl.col("category") == "CUPTI_ACTIVITY_KIND_KERNEL").height == n_kernels
    n_graph = (
        _count(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
        if "CUPTI_ACTIVITY_KIND_GRAPH_TRACE" in tables
        else 0
    )
    assert kinds.get("gpu_kernel", 0) == n_kernels + n_graph
    for table, kind in (("CUPTI_ACTIVITY_KIND_MEMCPY", "gpu_memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "gpu_memset")):
        n = _count(path, f"SELECT count(*) FROM {table}") if table in tables else 0
        assert kinds.get(kind, 0) == n
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        assert ev.filter(pl.col("kind") == "gpu_memcpy")["bytes"].sum() == _count(
            path, "SELECT coalesce(sum(bytes), 0) FROM CUPTI_ACTIVITY_KIND_MEMCPY"
        )
    n_rt = _count(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass IN (0, 1)")
    assert kinds.get("runtime", 0) == n_rt

    n_nccl = _count(
        path,
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
        "WHERE s.value LIKE 'nccl%Kernel%'",
    )
    assert ev.filter(pl.col("coll_id").is_not_null()).height == n_nccl
    assert int(tt.collectives["n_kernels"].sum() or 0) == n_nccl

    n_ranges = (
        _count(path, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60, 70, 71)")
        if "NVTX_EVENTS" in tables
        else 0
    )
    assert kinds.get("cpu_annotation", 0) == n_ranges

    gpu_union = " UNION ALL ".join(f"SELECT globalPid, deviceId, streamId FROM {t}" for t in GPU_TABLES if t in tables)
    assert tt.ranks.height == _count(path, f"SELECT count(DISTINCT globalPid) FROM ({gpu_union})")
    gpu_ev = ev.filter(pl.col("kind").is_in(["gpu_kernel", "gpu_memcpy", "gpu_memset"]))
    assert gpu_ev["device"].n_unique() == _count(path, f"SELECT count(DISTINCT deviceId) FROM ({gpu_union})")
    assert gpu_ev.select("pid", "stream").n_unique() == _count(
        path, f"SELECT count(*) FROM (SELECT DISTINCT globalPid, streamId FROM ({gpu_union}))"
    )

    # Launch join on correlationId AND process, runtime/driver rows only.
    n_launched = _count(
        path,
        f"""
        SELECT count(*) FROM ({" UNION ALL ".join(f"SELECT correlationId, globalPid FROM {t}" for t in GPU_TABLES if t in tables)}) g
        WHERE EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = g.correlationId
                      AND r.eventClass IN (0, 1) AND r.globalTid - (r.globalTid & 16777215) = g.globalPid)""",
    )
    assert gpu_ev["launch_id"].is_not_null().sum() == n_launched

    t0 = _sql(path, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0][0]
    k_min = _count(path, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    assert ev.filter(pl.col("category") == "CUPTI_ACTIVITY_KIND_KERNEL")["start_ns"].min() == t0 + k_min
    assert tt.ranks["format"].to_list() == ["nsys"] * tt.ranks.height


def test_known_facts_mfu_2gpu(external_dir: Path) -> None:
    path = external_dir / "nsys/nsys_ai_2gpu/mfu_2gpu_before.sqlite"
    tt = _read(path)
    ev = tt.events
    assert tt.ranks.select("rank", "device", "rank_source", "host").rows() == [
        (0, "cuda:0", "process_order", "modal"),
        (1, "cuda:1", "process_order", "modal"),
    ]
    k = ev.filter(pl.col("kind") == "gpu_kernel")
    assert k.group_by("rank", "pid", "stream").len().sort("rank").rows() == [(0, 144, 7, 1993), (1, 145, 15, 2017)]
    assert k["launch_id"].is_not_null().sum() == 3986  # 4280 with a correlation-only join
    sr = k.filter(pl.col("name").str.starts_with("ncclDevKernel_SendRecv"))
    assert sr.height == 66 and sr["launch_id"].is_not_null().sum() == 64
    launches = ev.filter(pl.col("kind") == "runtime").select(
        "rank", pl.col("event_id").alias("launch_id"), pl.col("name").alias("api")
    )
    assert sr.join(launches, on=["rank", "launch_id"])["api"].unique().to_list() == ["cuLaunchKernelEx"]
    c = tt.collectives
    assert c.group_by("rank", "collective", "op_name", "group_size").len().sort("rank", "collective").rows() == [
        (0, "all_to_all", "nccl:all_to_all", 2, 32),
        (0, "unknown", "ncclDevKernel_SendRecv", None, 1),
        (1, "all_to_all", "nccl:all_to_all", 2, 32),
        (1, "unknown", "ncclDevKernel_SendRecv", None, 1),
    ]
    assert c["splits_source"].null_count() == c.height and c["in_splits"].null_count() == c.height
    # Innermost range of every launched SendRecv kernel is NCCL's ncclGroupEnd (domain 1, no domain row).
    names = ev.select(
        "rank", pl.col("event_id").alias("op_id"), pl.col("name").alias("op"), pl.col("domain").alias("op_domain")
    )
    inner = sr.filter(pl.col("launch_id").is_not_null()).join(names, on=["rank", "op_id"])
    assert inner.group_by("op", "op_domain").len().rows() == [("ncclGroupEnd", "NCCL", 64)]
    # Known answer: order-paired SendRecv kernels of the two ranks end within -8.8..+26.6 us
    # while their starts differ by up to 3.34 ms.
    ends = [sr.filter(pl.col("rank") == r).sort("start_ns") for r in (0, 1)]
    d_end = (ends[0]["end_ns"] - ends[1]["end_ns"]).to_list()
    d_start = (ends[1]["start_ns"] - ends[0]["start_ns"]).abs().max()
    assert (round(min(d_end) / 1e3, 1), round(max(d_end) / 1e3, 1)) == (-8.8, 26.6)
    assert round(d_start / 1e6, 2) == 3.34  # type: ignore[operator]
    assert (
        "2 GPU processes in one file, one rank each (process_order): pid 144 (device 0) -> rank 0, pid 145 (device 1) -> rank 1"
        in tt.load_report[0].message
    )


def test_projection_matches_sql(external_dir: Path) -> None:
    """Ranges with a projection = ranges on the launching thread that fully contain >= 1 GPU op's launch."""
    path = external_dir / "nsys/nsys_ai_2gpu/mfu_2gpu_before.sqlite"
    tt = _read(path)
    con = sqlite3.connect(":memory:")
    con.execute(f"ATTACH 'file:{path}?mode=ro' AS f")
    con.executescript("""
        CREATE TEMP TABLE rt AS SELECT * FROM f.CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass IN (0, 1);
        CREATE INDEX rt_c ON rt(correlationId);
        CREATE TEMP TABLE l AS SELECT r.globalTid AS tid, r.start AS ls, r."end" AS le, g.start AS gs, g."end" AS ge
          FROM (SELECT correlationId, globalPid, start, "end" FROM f.CUPTI_ACTIVITY_KIND_KERNEL
                UNION ALL SELECT correlationId, globalPid, start, "end" FROM f.CUPTI_ACTIVITY_KIND_MEMCPY
                UNION ALL SELECT correlationId, globalPid, start, "end" FROM f.CUPTI_ACTIVITY_KIND_MEMSET) g
          JOIN rt r ON r.correlationId = g.correlationId AND r.globalTid - (r.globalTid & 16777215) = g.globalPid;
        CREATE INDEX l_t ON l(tid, ls);
    """)
    rows = con.execute("""
        SELECT count(*), sum(gs_min), sum(ge_max) FROM (
          SELECT min(l.gs) AS gs_min, max(l.ge) AS ge_max FROM f.NVTX_EVENTS n
          JOIN l ON l.tid = n.globalTid AND l.ls >= n.start AND l.ls <= n."end" AND l.le <= n."end"
          WHERE n.eventType IN (59, 60) AND n."end" IS NOT NULL GROUP BY n.rowid)
    """).fetchone()
    con.close()
    ann = tt.events.filter(pl.col("kind") == "gpu_annotation")
    t0 = 1779782330176752435
    assert ann.height == rows[0] == 9621
    assert (ann["start_ns"] - t0).sum() == rows[1] and (ann["end_ns"] - t0).sum() == rows[2]


def test_oldest_schema_pipit(external_dir: Path) -> None:
    tt = _read(external_dir / "nsys/pipit_saxpy/saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    ev = tt.events
    assert tt.ranks.select("rank", "rank_source", "device", "host").rows() == [(0, "nvtx", "cuda:0", "nid001608")]
    cpu = ev.filter(pl.col("kind") == "cpu_annotation")
    assert cpu.group_by("domain", "name").len().sort("domain", "name", nulls_last=True).rows() == [
        ("MPI", "MPI_Finalize", 1),
        ("MPI", "MPI_Init", 1),
        ("MPI", "MPI_Recv", 5),
        ("MPI", "MPI_Send", 10),
        (None, "saxpy", 5),
    ]
    k = ev.filter(pl.col("kind") == "gpu_kernel")
    ops = ev.select(pl.col("event_id").alias("op_id"), pl.col("name").alias("op"))
    assert k.join(ops, on="op_id")["op"].to_list() == ["saxpy"] * 5
    ann = ev.filter(pl.col("kind") == "gpu_annotation").sort("start_ns")
    assert ann.select("start_ns", "end_ns").rows() == k.sort("start_ns").select("start_ns", "end_ns").rows()
    # eventClass 67 backtrace rows are dropped and API names lose their _v<N> suffix.
    assert ev.filter(pl.col("kind") == "runtime").height == 57
    assert ev.filter(pl.col("name") == "cudaLaunchKernel").height == 5


def test_flameox_graph_trace(external_dir: Path) -> None:
    tt = _read(external_dir / "nsys/flameox/nsight-2025.5.2.sqlite")
    k = tt.events.filter(pl.col("kind") == "gpu_kernel").sort("start_ns")
    assert k["name"].to_list() == ["add_one(const float *, float *, int)"] * 3 + ["CUDA graph (graphExecId=2)"] * 2
    assert k["launch_id"].is_not_null().sum() == 5
    assert any("whole-graph rows" in i.message for i in tt.load_report)


def test_parquetdir_roundtrip(external_dir: Path, tmp_path: Path) -> None:
    """A parquetdir export (one <TABLE>.parquet each, unsigned ids as nsys writes them) reads the same."""
    path = external_dir / "nsys/nsys_ai_2gpu/mfu_2gpu_before.sqlite"
    out = tmp_path / "mfu_pq"
    out.mkdir()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
        cur = con.execute(f'SELECT * FROM "{table}"')
        cols = [d[0] for d in cur.description]
        df = pl.DataFrame(cur.fetchall(), schema=cols, orient="row", infer_schema_length=None)
        unsigned = [c for c in ("globalTid", "globalPid", "endGlobalTid") if c in cols]
        df.with_columns(pl.col(unsigned).cast(pl.UInt64)).write_parquet(out / f"{table}.parquet")
    con.close()
    a, b = _read(path), read_nsys(out)
    assert b.events.equals(a.events)
    assert b.collectives.equals(a.collectives)
    assert b.ranks.drop("source_file").equals(a.ranks.drop("source_file"))
