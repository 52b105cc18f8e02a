"""The pure checks of benchmarks/gpu/compare.py on a real CUDA Kineto trace and the CUPTI golden data."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import polars as pl
import pytest

from ep_trace.capture.cupti.convert import records_to_events
from ep_trace.parsers.kineto import read_kineto

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_compare", ROOT / "benchmarks" / "gpu" / "compare.py")
C = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(C)  # type: ignore[union-attr]

B = 1_764_400_000_000_000_000 + 250


@pytest.fixture(scope="module")
def nccl_events(external_dir: Path) -> pl.DataFrame:
    return read_kineto(external_dir / "kineto" / "hta_nccl_metadata" / "nccl_data.json.gz").events


@pytest.fixture(scope="module")
def cupti_events() -> pl.DataFrame:
    doc = json.loads((ROOT / "tests" / "data" / "cupti" / "moe_step_records.json").read_text())
    return records_to_events(doc["records"], rank=0, ranges=doc["ranges"], clock_offset_ns=doc["clock_offset_ns"])


def test_gpu_annotation_spans_real_cuda_trace(nccl_events: pl.DataFrame) -> None:
    """Known answer (external/README): each nccl:* span starts 1.0 us before and ends 0.5 us after its kernel."""
    r = C.check_gpu_annotations(nccl_events, r"^nccl:")
    assert r == {
        "spans": 21,
        "envelopes": 21,
        "matched": 21,
        "start_dev_ns": [-1000, -1000],
        "end_dev_ns": [500, 500],
        "names": {"nccl:all_reduce": 15, "nccl:broadcast": 6},
    }


def test_kernel_list_comparison(nccl_events: pl.DataFrame) -> None:
    sk = C.step_kernels(nccl_events)
    assert sk.group_by("step").len().sort("step").rows() == [(4, 900), (5, 900), (6, 900)]
    same = C.compare_kernel_lists(sk, sk)
    assert (same["steps"], same["same_multiset_steps"], same["paired_kernels"], same["median_abs_dur_diff_ns"]) == (
        3,
        3,
        2700,
        0,
    )
    # b: one kernel of step 5 missing, every kernel of step 4 100 ns longer
    b = sk.filter(~((pl.col("step") == 5) & (pl.col("idx") == 10))).with_columns(
        pl.when(pl.col("step") == 4).then(pl.col("dur_ns") + 100).otherwise(pl.col("dur_ns")).alias("dur_ns")
    )
    r = C.compare_kernel_lists(sk, b)
    assert (r["steps"], r["kernels_b"], r["same_multiset_steps"], r["same_sequence_steps"], r["paired_kernels"]) == (
        3,
        2699,
        2,
        2,
        1800,
    )
    assert (r["median_abs_dur_diff_ns"], r["p95_abs_dur_diff_ns"], r["median_abs_rel_start_diff_ns"]) == (100, 100, 0)


def test_cupti_stage_envelopes(cupti_events: pl.DataFrame) -> None:
    env = C.expected_envelopes(cupti_events)
    assert env.select("name", "stream", pl.col("exp_start_ns") - B, pl.col("exp_end_ns") - B, "n_kernels").rows() == [
        ("ep:dispatch:l0:fwd", 7, 1500, 2500, 1),
        ("ep:dispatch:l0:fwd", 13, 4000, 8000, 1),
        ("ep:expert:l0:fwd", 7, 10500, 18000, 1),
    ]
    assert C.stage_durations(cupti_events).rows() == [("ep:dispatch:l0:fwd", 2, 2500), ("ep:expert:l0:fwd", 1, 7500)]
    sk = C.step_kernels(cupti_events)
    assert sk.select("step", "idx", "stream", "rel_start_ns").rows() == [
        (3, 0, 7, 0),
        (3, 1, 13, 2500),
        (3, 2, 7, 9000),
        (3, 3, 7, 19500),
    ]
