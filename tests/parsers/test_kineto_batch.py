"""Reading Kineto files as a batch (``kineto_files.read_kineto_files``, one polars plan per batch) gives
exactly what reading each file alone gives: tables, job info, load report and errors."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from ep_trace.errors import EpTraceError
from ep_trace.parsers import read_pool
from ep_trace.parsers.read_pool import read_kineto_files, read_one

_TABLES = ("ranks", "events", "collectives", "routing_counts", "routing_matrix", "placement", "stages")


def _alone(paths: list[Path]) -> list[object]:
    out: list[object] = []
    for p in paths:
        try:
            out.append(read_one(p, "kineto", None))
        except EpTraceError as exc:
            out.append(exc)
    return out


def _assert_same(got: list[object], want: list[object]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, EpTraceError):
            assert isinstance(g, EpTraceError) and type(g) is type(w) and str(g) == str(w)
            continue
        assert isinstance(g, tuple), g
        (gt, gi), (wt, wi) = g, w  # type: ignore[misc]
        for name in _TABLES:
            assert_frame_equal(gt.table(name), wt.table(name))
        assert gt.load_report == wt.load_report
        assert gi == wi


def _real_files(external_dir: Path, samples_dir: Path) -> list[Path]:
    kin = external_dir / "kineto"
    return sorted(p for p in kin.rglob("*.json.gz")) + sorted(samples_dir.rglob("*.pt.trace.json.gz"))


def test_every_real_trace_in_one_batch_equals_each_file_alone(external_dir, samples_dir, monkeypatch):
    # all the real Kineto traces (2022 legacy NCCL, gloo workers, TorchRec, modern metadata, ours)
    from ep_trace.parsers import kineto_files

    paths = _real_files(external_dir, samples_dir)
    assert len(paths) >= 20
    want = _alone(paths)
    calls: list[int] = []
    real = kineto_files.finish_files
    monkeypatch.setattr(kineto_files, "finish_files", lambda files: calls.append(len(files)) or real(files))
    got = read_kineto_files(paths, None)
    assert calls == [len(paths)]  # one plan for all of them: no file fell back to its own
    _assert_same(got, want)


def test_batch_takes_the_batched_path(external_dir, monkeypatch):
    # the equality above must not come from the per-file fallback
    from ep_trace.parsers import kineto_files

    paths = sorted((external_dir / "kineto" / "param_dlrm_8rank").glob("*.json.gz"))
    calls: list[int] = []
    real = kineto_files.finish_files
    monkeypatch.setattr(kineto_files, "finish_files", lambda files: calls.append(len(files)) or real(files))
    read_kineto_files(paths, None)
    assert calls == [8]


def test_bad_files_in_a_batch_give_the_same_errors(tmp_path, kt):
    good = [kt.x("cpu_op", "a", 1, 2), kt.x("cpu_op", "b", 2, 1)]
    ps = [
        kt.write_trace(tmp_path / "rank0.json", good, rank=0),
        kt.write_trace(tmp_path / "rank1.json", [kt.x("cpu_op", "a", 1, -2)], rank=1),  # negative dur: decode error
        kt.write_trace(tmp_path / "rank2.json", good, rank=2, world_size=2),  # rank >= world size: refused per file
        # a 30-year span: passes the decode, fails the per-file time checks after the batch step
        kt.write_trace(
            tmp_path / "rank3.json", [kt.x("cpu_op", "a", 1, 2), kt.x("cpu_op", "b", 1e15, 1)], rank=3, world_size=8
        ),
        kt.write_trace(tmp_path / "rank4.json", good, rank=4, world_size=8),
    ]
    (tmp_path / "config.json").write_text('{"lr": 0.1}')  # no trace at all: skipped, reading goes on
    ps.insert(1, tmp_path / "config.json")
    want = _alone(ps)
    assert [type(w).__name__ for w in want] == [
        "tuple",
        "TraceFormatError",
        "TraceFormatError",
        "TraceFormatError",
        "TraceFormatError",
        "tuple",
    ]
    _assert_same(read_kineto_files(ps, None), want)
    # stop at the first error that is a trace's (the config JSON is passed over)
    stopped = read_kineto_files(ps, None, stop_at_error=True)
    _assert_same(stopped, want[:3])


def test_decode_batch_uses_it_and_keeps_errors_in_order(tmp_path, kt):
    good = [kt.x("cpu_op", "a", 1, 2)]
    for r in range(4):
        evs = [kt.x("cpu_op", "a", 1, -2)] if r == 2 else good
        kt.write_trace(tmp_path / f"rank{r}.json", evs, rank=r, world_size=4)
    files = tuple((str(tmp_path / f"rank{r}.json"), "kineto") for r in range(4))
    res = read_pool.decode_batch(read_pool.BatchSpec(0, files, on_error="skip"))
    assert [f.exception() is None for f in res.files] == [True, True, False, True]
    assert res.tables is not None and res.tables.ranks["rank"].to_list() == [0, 1, 3]
    res = read_pool.decode_batch(read_pool.BatchSpec(0, files, on_error="raise"))
    assert [f.exception() is None for f in res.files] == [True, True, False]
    assert "negative duration" in str(res.files[2].exception())


def test_cache_rereads_an_unchanged_directory(tmp_path, samples_dir, monkeypatch):
    import ep_trace
    from ep_trace.parsers import dispatch

    src = samples_dir / "balanced"
    first = ep_trace.load(src, cache=tmp_path / "c")
    monkeypatch.setattr(dispatch, "read_trace_dir", lambda *a, **k: pytest.fail("parsed although unchanged"))
    again = ep_trace.load(src, cache=tmp_path / "c")
    assert again.summary() == first.summary()
    assert len(list((tmp_path / "c").iterdir())) == 1


def test_kernel_collectives_of_a_batch_equal_each_rank_alone(tmp_path, kt):
    # DeepEP kernels (no collective op launches them) become calls per rank; one pass over the batch
    # gives the per-rank rows, ids and event links, each rank's calls behind its own
    from ep_trace.parsers.kernel_collectives import with_kernel_collectives

    def rank_events(r: int) -> list[dict]:
        out = []
        for i, k in enumerate(
            ["void deep_ep::intranode::notify_dispatch<8>(int*)", "void deep_ep::intranode::dispatch<8, 768>(void*)"]
            + ["fused_moe_kernel", "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(void*)"] * (1 + r % 2)
        ):
            t = 10.0 + 40 * i
            out.append(kt.x("cuda_runtime", "cudaLaunchKernel", t, 1, pid=1, tid=1, correlation=i + 1))
            out.append(kt.x("kernel", k, t + 5 + r, 20, pid=0, tid=7, correlation=i + 1, stream=7, device=r))
        return out

    for r in range(3):
        kt.write_trace(tmp_path / f"rank{r}.json", rank_events(r), rank=r, world_size=3)
    files = tuple((str(tmp_path / f"rank{r}.json"), "kineto") for r in range(3))
    got = read_pool.decode_batch(read_pool.BatchSpec(0, files)).tables
    alone = [with_kernel_collectives(read_one(tmp_path / f"rank{r}.json", "kineto", None)[0]) for r in range(3)]
    assert got is not None and got.collectives.filter(pl.col("backend") == "deepep").height == 7  # 2 + 3 + 2 calls
    for name in ("events", "collectives"):
        assert_frame_equal(got.table(name), pl.concat([t.table(name) for t in alone]))


def test_nccl_kernels_without_a_collective_op_are_calls_typed_from_their_names(tmp_path, kt):
    """vLLM's PyNcclCommunicator calls NCCL through ctypes: no c10d op, no record_param_comms, only
    the kernels (of every NCCL naming era); one call each, typed from the name, in pg nccl:<type>.
    A kernel launched under a c10d op keeps that op's collective row."""
    from ep_trace.parsers.kernel_collectives import with_kernel_collectives

    names = [
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",  # NCCL >= 2.19
        "ncclKernel_ReduceScatter_RING_LL_Sum_half(ncclWorkElem)",  # < 2.19
        "ncclAllReduceRingLLKernel_sum_f32(CollectiveArgs)",  # < 2.4
        "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",  # p2p or a grouped all-to-all
    ]
    ev = []
    for i, k in enumerate(names):
        t = 10.0 + 40 * i
        ev.append(kt.x("cuda_runtime", "cudaLaunchKernelExC", t, 1, pid=1, tid=1, correlation=i + 1))
        ev.append(kt.x("kernel", k, t + 5, 20, pid=0, tid=7, correlation=i + 1, stream=7, device=0))
    ev.append(kt.x("cpu_op", "c10d::allreduce_", 300, 10, pid=1, tid=1))
    ev.append(kt.x("cuda_runtime", "cudaLaunchKernel", 302, 1, pid=1, tid=1, correlation=9))
    ev.append(kt.x("kernel", names[2], 305, 20, pid=0, tid=7, correlation=9, stream=7, device=0))
    kt.write_trace(tmp_path / "rank0.json", ev, rank=0, world_size=1)
    t = with_kernel_collectives(read_one(tmp_path / "rank0.json", "kineto", None)[0])
    c = t.collectives.sort("start_ns")
    assert c.select("collective", "backend", "pg_name").rows() == [
        ("allgather", "nccl", "nccl:allgather"),
        ("reduce_scatter", "nccl", "nccl:reduce_scatter"),
        ("allreduce", "nccl", "nccl:allreduce"),
        ("unknown", "nccl", "nccl:unknown"),
        ("allreduce", None, None),  # the c10d op's own row (no process-group metadata here)
    ]
    assert c["n_kernels"].to_list() == [1] * 5
    assert t.events.filter(pl.col("kind") == "gpu_kernel")["coll_id"].null_count() == 0
