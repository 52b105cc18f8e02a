"""benchmarks/gpu_check.sh and benchmarks/gpu/check.py: syntax, importability, results block (no GPU run)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    try:
        spec = importlib.util.spec_from_file_location(f"gpu_{name}", ROOT / "benchmarks" / "gpu" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        return mod
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "gpu"))


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_shell_script_syntax() -> None:
    r = subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--bogus"], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip() == "usage: bash benchmarks/gpu_check.sh [--fetch-wheels|--dry-run]"


def test_results_block() -> None:
    check = _load("check")
    res = {
        "date": "2026-11-29 16:00 UTC",
        "env": {
            "gpu_name": "NVIDIA H200",
            "gpus": 1,
            "torch": "2.11.0+cu130",
            "cuda": "13.0",
            "nccl": "2.27.7",
            "cupti-python": "13.0.1",
        },
        "steps": 20,
        "warmup": 5,
        "jobs": {
            1: {
                "none": {
                    "backend": "nccl",
                    "staged_comm": False,
                    "workload": "builtin",
                    "median_ms": 2.0,
                    "p95_ms": 2.2,
                },
                "cupti": {
                    "backend": "nccl",
                    "staged_comm": False,
                    "workload": "builtin",
                    "median_ms": 2.1,
                    "p95_ms": 2.4,
                    "flush_median_ms": 0.8,
                },
            }
        },
        "compare": {
            1: {
                "kernels_kineto_vs_cupti": {
                    "steps": 20,
                    "kernels_a": 900,
                    "kernels_b": 900,
                    "same_multiset_steps": 20,
                    "same_sequence_steps": 19,
                    "paired_kernels": 855,
                    "median_abs_dur_diff_ns": 96,
                    "p95_abs_dur_diff_ns": 640,
                    "median_abs_rel_start_diff_ns": 1200,
                    "p95_abs_rel_start_diff_ns": 9000,
                    "median_dur_ratio": 0.99,
                },
                "kineto_comm_kernels": 40,
                "cupti_comm_kernels": 40,
                "kineto_stage_ns": [("ep:dispatch:l0:fwd", 20, 15000)],
                "cupti_stage_ns": [("ep:dispatch:l0:fwd", 20, 14500)],
            }
        },
    }
    assert check.results_block(res).splitlines() == [
        "GPU check 2026-11-29 16:00 UTC: NVIDIA H200 x1, torch 2.11.0+cu130, CUDA 13.0, NCCL 2.27.7, cupti-python 13.0.1; "
        "20 measured steps after 5 warm-up, median / p95 of rank 0.",
        "",
        "| world | comm | workload | mode | median step ms | p95 ms | overhead vs none | flush ms (median) |",
        "|---|---|---|---|---|---|---|---|",
        "| 1 | nccl | builtin | none | 2.0 | 2.2 | 1.000 | - |",
        "| 1 | nccl | builtin | cupti | 2.1 | 2.4 | 1.050 | 0.8 |",
        "",
        "World 1, rank 0, Kineto vs CUPTI:",
        "- kernels: 20 steps, 900 (Kineto) vs 900 (CUPTI) kernels; same name multiset in 20/20 steps, same order in 19; "
        "855 paired kernels: |d duration| median 96 ns, p95 640 ns; |d start offset in step| median 1200 ns, p95 9000 ns; "
        "duration ratio CUPTI/Kineto median 0.99",
        "- comm kernels (comm_classifier): Kineto 40, CUPTI 40",
        "- stage envelope median us (Kineto / CUPTI): ep:dispatch:l0:fwd 15.0 / 14.5",
    ]


def test_check_refuses_cpu_without_dry_run(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    check = _load("check")
    assert check.main(["--out", str(tmp_path / "o"), "--work", str(tmp_path / "w")]) == 2
