"""Golden tests on tiny inline Kineto traces: one rule each, exact expected values."""

from __future__ import annotations

import gzip

import polars as pl
import pytest

from ep_trace.errors import TraceFormatError
from ep_trace.parsers import kineto_json, read_kineto
from ep_trace.parsers.kineto import rank_from_file_name, read_kineto_file

from .conftest import A2AV_META
from .decoder_paths import decoder  # noqa: F401 - the fixture, used by pytestmark

pytestmark = pytest.mark.usefixtures("decoder")


def _ev(t, name):
    return t.events.filter(pl.col("name") == name).row(0, named=True)


# --- time conversion ---------------------------------------------------------------------------


def test_relative_ts_with_base_ns_float(tmp_path, kt):
    p = kt.write_trace(
        tmp_path / "a.json", [kt.x("cpu_op", "op", 5.1, 2.345), kt.x("cpu_op", "op2", 4458676522690.655, 0.001)]
    )
    t = read_kineto(p)
    a, b = _ev(t, "op"), _ev(t, "op2")
    assert a["start_ns"] == kt.BASE + 5100
    assert a["end_ns"] == kt.BASE + 5100 + 2345
    assert b["start_ns"] == kt.BASE + 4458676522690655
    assert b["end_ns"] - b["start_ns"] == 1


def test_absolute_epoch_us_ints_are_exact(tmp_path, kt):
    # 2023-era: no baseTimeNanoseconds, ts = epoch µs int (> 2^53 once scaled to ns), dur a float "134.0".
    p = kt.write_trace(tmp_path / "a.json", [kt.x("cpu_op", "op", 1694128201429737, 134.0)], base=None)
    a = _ev(read_kineto(p), "op")
    assert a["start_ns"] == 1694128201429737000
    assert a["end_ns"] == 1694128201429737000 + 134000


# --- kinds, ids, seq ---------------------------------------------------------------------------------


def test_kinds_and_dropped_phases(tmp_path, kt):
    evs = [
        kt.x("kernel", "k", 10, 1, pid=0, tid=7, correlation=1),
        kt.x("gpu_memcpy", "Memcpy HtoD", 11, 1, pid=0, tid=7, correlation=2, bytes=4096),
        kt.x("gpu_memset", "Memset", 12, 1, pid=0, tid=7, correlation=3, bytes=64),
        kt.x("gpu_user_annotation", "ep:dispatch:l0:fwd", 10, 3, pid=0, tid=7),
        kt.x("user_annotation", "ProfilerStep#12", 1, 50),
        kt.x("cpu_op", "aten::mm", 2, 5),
        kt.x("python_function", "torch/nn/x.py(1): f", 2, 6),
        kt.x("cuda_runtime", "cudaLaunchKernel", 3, 1, correlation=1),
        kt.x("cuda_driver", "cuLaunchKernelEx", 4, 1, correlation=2),
        kt.x("mtia_weird_new_cat", "mystery", 5, 1),
        {
            "ph": "X",
            "cat": "Trace",
            "name": "PyTorch Profiler (0)",
            "pid": "Spans",
            "tid": "PyTorch Profiler",
            "ts": 0,
            "dur": 60,
        },
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 100, "args": {"name": "main"}},
        {"ph": "s", "cat": "ac2g", "id": 1, "pid": 100, "tid": 100, "ts": 3},
        {"ph": "f", "cat": "ac2g", "id": 1, "pid": 0, "tid": 7, "ts": 10, "bp": "e"},
        {"ph": "i", "name": "Record Window End", "pid": "", "tid": "", "ts": 70, "s": "g"},
    ]
    t = read_kineto(kt.write_trace(tmp_path / "a.json", evs))
    kinds = dict(t.events.select("name", "kind").iter_rows())
    assert kinds == {
        "k": "gpu_kernel",
        "Memcpy HtoD": "gpu_memcpy",
        "Memset": "gpu_memset",
        "ep:dispatch:l0:fwd": "gpu_annotation",
        "ProfilerStep#12": "cpu_annotation",
        "aten::mm": "cpu_op",
        "torch/nn/x.py(1): f": "python_frame",
        "cudaLaunchKernel": "runtime",
        "cuLaunchKernelEx": "runtime",
        "mystery": "other",
        "PyTorch Profiler (0)": "other",
    }
    assert t.events.height == 11  # M, s, f, i dropped
    assert _ev(t, "ProfilerStep#12")["seq"] == 12 and _ev(t, "aten::mm")["seq"] is None
    k = _ev(t, "k")
    assert (k["device"], k["stream"], k["event_id"]) == (0, 7, 0)  # event_id = index in traceEvents
    assert _ev(t, "Memcpy HtoD")["bytes"] == 4096
    assert _ev(t, "PyTorch Profiler (0)")["pid"] is None  # string pid "Spans" -> null


def test_string_stream_labels_keep_their_number(tmp_path, kt):
    p = kt.write_trace(tmp_path / "a.json", [kt.x("kernel", "k", 1, 1, pid=0, tid="stream 7 ")])
    assert _ev(read_kineto(p), "k")["stream"] == 7


# --- linking -----------------------------------------------------------------------------------------


def test_link_by_correlation_and_external_id(tmp_path, kt):
    evs = [
        kt.x("cpu_op", "aten::add", 0, 20, **{"External id": 5}),
        kt.x("cuda_runtime", "cudaLaunchKernel", 2, 1, correlation=77, **{"External id": 5}),
        kt.x("kernel", "add_kernel", 30, 5, pid=0, tid=7, correlation=77, **{"External id": 5}),
    ]
    t = read_kineto(kt.write_trace(tmp_path / "a.json", evs))
    k, rt, op = _ev(t, "add_kernel"), _ev(t, "cudaLaunchKernel"), _ev(t, "aten::add")
    assert k["launch_id"] == rt["event_id"]
    assert k["op_id"] == op["event_id"] and rt["op_id"] == op["event_id"]


def test_legacy_external_id_equal_to_correlation_uses_containment(tmp_path, kt):
    # 2022-2023 NCCL kernels: External id == correlation and no CPU op has it; an unrelated op
    # happens to carry that id (id spaces collide) and must NOT be chosen.
    evs = [
        kt.x("cpu_op", "c10d::allreduce_", 100, 50, **{"External id": 1}),
        kt.x("cpu_op", "record_param_comms", 101, 48, **{"External id": 2}),
        kt.x("user_annotation", "nccl:all_reduce", 102, 46, **{"External id": 3}),
        kt.x("cpu_op", "aten::empty", 104, 1, **{"External id": 4}),  # sibling before the launch
        kt.x("cuda_runtime", "cudaLaunchKernel", 110, 2, correlation=900, **{"External id": 900}),
        kt.x("cpu_op", "unrelated", 500, 1, **{"External id": 900}),
        kt.x(
            "kernel",
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
            120,
            30,
            pid=0,
            tid=84,
            correlation=900,
            **{"External id": 900},
        ),
    ]
    t = read_kineto(kt.write_trace(tmp_path / "a.json", evs))
    k = t.events.filter(pl.col("kind") == "gpu_kernel").row(0, named=True)
    assert k["op_id"] == _ev(t, "nccl:all_reduce")["event_id"]
    c = t.collectives.row(0, named=True)
    assert (c["collective"], c["op_name"], c["n_kernels"], c["start_ns"]) == (
        "allreduce",
        "c10d::allreduce_",
        1,
        kt.BASE + 120_000,
    )
    assert k["coll_id"] == c["coll_id"]


def test_containment_on_other_thread_does_not_link(tmp_path, kt):
    evs = [
        kt.x("cpu_op", "aten::mm", 0, 50, tid=1),
        kt.x("cuda_runtime", "cudaLaunchKernel", 10, 1, tid=2, correlation=1),
        kt.x("kernel", "gemm", 20, 5, pid=0, tid=7, correlation=1),
    ]
    t = read_kineto(kt.write_trace(tmp_path / "a.json", evs))
    assert _ev(t, "gemm")["op_id"] is None and _ev(t, "gemm")["launch_id"] is not None


# --- collectives -------------------------------------------------------------------------------------

META_V = {**A2AV_META, "Seq": 41, "Comms Id": 10159970886766084423}


def test_record_param_comms_metadata_modern_keys(tmp_path, kt):
    evs = kt.nccl_call(1000, 10, 500, META_V, kernels=3)
    t = read_kineto(kt.write_trace(tmp_path / "a.json", evs))
    c = t.collectives.row(0, named=True)
    assert c["collective"] == "all_to_allv" and c["op_name"] == "c10d::alltoall_base_"
    assert (c["pg_name"], c["pg_desc"], c["group_ranks"], c["group_size"], c["seq"]) == ("3", "ep_group", [0, 1], 2, 41)
    assert c["comms_id"] == 10159970886766084423  # beyond int64, kept as uint64
    assert (c["in_splits"], c["out_splits"], c["splits_truncated"], c["splits_source"]) == (
        [3, 5],
        [4, 2],
        False,
        "kineto",
    )
    assert (c["in_nelems"], c["out_nelems"], c["dtype"], c["row_bytes"]) == (8192, 6144, "BFloat16", 1024 * 2)
    # three SendRecv kernels aggregated: 1100..1150, 1160..1210, 1220..1270 µs
    assert (c["n_kernels"], c["start_ns"], c["end_ns"]) == (3, kt.BASE + 1_100_000, kt.BASE + 1_270_000)
    assert (c["cpu_start_ns"], c["cpu_end_ns"]) == (kt.BASE + 1_000_000, kt.BASE + 1_040_000)
    assert t.events.filter(pl.col("coll_id") == c["coll_id"]).height == 3


def test_legacy_key_variants(tmp_path, kt):
    meta = {
        "Collective name": "allreduce",
        "dtype": "Float",
        "In msg size": 100,
        "Out msg size": 100,
        "Group size": 2,
        "In split size": "[]",
        "Out split size": "[]",
        "Process Group ID": 7,
        "Process Group Ranks": "[0, 1]",
    }
    t = read_kineto(kt.write_trace(tmp_path / "a.json", kt.nccl_call(0, 10, 500, meta)))
    c = t.collectives.row(0, named=True)
    assert (c["collective"], c["pg_name"], c["in_nelems"], c["in_splits"], c["seq"]) == (
        "allreduce",
        "7",
        100,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[" + ", ".join(str(i) for i in range(30)) + ", ...]", list(range(30)) + [None] * 10),  # older torch
        (
            "[" + ", ".join(str(i) for i in range(29)) + ", ..., 39]",
            list(range(29)) + [None] * 10 + [39],
        ),  # newer torch
    ],
)
def test_truncated_split_lists_are_flagged_and_placed(tmp_path, kt, text, expected):
    meta = dict(
        META_V,
        **{
            "Group size": 40,
            "In split size": text,
            "Out split size": text,
            "Process Group Ranks": text,
            "Global rank start": 0,
            "Global rank stride": 2,
        },
    )
    t = read_kineto(kt.write_trace(tmp_path / "a.json", kt.nccl_call(0, 10, 500, meta)))
    c = t.collectives.row(0, named=True)
    assert c["splits_truncated"] is True
    assert c["in_splits"] == expected
    assert c["group_ranks"] == [2 * j for j in range(40)]  # truncated ranks -> start + j * stride
    assert c["row_bytes"] is None  # never derived from an incomplete list


def test_kernel_metadata_copy_without_cpu_op(tmp_path, kt):
    # The profiled window starts after the CPU side of the call: only the kernel (with kineto#906's copy) is there.
    evs = [e for e in kt.nccl_call(0, 10, 500, META_V, copy_meta=True) if e["cat"] == "kernel"] + [
        kt.x("cpu_op", "aten::mm", 0, 1)
    ]
    t = read_kineto(kt.write_trace(tmp_path / "a.json", evs))
    c = t.collectives.row(0, named=True)
    assert (c["collective"], c["op_name"], c["in_splits"], c["n_kernels"], c["cpu_start_ns"]) == (
        "all_to_allv",
        "record_param_comms",
        [3, 5],
        1,
        None,
    )


def test_wait_records_and_bare_legacy_records_are_not_calls(tmp_path, kt):
    evs = [
        kt.x("cpu_op", "record_param_comms", 0, 5, **{"Collective name": "wait", "Group size": 1}),
        kt.x("cpu_op", "record_param_comms", 10, 5, **{"External id": 3, "Input Dims": [[]]}),  # legacy work-wait
        kt.x("cpu_op", "_c10d_functional::wait_tensor", 20, 5),
        kt.x("cpu_op", "c10d::barrier", 30, 5),
    ]
    t = read_kineto(kt.write_trace(tmp_path / "a.json", evs))
    assert t.collectives["collective"].to_list() == ["barrier"]
    assert t.collectives["n_kernels"].to_list() == [0]  # no device activity: host interval kept
    assert t.collectives["start_ns"].to_list() == [kt.BASE + 30_000]


def test_collective_type_from_launching_op_not_kernel_name(tmp_path, kt):
    evs = [
        kt.x("cpu_op", "c10d::_allgather_base_", 0, 30),
        kt.x("user_annotation", "nccl:_all_gather_base", 1, 28),
        kt.x("cuda_runtime", "cudaLaunchKernel", 2, 1, correlation=9),
        kt.x(
            "kernel",
            "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
            40,
            10,
            pid=0,
            tid=84,
            correlation=9,
        ),
    ]
    t = read_kineto(kt.write_trace(tmp_path / "a.json", evs))
    assert t.collectives["collective"].to_list() == ["allgather"]


def test_only_comm_kernels_count_when_present(tmp_path, kt):
    evs = [
        kt.x("cpu_op", "c10d::allreduce_", 0, 30),
        kt.x("cuda_runtime", "cudaLaunchKernel", 2, 1, correlation=1),
        kt.x("kernel", "void at::native::vectorized_elementwise_kernel<4>(...)", 5, 3, pid=0, tid=7, correlation=1),
        kt.x("cuda_runtime", "cudaLaunchKernel", 4, 1, correlation=2),
        kt.x(
            "kernel",
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            20,
            10,
            pid=0,
            tid=40,
            correlation=2,
        ),
    ]
    t = read_kineto(kt.write_trace(tmp_path / "a.json", evs))
    c = t.collectives.row(0, named=True)
    assert (c["n_kernels"], c["start_ns"], c["end_ns"]) == (1, kt.BASE + 20_000, kt.BASE + 30_000)


def _gloo_events(kt, send, recv, rows=4, hidden=8):
    """torch 2.13 gloo shape: caller-thread c10d::alltoall_base_ with Concrete Inputs, worker-thread gloo:all_to_all."""
    ci = ["", "", "", str(recv), str(send), "False", "-1"]
    return [
        kt.x("user_annotation", "ProfilerStep#3", 0, 1000, tid=1),
        kt.x(
            "cpu_op",
            "c10d::alltoall_base_",
            10,
            20,
            tid=1,
            **{
                "Concrete Inputs": ci,
                "Input Dims": [[sum(recv), hidden], [sum(send), hidden], [], [], [], [], []],
                "Input type": ["float", "float", "", "", "", "Scalar", "Scalar"],
            },
        ),
        kt.x("user_annotation", "gloo:all_to_all", 12, 300, tid=2, **{"Input Dims": [[sum(send), hidden]]}),
        kt.x(
            "cpu_op",
            "c10d::alltoall_base_",
            400,
            20,
            tid=1,
            **{
                "Concrete Inputs": ["", "", "", "[]", "[]", "False", "-1"],
                "Input Dims": [[rows, hidden], [rows, hidden]],
                "Input type": ["c10::BFloat16", "c10::BFloat16"],
            },
        ),
        kt.x("user_annotation", "gloo:all_to_all", 405, 50, tid=3, **{"Input Dims": [[rows, hidden]]}),
    ]


def test_gloo_concrete_inputs_and_worker_pairing(tmp_path, kt):
    t = read_kineto(kt.write_trace(tmp_path / "a.json", _gloo_events(kt, [1, 3], [1, 2]), backend="gloo"))
    assert t.events.filter(pl.col("kind") == "comm_worker").height == 2
    c = t.collectives.sort("coll_id").to_dicts()
    assert [r["collective"] for r in c] == ["all_to_allv", "all_to_all"]
    assert (c[0]["in_splits"], c[0]["out_splits"], c[0]["splits_source"]) == ([1, 3], [1, 2], "concrete_inputs")
    assert (c[0]["row_bytes"], c[0]["in_nelems"], c[0]["out_nelems"], c[0]["group_ranks"]) == (32, 32, 24, [0, 1])
    assert (c[0]["backend"], c[0]["start_ns"], c[0]["end_ns"], c[0]["n_kernels"]) == (
        "gloo",
        kt.BASE + 12_000,
        kt.BASE + 312_000,
        1,
    )
    assert (c[1]["row_bytes"], c[1]["in_splits"], c[1]["start_ns"]) == (16, None, kt.BASE + 405_000)
    assert c[1]["ordinal"] == 1


def test_gloo_workers_starting_out_of_issue_order_pair_by_input_size(tmp_path, kt):
    # ProcessGroupGloo's 2 worker threads pop one queue: the combine (issued second) can start a few
    # µs before the dispatch (issued first) on the other thread; order alone would swap their ranges
    h = 8

    def call(ts, send, recv):
        ci = ["", "", "", str(recv), str(send), "True", "-1"]
        return kt.x(
            "cpu_op",
            "c10d::alltoall_base_",
            ts,
            5,
            tid=1,
            **{"Concrete Inputs": ci, "Input Dims": [[sum(recv), h], [sum(send), h]], "Input type": ["float", "float"]},
        )

    evs = [
        kt.x("user_annotation", "ProfilerStep#0", 0, 1000, tid=1),
        call(10, [1, 3], [2, 2]),  # dispatch: 4 rows out
        call(20, [5, 6], [7, 9]),  # combine: 11 rows out
        kt.x("user_annotation", "gloo:all_to_all", 30, 500, tid=3, **{"Input Dims": [[11, h]]}),  # starts first
        kt.x("user_annotation", "gloo:all_to_all", 31, 20, tid=2, **{"Input Dims": [[4, h]]}),
    ]
    c = read_kineto(kt.write_trace(tmp_path / "a.json", evs, backend="gloo")).collectives.sort("coll_id")
    assert c.select("in_splits", "start_ns", "end_ns").rows() == [
        ([1, 3], kt.BASE + 31_000, kt.BASE + 51_000),
        ([5, 6], kt.BASE + 30_000, kt.BASE + 530_000),
    ]
    # without Input Dims on the ranges the pairing stays in start order
    for e in evs[3:]:
        e["args"].pop("Input Dims")
    c = read_kineto(kt.write_trace(tmp_path / "b.json", evs, backend="gloo")).collectives.sort("coll_id")
    assert c["start_ns"].to_list() == [kt.BASE + 30_000, kt.BASE + 31_000]


def test_functional_all_to_all_single_wrapper(tmp_path, kt):
    evs = [
        kt.x(
            "cpu_op", "_c10d_functional::all_to_all_single", 0, 50, **{"Concrete Inputs": ["", "[2, 2]", "[1, 3]", "0"]}
        ),
        kt.x("cpu_op", "c10d::alltoall_base_", 1, 40),
    ]
    c = read_kineto(kt.write_trace(tmp_path / "a.json", evs)).collectives.row(0, named=True)
    assert (c["collective"], c["op_name"], c["in_splits"], c["out_splits"]) == (
        "all_to_allv",
        "c10d::alltoall_base_",
        [1, 3],
        [2, 2],
    )


# --- rank identity -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank-3.json", 3),
        ("rank3.pt.trace.json", 3),
        ("rank_3.json.gz", 3),
        ("worker12_step_12.1694.pt.trace.json", 12),
        # vLLM's worker names (vllm/v1/worker/gpu_worker.py; get_worker_rank_suffix): the global rank
        ("0f3a-rank-5.1733000000123.pt.trace.json.gz", 5),
        ("decode_dp1_pp0_tp2_dcp0_ep3_rank7.1733000000123.pt.trace.json.gz", 7),
        # SGLang's TP rank is not a global rank (with DP it repeats): distributedInfo must say
        ("1733000000.1-TP-3-DP-1-EP-3.trace.json.gz", None),
        ("trace.json", None),
    ],
)
def test_rank_from_file_name(name, rank):
    assert rank_from_file_name(name) == rank


def test_rank_sources(tmp_path, kt):
    compact = tmp_path / "x.json"
    compact.write_bytes(
        b'{"distributedInfo":{"rank":5,"world_size":8},"traceEvents":[{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1,"dur":1}]}'
    )
    t, info = read_kineto_file(compact)
    assert (info.rank, info.rank_source, t.ranks["world_size"][0]) == (5, "distributedInfo", 8)
    p = kt.write_trace(tmp_path / "rank_6.json", [kt.x("cpu_op", "a", 1, 1)], rank=None)
    t = read_kineto(p)
    assert t.ranks["rank"][0] == 6 and t.ranks["rank_source"][0] == "file_name"
    assert [i.level for i in t.load_report] == ["warning"] and "guessed from the file name" in t.load_report[0].message
    assert read_kineto(p, rank=2).ranks["rank_source"][0] == "rank_map"


# --- bad input ---------------------------------------------------------------------------------------


def _err(path) -> str:
    with pytest.raises(TraceFormatError) as ei:
        read_kineto(path)
    msg = str(ei.value)
    assert "\n" not in msg and str(path) in msg and ei.value.exit_code == 2
    return msg


def test_bad_inputs_give_one_line_errors(tmp_path, kt):
    (tmp_path / "empty.json").write_bytes(b"")
    assert "empty file" in _err(tmp_path / "empty.json")
    full = kt.write_trace(tmp_path / "full.json", [kt.x("cpu_op", "a", 1, 1)] * 50).read_bytes()
    (tmp_path / "trunc.json").write_bytes(full[: len(full) // 2])
    assert "invalid or truncated JSON" in _err(tmp_path / "trunc.json")
    (tmp_path / "bad.json.gz").write_bytes(gzip.compress(full)[:40])
    assert "gzip" in _err(tmp_path / "bad.json.gz")
    (tmp_path / "plain.json.gz").write_bytes(full)
    assert "no gzip header" in _err(tmp_path / "plain.json.gz")
    (tmp_path / "other.json").write_bytes(b'{"name": "package.json", "version": 1}')
    assert "not a Chrome/Kineto trace" in _err(tmp_path / "other.json")
    assert "no complete events" in _err(
        kt.write_trace(tmp_path / "none.json", [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {}}])
    )
    neg = [kt.x("cpu_op", "a", 1, 1), {"ph": "M", "name": "m"}, kt.x("cpu_op", "b", 2, -3)]
    assert (
        _err(kt.write_trace(tmp_path / "neg.json", neg))
        == f"{tmp_path / 'neg.json'}: traceEvents[2]: negative duration (dur=-3.0); the trace is corrupt; re-export it"
    )
    (tmp_path / "huge.json").write_bytes(
        b'{"traceEvents": [{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":1,"args":{"correlation": 99999999999999999999999}}]}'
    )
    assert "traceEvents[0]: args.correlation has an unusable value" in _err(tmp_path / "huge.json")
    big_comms = {"Collective name": "allreduce", "Comms Id": 2**70}
    assert "'Comms Id'" in _err(kt.write_trace(tmp_path / "comms.json", kt.nccl_call(0, 10, 500, big_comms)))
    (tmp_path / "str_ts.json").write_bytes(
        b'{"traceEvents": [{"ph":"X","cat":"cpu_op","name":"k","pid":0,"tid":7,"ts":"soon","dur":1}]}'
    )
    assert "traceEvents[0]: ts has an unusable value 'soon'" in _err(tmp_path / "str_ts.json")


# --- chunked decoding --------------------------------------------------------------------------------


def test_chunked_decode_equals_whole_decode(tmp_path, kt, monkeypatch):
    evs = []
    for i in range(300):
        evs += kt.nccl_call(i * 1000.5, 10 * i, 1000 + 10 * i, META_V)
    evs.append(kt.x("cpu_op", "tricky }, { name", 5, 1))  # a boundary look-alike inside a string
    p = kt.write_trace(tmp_path / "big.json", evs, indent=2, extra={"INFO": ["a [b]", "c]"], "traceName": "x"})
    whole = read_kineto(p)
    monkeypatch.setattr(kineto_json, "CHUNK_BYTES", 2048)
    chunks = list(kineto_json.iter_event_chunks(kineto_json.decode_header(p.read_bytes(), p)[1], p))
    assert len(chunks) > 10 and sum(len(c) for _, c in chunks) == len(evs)
    chunked = read_kineto(p)
    assert chunked.events.equals(whole.events) and chunked.collectives.equals(whole.collectives)
    assert whole.collectives.height == 300 and whole.events.height == len(evs)


def test_streaming_decode_matches_plain_decode(tmp_path, kt, monkeypatch):
    import json

    from ep_trace.parsers import kineto_stream

    evs = [kt.x("cpu_op", f"op{i}", i * 1.5, 1.25, **{"External id": i}) for i in range(3000)]
    p = kt.write_trace(tmp_path / "s.json.gz", evs, indent=2, extra={"INFO": ["x]"]})
    monkeypatch.setattr(kineto_json, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(kineto_stream, "_READ", 1024)
    header: dict = {}
    chunks = list(kineto_stream.stream_events(p, header))  # no Fallback on a well-formed file
    doc = json.loads(gzip.decompress(p.read_bytes()))
    assert len(chunks) > 20 and [e for _, c in chunks for e in c] == doc.pop("traceEvents")
    assert header == doc and [o for o, _ in chunks][:2] == [0, len(chunks[0][1])]
    # a multi-member gzip file (concatenated .gz parts) is one stream
    raw = gzip.decompress(p.read_bytes())
    (tmp_path / "multi.json.gz").write_bytes(gzip.compress(raw[:5000]) + gzip.compress(raw[5000:]))
    assert read_kineto(tmp_path / "multi.json.gz").events.equals(read_kineto(p).events)
