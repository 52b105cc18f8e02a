"""Python call frames (``with_stack=True``, vLLM's and SGLang's default) are call context, not work.

Read as ``cpu_op`` they covered every collective call of a CPU rank (the caller's wait is a frame
too: ``<built-in method wait ...>``), so its communication counted as overlapped by "compute" (a 2-rank gloo trace with frames read 90 % overlap and 0.31 ms exposed where
the same job without frames read 0 % and 1.5 ms).
"""

from __future__ import annotations

import ep_trace
from ep_trace.parsers.kineto import read_kineto


def _gloo_step(kt, frames: bool) -> list[dict]:
    """One gloo rank, one step [0, 1000] µs: the all-to-all's worker transfers [12, 312] µs while the
    caller waits (no op of its own), then 300 µs of aten::mm. With ``frames`` the Python frames of
    the training loop and of the MoE layer enclose the call, as torch's stack tracer writes them."""
    ev = [
        kt.x("user_annotation", "ProfilerStep#3", 0, 1000, tid=1),
        kt.x("cpu_op", "c10d::alltoall_base_", 10, 20, tid=1),
        kt.x("user_annotation", "gloo:all_to_all", 12, 300, tid=2),
        kt.x("cpu_op", "aten::mm", 400, 300, tid=1),
    ]
    if frames:
        ev += [
            kt.x("python_function", "train.py(40): <module>", 1, 998, tid=1),
            kt.x("python_function", "moe/layer.py(88): dispatch", 8, 320, tid=1),
            kt.x("python_function", "torch/distributed/distributed_c10d.py(4410): all_to_all_single", 9, 318, tid=1),
            # C functions are frames too: the caller's wait for the transfer (torch 2.13, as recorded)
            kt.x(
                "python_function",
                "<built-in method wait of pybind11_builtins.pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi"
                "_1xxx_use_cxx11_abi_1 object at 0x7f0e8c1a2b50>",
                31,
                283,
                tid=1,
            ),
        ]
    return ev


def test_frames_are_their_own_kind(kt, tmp_path):
    t = read_kineto(kt.write_trace(tmp_path / "rank0.pt.trace.json", _gloo_step(kt, True)))
    kinds = dict(zip(t.events["name"].to_list(), t.events["kind"].cast(str).to_list(), strict=True))
    assert kinds["moe/layer.py(88): dispatch"] == "python_frame"
    assert kinds["aten::mm"] == "cpu_op"


def test_frames_around_a_collective_do_not_make_it_overlapped(kt, tmp_path):
    figures = []
    for frames in (False, True):
        d = tmp_path / str(frames)
        d.mkdir()
        kt.write_trace(d / "rank0.pt.trace.json", _gloo_step(kt, frames))
        rs = ep_trace.load([d]).rank_summary.row(0, named=True)
        figures.append((rs["exposed_comm_ns"], rs["compute_ns"], rs["overlap_efficiency"]))
    assert figures[1] == figures[0]
    assert figures[0][0] > 250_000  # the transfer is exposed: the caller only waits during it
