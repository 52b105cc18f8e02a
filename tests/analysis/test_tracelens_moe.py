"""The six real single-GPU MoE traces of TraceLens (``../shared/external/kineto/tracelens_moe_micro``,
see its README): no ep-trace ranges, a plain PyTorch MoE layer in ``MoE[...]`` ranges with its expert
part in ``expert_ffn[...]``. Expected: per iteration one route stage = softmax + top-k + sort kernels,
expert work = the kernels launched inside ``expert_ffn[...]`` (preset rows) plus the weight gathers
(``aten::index``) launched between routing and ``expert_ffn`` (kernel-family rows), each iteration a step
(the ``MoE[...]`` user range) with its layer 0, no communication at all. The expected figures are computed here straight from the JSON."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

import ep_trace

FILES = [
    "moe_01_many_experts_few_tokens",
    "moe_02_few_experts_many_tokens",
    "moe_03_top1_sparse",
    "moe_04_top2_dense",
    "moe_05_large_capacity",
    "moe_06_tiny_batch_many_experts",
]
ROUTE = ("softmax_warp_forward", "gatherTopK", "bitonicSortKVInPlace")


def _expected(path: Path) -> tuple[list[int], list[int], list[int]]:
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    x = [e for e in ev if e.get("ph") == "X"]
    kernels = sorted((e for e in x if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    launch = {
        e["args"]["correlation"]: e["ts"]
        for e in x
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    ffn = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in x
        if e.get("cat") == "user_annotation" and e["name"].startswith("expert_ffn[")
    )
    route: list[list[tuple[int, int]]] = [[] for _ in ffn]
    expert: list[list[tuple[int, int]]] = [[] for _ in ffn]
    gathers: list[list[tuple[int, int]]] = [[] for _ in ffn]
    moe = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in x if e.get("cat") == "user_annotation" and e["name"].startswith("MoE[")
    )
    for k in kernels:
        t = launch[k["args"]["correlation"]]
        i = next(j for j, (s, e) in enumerate(moe) if s <= t <= e)
        iv = (round(k["ts"] * 1000), round((k["ts"] + k["dur"]) * 1000))
        if any(s <= t <= e for s, e in ffn):
            expert[i].append(iv)
        elif "vectorized_gather_kernel" in k["name"]:
            gathers[i].append(iv)
        elif any(r in k["name"] for r in ROUTE):
            route[i].append(iv)
    return [_union(r) for r in route], [_union(g) for g in gathers], [_union(e) for e in expert]


def _union(ivs: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(ivs):
        if end is None or s > end:
            total, end = total + e - s, e
        elif e > end:
            total, end = total + e - end, e
    return total


@pytest.mark.parametrize("name", FILES)
def test_tracelens_moe_stages(external_dir, name):
    path = external_dir / "kineto" / "tracelens_moe_micro" / f"{name}.json.gz"
    route, gathers, ffn = _expected(path)
    a = ep_trace.load([path])
    # no ProfilerStep: each MoE[...] range (one iteration) is a step (analysis/user_steps.py), the
    # trace's one MoE layer is layer 0 of each; a first iteration 1.5x slower than the others is warm-up
    steps = sorted(a.steps["step"].to_list())
    assert steps in ([1, 2, 3], [2, 3])
    assert any("their steps are the 3 ranges 'MoE[experts=" in n for n in a.notes)
    st = a.stages.filter(pl.col("step").is_not_null()).sort("cpu_start_ns")
    assert st.select("step", "layer", "stage", "method").rows() == [
        (i, 0, s, m)
        for i in steps
        for s, m in (("route", "kernel_family"), ("expert", "kernel_family"), ("expert", "preset:tracelens"))
    ]
    # busy = union of the row's kernel intervals, within 1 ns per kernel (µs -> ns rounding)
    got = st["busy_ns"].to_list()
    want = [v for i in steps for v in (route[i - 1], gathers[i - 1], ffn[i - 1])]
    assert [abs(g - w) <= 4 for g, w in zip(got, want, strict=True)] == [True] * len(want), (got, want)
    # a route window spans its own kernels only, never the step (the 1.18 ms window of the old fallback)
    assert (st.filter(pl.col("stage") == "route")["window_ns"] < 100_000).all()
    assert a.tables.collectives.height == 0 and int(a.steps["comm_ns"].sum()) == 0
    assert set(st["method"]) == {"kernel_family", "preset:tracelens"}
