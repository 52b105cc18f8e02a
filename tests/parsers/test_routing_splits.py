"""Routing matrix from split lists when there is no sidecar (parsers/routing_splits.py): stage
ranges name the direction / layer / micro-batch; otherwise first-in-first-out pairing of combines
with open dispatches; backward all-to-alls and count exchanges are left out."""

from __future__ import annotations

import shutil

import polars as pl
import pytest

from ep_trace.parsers import read_trace_dir
from ep_trace.parsers.routing_splits import _fifo_directions

KEY = ["step", "layer", "microbatch", "direction", "src", "dst", "rows", "row_bytes"]


def test_fifo_pairs_chunked_pipelines() -> None:
    # chunk c sends s_c and receives r_c; combine c sends r_c back. Issue order d0 d1 c0 d2 c1 d3 c2 c3
    s = [[1, 2], [3, 4], [5, 6], [7, 8]]
    r = [[10, 20], [30, 40], [50, 60], [70, 80]]
    order = [("d", 0), ("d", 1), ("c", 0), ("d", 2), ("c", 1), ("d", 3), ("c", 2), ("c", 3)]
    ins = [s[i] if k == "d" else r[i] for k, i in order]
    outs = [r[i] if k == "d" else s[i] for k, i in order]
    got = _fifo_directions(ins, outs)
    assert got == ["dispatch" if k == "d" else "combine" for k, _ in order]


def test_fifo_sequential_layers_and_repeated_splits() -> None:
    # two layers, same routing: d c d c; a dispatch equal to a combined one opens a new pair
    assert (
        _fifo_directions([[1, 2], [3, 4], [1, 2], [3, 4]], [[3, 4], [1, 2], [3, 4], [1, 2]])
        == ["dispatch", "combine"] * 2
    )
    # unknown receive splits: the call can never be combined, the next one is a dispatch too
    assert _fifo_directions([[1, 2], [3, 4]], [None, [1, 2]]) == ["dispatch", "dispatch"]


def _a2a_meta(send: list[int], recv: list[int], dtype: str = "Float") -> dict:
    return {
        "Collective name": "all_to_allv",
        "dtype": dtype,
        "In msg nelems": sum(send) * 8,
        "Out msg nelems": sum(recv) * 8,
        "Group size": 2,
        "In split size": str(send),
        "Out split size": str(recv),
        "Process Group Name": "0",
        "Process Group Ranks": "[0, 1]",
    }


def test_structural_rule_and_exclusions(tmp_path, kt) -> None:
    s = [[[1, 2], [10, 20]], [[3, 4], [30, 40]]]  # (send, recv) of chunk 0 and 1
    evs = [kt.x("user_annotation", "ProfilerStep#4", 0, 5000)]
    calls = [(s[0][0], s[0][1]), (s[1][0], s[1][1]), (s[0][1], s[0][0]), (s[1][1], s[1][0])]  # d0 d1 c0 c1
    for i, (send, recv) in enumerate(calls):
        evs += kt.nccl_call(100 + 400 * i, 10 * i + 10, 1000 + 10 * i, _a2a_meta(send, recv))
    evs += kt.nccl_call(1800, 200, 2000, _a2a_meta([2, 2], [2, 2], dtype="Long"))  # a count exchange
    evs.append(kt.x("cpu_op", "autograd::engine::evaluate_function: _A2ABackward", 2190, 300))
    evs += kt.nccl_call(2200, 300, 3000, _a2a_meta([9, 9], [9, 9]))  # a backward all-to-all
    kt.write_trace(tmp_path / "rank0.pt.trace.json", evs)
    t = read_trace_dir(tmp_path)
    assert t.collectives.filter(pl.col("collective") == "all_to_allv").height == 6
    m = t.routing_matrix.sort("direction", "call", "dst")
    assert m.select("step", "direction", "call", "dst", "rows").rows() == [
        (4, "combine", 0, 0, 10),
        (4, "combine", 0, 1, 20),
        (4, "combine", 1, 0, 30),
        (4, "combine", 1, 1, 40),
        (4, "dispatch", 0, 0, 1),
        (4, "dispatch", 0, 1, 2),
        (4, "dispatch", 1, 0, 3),
        (4, "dispatch", 1, 1, 4),
    ]
    assert m["layer"].null_count() == m.height and set(m["microbatch"]) == {0} and set(m["source"]) == {"splits"}


def test_stage_ranges_name_direction_layer_and_microbatch(tmp_path, kt) -> None:
    # symmetric splits (send == recv): only the ranges can tell dispatch from combine
    evs = [kt.x("user_annotation", "ProfilerStep#0", 0, 5000)]
    names = [
        "ep:dispatch:l3:mb0:fwd",
        "ep:dispatch:l3:mb1:fwd",
        "ep:combine:l3:mb0:fwd",
        "ep:combine:l3:mb1:fwd",
        "ep:combine:l3:bwd",
    ]
    for i, name in enumerate(names):
        evs.append(kt.x("user_annotation", name, 90 + 400 * i, 300))
        evs += kt.nccl_call(100 + 400 * i, 10 * i + 10, 1000 + 10 * i, _a2a_meta([5, 5 + i], [5, 5 + i]))
    kt.write_trace(tmp_path / "rank0.pt.trace.json", evs)
    m = read_trace_dir(tmp_path).routing_matrix.filter(pl.col("dst") == 1).sort("direction", "microbatch")
    assert m.select("layer", "microbatch", "direction", "call", "rows").rows() == [
        (3, 0, "combine", 0, 7),
        (3, 1, "combine", 0, 8),
        (3, 0, "dispatch", 0, 5),
        (3, 1, "dispatch", 0, 6),
    ]


@pytest.mark.parametrize("name", ["balanced", "skewed_straggler", "chunked_overlap", "backward"])
def test_without_sidecar_equals_sidecar_matrix(samples_dir, tmp_path, name) -> None:
    src = samples_dir / name
    if not (src / "rank0.ep.jsonl").exists():
        pytest.skip(f"sample_traces/{name} not generated yet (ep-trace demo)")
    for f in src.glob("*.pt.trace.json.gz"):
        shutil.copy(f, tmp_path / f.name)
    side = read_trace_dir(src).routing_matrix
    got = read_trace_dir(tmp_path).routing_matrix
    assert set(side["source"]) == {"sidecar"} and set(got["source"]) == {"splits"}
    assert got.select(KEY).sort(KEY).equals(side.select(KEY).sort(KEY))
    assert got["layer"].null_count() == 0  # every token all-to-all sits in an ep: stage range


def test_backward_sidecar_matrix_is_the_forward_routing(samples_dir) -> None:
    # the backward's transposed all-to-alls carry gradients: the matrix equals balanced's (same routing)
    bwd, fwd = samples_dir / "backward", samples_dir / "balanced"
    if not (bwd / "rank0.ep.jsonl").exists() or not (fwd / "rank0.ep.jsonl").exists():
        pytest.skip("sample traces not generated yet (ep-trace demo)")
    a, b = read_trace_dir(bwd).routing_matrix, read_trace_dir(fwd).routing_matrix
    assert a.select(KEY).sort(KEY).equals(b.select(KEY).sort(KEY))
