"""Fixtures of the parser tests: tiny hand-written Kineto traces (each rule in a few events)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

BASE = 1_700_000_000_000_000_000

#: ``record_param_comms`` metadata of a 2-rank all_to_allv (torch 2.x keys), without the per-call
#: ``Seq`` / ``Comms Id``.
A2AV_META: dict[str, Any] = {
    "Collective name": "all_to_allv",
    "dtype": "BFloat16",
    "In msg nelems": 8 * 1024,
    "Out msg nelems": 6 * 1024,
    "Group size": 2,
    "In split size": "[3, 5]",
    "Out split size": "[4, 2]",
    "Process Group Name": "3",
    "Process Group Description": "ep_group",
    "Process Group Ranks": "[0, 1]",
    "Global rank start": 0,
    "Global rank stride": 1,
}


def write_trace(
    path: Path,
    events: list[dict[str, Any]],
    *,
    base: int | None = BASE,
    rank: int | None = 0,
    world_size: int = 2,
    backend: str = "nccl",
    extra: dict[str, Any] | None = None,
    indent: int | None = None,
) -> Path:
    """Write a Kineto-shaped document (gzip when the name ends in .gz)."""
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": []}
    if rank is not None:
        doc["distributedInfo"] = {"backend": backend, "rank": rank, "world_size": world_size}
    doc["traceEvents"] = events
    doc.update(extra or {})
    if base is not None:
        doc["baseTimeNanoseconds"] = base
    text = json.dumps(doc, indent=indent).encode()
    path.write_bytes(gzip.compress(text) if path.name.endswith(".gz") else text)
    return path


def x(cat: str, name: str, ts: float, dur: float, pid: Any = 100, tid: Any = 100, **args: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = dict(args)
    return ev


def nccl_call(
    ts: float,
    ext: int,
    corr: int,
    meta: dict[str, Any],
    *,
    kernel_dur: float = 50.0,
    kernels: int = 1,
    kernel_name: str = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
    copy_meta: bool = False,
) -> list[dict[str, Any]]:
    """c10d::alltoall_base_ > record_param_comms(meta) > nccl:all_to_all > cudaLaunchKernel x kernels."""
    evs = [
        x("cpu_op", "c10d::alltoall_base_", ts, 40, **{"External id": ext}),
        x("cpu_op", "record_param_comms", ts + 1, 38, **{"External id": ext + 1, **meta}),
        x("user_annotation", "nccl:all_to_all", ts + 2, 36, **{"External id": ext + 2}),
    ]
    for k in range(kernels):
        evs.append(
            x("cuda_runtime", "cudaLaunchKernel", ts + 3 + k, 1, correlation=corr + k, **{"External id": ext + 1})
        )
        kargs = {"correlation": corr + k, "External id": ext + 1, "stream": 40, "device": 0}
        if copy_meta:
            kargs.update({k2: v for k2, v in meta.items() if k2 != "Global rank start"})
        evs.append(x("kernel", kernel_name, ts + 100 + 60 * k, kernel_dur, pid=0, tid=40, **kargs))
    return evs


@pytest.fixture()
def kt() -> SimpleNamespace:
    """Helpers to build traces: ``kt.write_trace``, ``kt.x``, ``kt.nccl_call``, ``kt.BASE``."""
    return SimpleNamespace(write_trace=write_trace, x=x, nccl_call=nccl_call, BASE=BASE)
