"""Builders of synthetic canonical tables with exactly known answers."""

from __future__ import annotations

import polars as pl
import pytest

from ep_trace.schema import TraceTables, conform

T0 = 1_700_000_000_000_000_000


def build(ranks: list[dict], events: list[dict], colls: list[dict], **extra) -> TraceTables:
    """Canonical tables from row dicts (missing nullable columns become null)."""
    r = conform(
        "ranks",
        pl.DataFrame(
            [
                {
                    "source_file": f"rank{x['rank']}.json",
                    "format": "kineto",
                    "clock_offset_ns": 0,
                    "rank_source": "distributedInfo",
                    "has_sidecar": False,
                    **x,
                }
                for x in ranks
            ],
            infer_schema_length=None,
        ),
    )
    for i, e in enumerate(events):
        e.setdefault("event_id", i)
    e = conform("events", pl.DataFrame(events, infer_schema_length=None))
    c = (
        conform(
            "collectives",
            pl.DataFrame(
                [
                    {
                        "collective": "all_to_allv",
                        "op_name": "c10d::alltoall_base_",
                        "n_kernels": 1,
                        "splits_truncated": False,
                        **x,
                    }
                    for x in colls
                ],
                infer_schema_length=None,
            ),
        )
        if colls
        else conform(
            "collectives",
            pl.DataFrame(
                {
                    "rank": [],
                    "coll_id": [],
                    "collective": [],
                    "op_name": [],
                    "ordinal": [],
                    "start_ns": [],
                    "end_ns": [],
                    "n_kernels": [],
                    "splits_truncated": [],
                }
            ),
        )
    )
    extra = {k: conform(k, v) for k, v in extra.items()}
    return TraceTables(ranks=r, events=e, collectives=c, **extra).validate("synthetic")


def gpu_job(starts: list[int], end: int, host_shift: dict[str, int] | None = None, splits=None) -> TraceTables:
    """4 GPU ranks on 2 hosts, one step, one all_to_all per rank (comm kernel [s_r, end]) and one
    compute kernel [550 µs, 800 µs]; host B's clock shifted by ``host_shift['B']`` ns."""
    host_shift = host_shift or {}
    ranks, events, colls = [], [], []
    for r, s in enumerate(starts):
        host = "A" if r < 2 else "B"
        sh = T0 + host_shift.get(host, 0)
        ranks.append({"rank": r, "world_size": len(starts), "host": host, "num_experts": 4})
        eid = 100 * r
        events += [
            {
                "rank": r,
                "event_id": eid,
                "kind": "cpu_annotation",
                "name": "ProfilerStep#1",
                "tid": 1,
                "start_ns": sh,
                "end_ns": sh + 1_000_000,
                "seq": 1,
            },
            {
                "rank": r,
                "event_id": eid + 1,
                "kind": "cpu_annotation",
                "name": "ep:dispatch:l0:fwd",
                "tid": 1,
                "start_ns": sh + 100_000,
                "end_ns": sh + 400_000,
            },
            {
                "rank": r,
                "event_id": eid + 2,
                "kind": "cpu_annotation",
                "name": "ep:expert:l0:fwd",
                "tid": 1,
                "start_ns": sh + 400_000,
                "end_ns": sh + 700_000,
            },
            {
                "rank": r,
                "event_id": eid + 3,
                "kind": "runtime",
                "name": "cudaLaunchKernel",
                "tid": 1,
                "start_ns": sh + 150_000,
                "end_ns": sh + 151_000,
            },
            {
                "rank": r,
                "event_id": eid + 4,
                "kind": "runtime",
                "name": "cudaLaunchKernel",
                "tid": 1,
                "start_ns": sh + 450_000,
                "end_ns": sh + 451_000,
            },
            {
                "rank": r,
                "event_id": eid + 5,
                "kind": "gpu_kernel",
                "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
                "stream": 20,
                "start_ns": sh + s,
                "end_ns": sh + end,
                "launch_id": eid + 3,
                "coll_id": 0,
            },
            {
                "rank": r,
                "event_id": eid + 6,
                "kind": "gpu_kernel",
                "name": "cutlass_grouped_gemm_kernel",
                "stream": 7,
                "start_ns": sh + 550_000,
                "end_ns": sh + 800_000,
                "launch_id": eid + 4,
            },
        ]
        c = {
            "rank": r,
            "coll_id": 0,
            "pg_name": "0",
            "group_ranks": list(range(len(starts))),
            "group_size": len(starts),
            "ordinal": 0,
            "cpu_start_ns": sh + 150_000,
            "cpu_end_ns": sh + 151_000,
            "start_ns": sh + s,
            "end_ns": sh + end,
            "row_bytes": 1024,
            "dtype": "Float",
        }
        if splits is not None:
            c["in_splits"] = splits[r]
            c["out_splits"] = [splits[j][r] for j in range(len(starts))]
            c["layer"], c["direction"] = 0, "dispatch"
        colls.append(c)
    return build(ranks, events, colls)


@pytest.fixture()
def synth():
    """The builders, for tests."""
    return {"build": build, "gpu_job": gpu_job, "T0": T0}
