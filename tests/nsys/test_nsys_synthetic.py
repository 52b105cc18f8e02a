"""Synthetic nsys exports with exact answers: schema variants, projection edge cases, ranks, bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from ep_trace.errors import ConfigError, MissingDependencyError, TraceFormatError
from ep_trace.parsers.nsys import read_nsys

T0 = 1_700_000_000_000_000_000  # SESSION_START in conftest
PID, PID2 = 144, 145


def gtid(pid: int, tid: int | None = None, vm: int = 1) -> int:
    """Serialized globalTid: <hw:8><vm:8><pid:24><tid:24>."""
    return (vm << 48) | (pid << 24) | (pid if tid is None else tid)


def gpid(pid: int, vm: int = 1) -> int:
    return (vm << 48) | (pid << 24)


STRINGS = {
    1: "gemm_kernel",
    2: "ncclDevKernel_SendRecv",
    3: "cudaLaunchKernel_v7000",
    4: "cuLaunchKernelEx",
    5: "ncclGroupStart",
    6: "ncclSend",
    7: "ncclRecv",
    8: "ncclGroupEnd",
    9: "NCCL",
    10: "MPI Rank 5",
}
MAIN, OTHER = gtid(PID), gtid(PID, PID + 7)

# Projection case on thread MAIN: outer A [100, 1000] > inner B [200, 500]; C [600, 700] is
# straddled by launch L2 [650, 720]; D (start/end) [750, 900] ends on OTHER; E is open (end NULL).
NVTX = [
    (100, 1000, 59, "A", MAIN, None, None, 0),
    (200, 500, 59, "B, op_id = 17", MAIN, None, None, 0),
    (600, 700, 59, "C", MAIN, None, None, 0),
    (750, 900, 60, "D", MAIN, OTHER, None, 0),
    (950, None, 59, "E", MAIN, None, None, 0),
]
RUNTIME = [
    (300, 310, 0, MAIN, 1, 3),  # L1 inside B (and A)
    (650, 720, 0, MAIN, 2, 3),  # L2 straddles C's end -> only A
    (800, 810, 0, MAIN, 3, 3),  # L3 inside A and D (D ends on another thread -> skipped)
    (400, 410, 0, OTHER, 4, 3),  # L4 on another thread: no range
    (960, 970, 0, MAIN, 5, 3),  # L5 inside the open range E
    (300, 310, 67, MAIN, 1, 3),  # backtrace duplicate of L1 (schema 2.9.1): must not double the join
]
KERNELS = [
    (2000, 2100, 0, 7, 1, gpid(PID), 1),
    (2200, 2300, 0, 7, 2, gpid(PID), 1),
    (2400, 2500, 0, 7, 3, gpid(PID), 1),
    (2600, 2700, 0, 7, 4, gpid(PID), 1),
    (2800, 2900, 0, 7, 5, gpid(PID), 1),
    (3000, 3100, 0, 8, 99, gpid(PID), 1),  # no launch row
]


def _ev(tt, kind: str) -> pl.DataFrame:
    return tt.events.filter(pl.col("kind") == kind)


@pytest.mark.parametrize("style", ["2.9", "3.x"])
def test_projection_edge_cases(make_export, style: str) -> None:
    path = make_export(strings=STRINGS, kernels=KERNELS, runtime=RUNTIME, nvtx=NVTX, style=style)
    tt = read_nsys(path)
    ev = tt.events
    names = dict(zip(ev["event_id"].to_list(), ev["name"].to_list(), strict=False))
    k = _ev(tt, "gpu_kernel").sort("start_ns")
    assert k["start_ns"].to_list() == [T0 + s for s in (2000, 2200, 2400, 2600, 2800, 3000)]
    assert [names.get(i) for i in k["op_id"].to_list()] == ["B", "A", "A", None, "E", None]
    # launch_id -> the runtime row with the same correlation (one row each: eventClass 67 dropped)
    rt = _ev(tt, "runtime")
    assert rt.height == 5
    launch_start = dict(zip(rt["event_id"].to_list(), rt["start_ns"].to_list(), strict=False))
    assert [launch_start.get(i) for i in k["launch_id"].to_list()] == [T0 + s for s in (300, 650, 800, 400, 960)] + [
        None
    ]
    ann = _ev(tt, "gpu_annotation").sort("name")
    assert ann["name"].to_list() == ["A", "B", "E"]
    assert ann.select(pl.col("start_ns") - T0, pl.col("end_ns") - T0).rows() == [
        (2000, 2900),
        (2000, 2100),
        (2800, 2900),
    ]
    assert [names[i] for i in ann["op_id"].to_list()] == ["A", "B", "E"]
    cpu = _ev(tt, "cpu_annotation").sort("start_ns")
    assert cpu["name"].to_list() == ["A", "B", "C", "D", "E"]  # emit_nvtx suffix stripped
    assert cpu["end_ns"].to_list()[-1] == T0 + 3100  # open range ends at the end of the trace
    assert cpu["tid"].to_list() == [PID] * 5 and cpu["pid"].to_list() == [PID] * 5
    assert tt.ranks.select("rank", "device", "rank_source").rows() == [(0, "cuda:0", "assumed")]
    assert [i.message for i in tt.load_report] == [
        "rank assumed 0: no rank evidence in the file (looked for: --rank-map, MPI_RANKS / 'MPI Rank N' thread names, "
        "RANK / OMPI_COMM_WORLD_RANK / PMIX_RANK / PMI_RANK / SLURM_PROCID in the recorded environment, the NCCL init "
        "line in captured stdout, 'rank<N>' in the file name)",
        "1 of 6 GPU ops have no launching API call in the export (outside the capture / slice window): kept, with no stage attribution",
    ]


def test_colliding_correlation_ids_across_processes(make_export) -> None:
    kernels = [(2000, 2100, 0, 7, 1, gpid(PID), 1), (2050, 2300, 1, 7, 1, gpid(PID2), 1)]
    runtime = [(300, 310, 0, gtid(PID), 1, 3), (500, 520, 1, gtid(PID2), 1, 4)]
    tt = read_nsys(make_export(strings=STRINGS, kernels=kernels, runtime=runtime), rank_map={PID: 1, PID2: 0})
    k = (
        _ev(tt, "gpu_kernel")
        .join(
            _ev(tt, "runtime").select(
                "rank",
                pl.col("event_id").alias("launch_id"),
                pl.col("name").alias("api"),
                pl.col("pid").alias("api_pid"),
            ),
            on=["rank", "launch_id"],
            how="left",
        )
        .sort("rank")
    )
    assert k.select("rank", "pid", "api_pid", "api", "device").rows() == [
        (0, PID2, PID2, "cuLaunchKernelEx", 1),
        (1, PID, PID, "cudaLaunchKernel", 0),
    ]
    assert tt.ranks.select("rank", "rank_source").rows() == [(0, "rank_map"), (1, "rank_map")]
    assert "pid 144 (device 0) -> rank 1, pid 145 (device 1) -> rank 0" in tt.load_report[0].message


def test_multi_process_order_and_single_rank_conflict(make_export) -> None:
    kernels = [(2000, 2100, 1, 7, 1, gpid(PID), 1), (2050, 2300, 0, 7, 1, gpid(PID2), 1)]
    path = make_export(strings=STRINGS, kernels=kernels, runtime=[])
    tt = read_nsys(path)
    assert tt.ranks.select("rank", "device").rows() == [(0, "cuda:0"), (1, "cuda:1")]
    assert _ev(tt, "gpu_kernel").select("rank", "pid").sort("rank").rows() == [(0, PID2), (1, PID)]
    with pytest.raises(ConfigError, match=r"holds 2 GPU processes \(pids 145, 144\) but one rank was given"):
        read_nsys(path, rank=3)


def test_rank_sources(make_export) -> None:
    kw = dict(strings=STRINGS, kernels=KERNELS[:1], runtime=RUNTIME[:1])
    assert read_nsys(make_export("job_rank3.sqlite", **kw)).ranks.select("rank", "rank_source").row(0) == (
        3,
        "file_name",
    )
    assert read_nsys(make_export("a.sqlite", **kw), rank=7).ranks["rank"][0] == 7
    p = make_export("b_rank3.sqlite", **kw)
    assert read_nsys(p, rank_map={"b_rank3.sqlite": 9}).ranks.select("rank", "rank_source").row(0) == (9, "rank_map")
    named = make_export("c_rank3.sqlite", thread_names=[(10, MAIN)], **kw)
    assert read_nsys(named).ranks.select("rank", "rank_source").row(0) == (5, "nvtx")


def test_nccl_domain_and_group_collective(make_export) -> None:
    # One PyTorch-less NCCL group call: GroupStart, Send x2, Recv x2, GroupEnd (launch inside).
    t = gtid(PID)
    nvtx = [
        (10, 20, 59, None, t, None, 5, 1),
        (21, 30, 59, None, t, None, 6, 1),
        (31, 40, 59, None, t, None, 7, 1),
        (41, 50, 59, None, t, None, 6, 1),
        (51, 60, 59, None, t, None, 7, 1),
        (61, 90, 59, None, t, None, 8, 1),
        (100, 200, 59, "nccl:all_reduce", t, None, None, 0),
        (110, 190, 59, None, t, None, 8, 1),
        (300, 310, 59, None, t, None, 5, 1),
        (311, 320, 59, None, t, None, 6, 1),
        (321, 330, 59, None, t, None, 8, 1),
    ]
    runtime = [(70, 80, 1, t, 1, 4), (120, 130, 1, t, 2, 4), (322, 328, 1, t, 3, 4)]
    kernels = [
        (1000, 1500, 0, 9, 1, gpid(PID), 2),
        (1600, 1700, 0, 9, 2, gpid(PID), 2),
        (1800, 1900, 0, 9, 3, gpid(PID), 2),
    ]
    for style, domain in (("3.x", "NCCL"), ("2.9", "NCCL-created")):
        rows = list(nvtx)
        if style == "2.9":  # with a domain-create row (eventType 75) the recorded name wins
            rows.append((5, None, 75, "NCCL-created", t, None, None, 1))
        tt = read_nsys(
            make_export(
                f"nccl{style}.sqlite", strings=STRINGS, kernels=kernels, runtime=runtime, nvtx=rows, style=style
            )
        )
        cpu = _ev(tt, "cpu_annotation")
        assert cpu.group_by("domain").len().sort("domain", nulls_last=True).rows() == [(domain, 10), (None, 1)]
        c = tt.collectives.sort("coll_id")
        assert c.select("collective", "op_name", "backend", "group_size", "n_kernels", "splits_source").rows() == [
            ("unknown", "ncclGroupEnd", "nccl", None, 1, None),
            ("allreduce", "nccl:all_reduce", "nccl", None, 1, None),
            ("send", "ncclGroupEnd", "nccl", None, 1, None),
        ]
        assert c.select(pl.col("start_ns") - T0, pl.col("end_ns") - T0, pl.col("cpu_start_ns") - T0).rows() == [
            (1000, 1500, 61),
            (1600, 1700, 100),
            (1800, 1900, 321),
        ]
        assert _ev(tt, "gpu_kernel").sort("start_ns")["coll_id"].to_list() == [0, 1, 2]
        assert tt.ranks["backend"].to_list() == ["nccl"]


def test_optional_tables_absent_and_no_session_start(make_export) -> None:
    tt = read_nsys(make_export(strings=STRINGS, kernels=KERNELS[:2], runtime=None, nvtx=None, session_start=None))
    k = _ev(tt, "gpu_kernel")
    assert k["start_ns"].to_list() == [2000, 2200]  # capture-relative: no session start to add
    assert k["launch_id"].null_count() == 2
    assert tt.events.height == 2 and tt.collectives.height == 0
    assert tt.load_report[0].message.startswith("no TARGET_INFO_SESSION_START_TIME: times are capture-relative")


def test_memcpy_bytes_and_names(make_export) -> None:
    memcpy = [(500, 600, 0, 7, 11, gpid(PID), 4096, 1), (700, 800, 0, 7, 12, gpid(PID), 64, 10)]
    tt = read_nsys(make_export(strings=STRINGS, kernels=[], memcpy=memcpy, runtime=[(100, 110, 0, MAIN, 11, 3)]))
    m = _ev(tt, "gpu_memcpy").sort("start_ns")
    assert m.select("name", "bytes", "device", "stream").rows() == [
        ("Memcpy HtoD", 4096, 0, 7),
        ("Memcpy PtoP", 64, 0, 7),
    ]
    assert m["launch_id"].null_count() == 1


def test_cpu_only_export_warns(make_export) -> None:
    tt = read_nsys(make_export(strings=STRINGS, kernels=None, runtime=RUNTIME[:2], nvtx=NVTX[:2]))
    assert tt.events.group_by("kind").len().sort("kind").rows() == [("cpu_annotation", 2), ("runtime", 2)]
    assert tt.ranks.select("rank", "device").rows() == [(0, None)]
    assert tt.load_report[0].message.startswith("no GPU activity in the export")


def test_bad_inputs(tmp_path: Path, make_export, external_dir: Path, monkeypatch) -> None:
    txt = tmp_path / "notes.sqlite"
    txt.write_text("hello, not a database\n" * 10)
    with pytest.raises(TraceFormatError) as e:
        read_nsys(txt)
    assert (
        str(e.value)
        == f"{txt}: not a SQLite file; pass an nsys SQLite export (nsys export --type sqlite) or a .nsys-rep"
    )
    (tmp_path / "empty.sqlite").write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty.sqlite: an empty file;"):
        read_nsys(tmp_path / "empty.sqlite")
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes((external_dir / "nsys/nsys_ai_2gpu/mock.sqlite").read_bytes()[:200_000])
    with pytest.raises(TraceFormatError) as e:
        read_nsys(cut)
    assert str(e.value) == f"{cut}: SQLite file is truncated (200000 of 372736 bytes); copy or export the file again"
    import sqlite3

    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE t (a)")
    with pytest.raises(TraceFormatError, match=r"other.sqlite: not an Nsight Systems export"):
        read_nsys(other)
    with pytest.raises(TraceFormatError, match="holds no CUDA activity, CUDA API calls or NVTX ranges"):
        read_nsys(make_export("nothing.sqlite", strings=STRINGS, kernels=[], runtime=[], nvtx=[]))
    rep = tmp_path / "job.nsys-rep"
    rep.write_bytes(b"\0" * 16)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert shutil.which("nsys") is None
    with pytest.raises(MissingDependencyError) as e:
        read_nsys(rep)
    assert str(e.value).endswith(
        f"export it yourself with: nsys export --type sqlite --output {tmp_path / 'job.sqlite'} {rep}"
    )
    assert e.value.exit_code == 2


def test_nsys_rep_uses_nsys_export_once(tmp_path: Path, make_export, monkeypatch) -> None:
    # A stand-in 'nsys' that copies a prepared SQLite file to --output and counts its calls.
    src = make_export("prepared.sqlite", strings=STRINGS, kernels=KERNELS[:1], runtime=RUNTIME[:1])
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"
    (bindir / "nsys").write_text(
        f'#!/bin/sh\necho "$@" >> {log}\nwhile [ "$1" != "--output" ]; do shift; done\ncp {src} "$2"\n'
    )
    (bindir / "nsys").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    rep = tmp_path / "rank2.nsys-rep"
    rep.write_bytes(b"rep")
    for _ in range(2):
        tt = read_nsys(rep, cache_dir=tmp_path / "cache")
        assert _ev(tt, "gpu_kernel").height == 1 and tt.ranks["rank"].to_list() == [2]
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("export --type sqlite --force-overwrite true --output ")


def test_ts_normalize_and_ts_shift(make_export) -> None:
    # --ts-normalize: timestamps are already UTC epoch ns (no session start added); --ts-shift X is taken out.
    norm = make_export(
        "norm.sqlite",
        strings=STRINGS,
        kernels=[(T0 + 5, T0 + 9, 0, 7, 1, gpid(PID), 1)],
        meta={"EXPORT_PARAM_TIME_NORMALIZE": "true"},
    )
    assert _ev(read_nsys(norm), "gpu_kernel")["start_ns"].to_list() == [T0 + 5]
    shifted = make_export(
        "shift.sqlite",
        strings=STRINGS,
        kernels=[(1005, 1009, 0, 7, 1, gpid(PID), 1)],
        meta={"EXPORT_PARAM_TIME_SHIFT": "1000"},
    )
    assert _ev(read_nsys(shifted), "gpu_kernel")["start_ns"].to_list() == [T0 + 5]


def test_enclosing_pairs_split_threads_when_keys_overflow() -> None:
    from ep_trace.parsers.nsys_project import enclosing_pairs

    big = 2**61  # capture span x 3 threads no longer fits int64 keys: threads are processed in chunks
    ops = pl.DataFrame({"_uid": [0, 1, 2], "_gtid": [10, 11, 12], "_ls": [5, big - 10, 7], "_le": [6, big - 5, 8]})
    ranges = pl.DataFrame(
        {
            "_uid": [100, 101, 102, 103],
            "_gtid": [10, 11, 11, 12],
            "_rs": [0, 0, big - 11, 9],
            "_re": [big, big, big - 4, 20],
        }
    )
    got = enclosing_pairs(ops, ranges).sort("_op", "_range")
    assert got.select("_op", "_range").rows() == [(0, 100), (1, 101), (1, 102)]


def test_nsys_rep_in_unwritable_folder_exports_to_tempdir(tmp_path: Path, make_export, monkeypatch) -> None:
    import tempfile

    src = make_export("prepared.sqlite", strings=STRINGS, kernels=KERNELS[:2], runtime=RUNTIME[:2])
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nsys").write_text(f'#!/bin/sh\nwhile [ "$1" != "--output" ]; do shift; done\ncp {src} "$2"\n')
    (bindir / "nsys").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    rep = tmp_path / "job.nsys-rep"
    rep.write_bytes(b"rep")
    tt = read_nsys(rep, cache_dir=blocker / "cache")
    assert _ev(tt, "gpu_kernel").height == 2
    assert [p.parent.name for p in (tmp_path / "tmp").rglob("*.sqlite")] == ["ep-trace-nsys-cache"]


def test_ep_stage_ranges_and_steps_reach_the_analysis(make_export, tmp_path: Path) -> None:
    """ep-trace stage() NVTX names + ProfilerStep ranges in an nsys export -> analysis stages."""
    from ep_trace.analysis import analyze
    from ep_trace.parsers.dispatch import read_trace_dir

    t = gtid(PID)
    strings = {**STRINGS, 11: "ncclDevKernel_SendRecv", 12: "sm90_gemm"}
    nvtx = [
        (0, 10_000, 59, "ProfilerStep#3", t, None, None, 0),
        (100, 2_000, 59, "ep:dispatch:l0:fwd", t, None, None, 0),
        (150, 1_900, 59, "nccl:all_to_all", t, None, None, 0),
        (2_100, 4_000, 59, "ep:expert:l0:fwd", t, None, None, 0),
    ]
    runtime = [(200, 220, 1, t, 1, 4), (2_200, 2_210, 0, t, 2, 3), (2_300, 2_310, 0, t, 3, 3)]
    kernels = [
        (5_000, 6_000, 0, 7, 1, gpid(PID), 11),
        (6_100, 6_500, 0, 7, 2, gpid(PID), 12),
        (6_600, 7_000, 0, 7, 3, gpid(PID), 12),
    ]
    folder = tmp_path / "run"
    folder.mkdir()
    make_export("run/rank0.sqlite", strings=strings, kernels=kernels, runtime=runtime, nvtx=nvtx)
    tables = read_trace_dir(folder)
    ev = tables.events
    # kind is an Enum: it sorts in EVENT_KINDS order (gpu_annotation before cpu_annotation)
    assert ev.filter(pl.col("seq").is_not_null()).select("kind", "seq").sort("kind").rows() == [
        ("gpu_annotation", 3),
        ("cpu_annotation", 3),
    ]
    assert tables.collectives.select("collective", "op_name", "n_kernels").rows() == [
        ("all_to_all", "nccl:all_to_all", 1)
    ]
    st = analyze(tables).stages.sort("stage")
    assert st.select("step", "layer", "phase", "stage", "method").rows() == [
        (3, 0, "fwd", "dispatch", "ep_trace"),
        (3, 0, "fwd", "expert", "ep_trace"),
    ]
    assert st.select(pl.col("start_ns") - T0, pl.col("end_ns") - T0, "busy_ns").rows() == [
        (5_000, 6_000, 1_000),
        (6_100, 7_000, 800),
    ]


def test_partial_rank_map_names_the_missing_pid(make_export) -> None:
    kernels = [(2000, 2100, 0, 7, 1, gpid(PID), 1), (2050, 2300, 1, 7, 1, gpid(PID2), 1)]
    path = make_export(strings=STRINGS, kernels=kernels, runtime=[])
    with pytest.raises(ConfigError) as e:
        read_nsys(path, rank_map={str(PID): 0})
    assert str(e.value) == f"--rank-map: {path} holds GPU processes 144, 145; no rank given for pid 145"
    with pytest.raises(ConfigError, match="rank 0 is given to two processes"):
        read_nsys(path, rank_map={PID: 0, PID2: 0})


def test_trtllm_forward_step_ranges_are_the_steps_of_an_nsys_export(make_export, tmp_path: Path) -> None:
    """A serving engine's NVTX iteration ranges (TensorRT-LLM ``_forward_step``), no ProfilerStep."""
    from ep_trace.analysis import analyze
    from ep_trace.parsers.dispatch import read_trace_dir

    t = gtid(PID)
    strings = {**STRINGS, 12: "sm90_gemm"}
    nvtx = [(0, 4_000, 59, "_forward_step", t, None, None, 0), (5_000, 7_000, 59, "_forward_step", t, None, None, 0)]
    runtime = [(100, 110, 0, t, 1, 3), (5_100, 5_110, 0, t, 2, 3)]
    kernels = [(1_000, 3_000, 0, 7, 1, gpid(PID), 12), (5_500, 6_500, 0, 7, 2, gpid(PID), 12)]
    folder = tmp_path / "run"
    folder.mkdir()
    make_export("run/rank0.sqlite", strings=strings, kernels=kernels, runtime=runtime, nvtx=nvtx)
    tables = read_trace_dir(folder)
    steps = tables.events.filter(pl.col("seq").is_not_null() & (pl.col("kind") == "cpu_annotation"))
    assert steps.sort("start_ns")["seq"].to_list() == [1, 2]
    a = analyze(tables)
    assert a.steps.sort("step").select("step", "step_time_ns").rows() == [(1, 4_000), (2, 2_000)]
    assert any("serving engine's iterations" in n for n in a.notes)
