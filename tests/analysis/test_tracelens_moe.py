"""The six real single-GPU MoE traces of TraceLens (``../shared/external/kineto/tracelens_moe_micro``,
see its README): no ep-trace ranges, a plain PyTorch MoE layer in ``MoE[...]`` ranges with its expert
part in ``expert_ffn[...]``. Each iteration is a step (the ``MoE[...]`` user range; a slow first one is
warm-up) with its layer 0. Expected per step, no communication at all:

* route: the softmax + top-k + sort kernels (kernel families), and the gate GEMM and the copy of the
  reshaped routing output launched before the first ``aten::index`` (tier ``cpu_op``: the ops of the
  ``MoE[...]`` range before its first permute op);
* expert: the weight gathers (``aten::index``) launched between routing and ``expert_ffn`` (kernel
  families) and the kernels launched inside ``expert_ffn[...]`` (preset rows);
* unpermute: the weighting multiply and the sum launched after ``expert_ffn`` (tier ``cpu_op``).

Every kernel of the layer gets a stage: coverage 100 %. The expected figures are computed here
straight from the JSON, with no ep-trace code."""

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


def _expected(path: Path) -> list[list[int]]:
    """Per iteration: busy of [route cpu_op, route family, expert family, expert range, unpermute cpu_op]."""
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    x = [e for e in ev if e.get("ph") == "X"]
    kernels = sorted((e for e in x if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    launch = {
        e["args"]["correlation"]: e["ts"]
        for e in x
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }

    def spans(prefix: str, cat: str = "user_annotation") -> list[tuple[float, float]]:
        return sorted((e["ts"], e["ts"] + e["dur"]) for e in x if e.get("cat") == cat and e["name"].startswith(prefix))

    moe, ffn = spans("MoE["), spans("expert_ffn[")
    first_index = [min(s for s, _ in spans("aten::index", "cpu_op") if a <= s <= b) for a, b in moe]
    rows: list[list[list[tuple[int, int]]]] = [[[] for _ in range(5)] for _ in moe]
    for k in kernels:
        t = launch[k["args"]["correlation"]]
        i = next(j for j, (s, e) in enumerate(moe) if s <= t <= e)
        iv = (round(k["ts"] * 1000), round((k["ts"] + k["dur"]) * 1000))
        if ffn[i][0] <= t <= ffn[i][1]:
            rows[i][3].append(iv)
        elif "vectorized_gather_kernel" in k["name"]:
            rows[i][2].append(iv)
        elif any(r in k["name"] for r in ROUTE):
            rows[i][1].append(iv)
        elif t > ffn[i][1]:
            rows[i][4].append(iv)
        else:
            assert t < first_index[i], k["name"]
            rows[i][0].append(iv)
    return [[_union(r) for r in layer] for layer in rows]


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
    want = _expected(path)
    a = ep_trace.load([path])
    # no ProfilerStep: each MoE[...] range (one iteration) is a step (analysis/user_steps.py), the
    # trace's one MoE layer is layer 0 of each; a first iteration 1.5x slower than the others is warm-up
    steps = sorted(a.steps["step"].to_list())
    assert steps in ([1, 2, 3], [2, 3])
    assert any("their steps are the 3 ranges 'MoE[experts=" in n for n in a.notes)
    st = a.stages.filter(pl.col("step").is_not_null()).sort("cpu_start_ns")
    assert st.select("step", "layer", "stage", "tier").rows() == [
        (i, 0, s, t)
        for i in steps
        for s, t in (
            ("route", "cpu_op"),
            ("route", "family"),
            ("expert", "family"),
            ("expert", "range"),
            ("unpermute", "cpu_op"),
        )
    ]
    # busy = union of the row's kernel intervals, within 1 ns per kernel (µs -> ns rounding)
    got = st["busy_ns"].to_list()
    flat = [v for i in steps for v in want[i - 1]]
    assert [abs(g - w) <= 4 for g, w in zip(got, flat, strict=True)] == [True] * len(flat), (got, flat)
    # a family route window spans its own kernels only, never the step (the 1.18 ms window of the old fallback)
    assert (st.filter(pl.col("tier") == "family", pl.col("stage") == "route")["window_ns"] < 100_000).all()
    assert a.tables.collectives.height == 0 and int(a.steps["comm_ns"].sum()) == 0
    assert a.stage_coverage.height == len(steps)  # one row per analysed (rank, step)
    cov = a.stage_coverage.row(0, named=True)
    assert cov["share"] == 1.0 and cov["module_ns"] == cov["token_ns"] == 0 and cov["cpu_op_ns"] > 0
    assert a.unassigned_kernels.height == 0
