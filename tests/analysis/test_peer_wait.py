"""all_to_allv wait is restricted to the peers a rank exchanges rows with (kineto.md §10.4)."""

from __future__ import annotations

import polars as pl

from ep_trace.analysis import analyze

from .conftest import T0, build

US = 1_000


def _job(splits: list[list[int]], starts_us: list[int], ends_us: list[int]):
    ranks, events, colls = [], [], []
    n = len(splits)
    for r in range(n):
        ranks.append({"rank": r, "world_size": n, "host": "A"})
        e0 = 10 * r
        events += [
            {
                "rank": r,
                "event_id": e0,
                "kind": "cpu_annotation",
                "name": "ProfilerStep#1",
                "tid": 1,
                "start_ns": T0,
                "end_ns": T0 + 1000 * US,
                "seq": 1,
            },
            {
                "rank": r,
                "event_id": e0 + 1,
                "kind": "runtime",
                "name": "cudaLaunchKernel",
                "tid": 1,
                "start_ns": T0 + 1 * US,
                "end_ns": T0 + 2 * US,
            },
            {
                "rank": r,
                "event_id": e0 + 2,
                "kind": "gpu_kernel",
                "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
                "stream": 20,
                "start_ns": T0 + starts_us[r] * US,
                "end_ns": T0 + ends_us[r] * US,
                "launch_id": e0 + 1,
                "coll_id": 0,
            },
        ]
        colls.append(
            {
                "rank": r,
                "coll_id": 0,
                "pg_name": "0",
                "group_ranks": list(range(n)),
                "group_size": n,
                "ordinal": 0,
                "cpu_start_ns": T0 + 1 * US,
                "cpu_end_ns": T0 + 2 * US,
                "start_ns": T0 + starts_us[r] * US,
                "end_ns": T0 + ends_us[r] * US,
                "row_bytes": 1024,
                "dtype": "Float",
                "in_splits": splits[r],
                "out_splits": [splits[j][r] for j in range(n)],
            }
        )
    return build(ranks, events, colls)


def test_rank_without_rows_to_the_last_arriver_does_not_wait_for_it() -> None:
    # ranks 0 and 1 only exchange with each other; rank 2 (last, at 500 µs) only talks to itself
    a = analyze(_job([[5, 3, 0], [2, 4, 0], [0, 0, 7]], starts_us=[0, 100, 500], ends_us=[200, 200, 600]))
    assert a.calls["valid"].to_list() == [True]  # rank 0 ending before rank 2 arrives is causal here
    assert a.calls["last_rank"].to_list() == [2]
    cr = a.call_ranks.sort("rank")
    assert cr["waited_for"].to_list() == [1, 1, 2]
    assert cr["wait_ns"].to_list() == [100 * US, 0, 0]
    assert cr["transfer_ns"].to_list() == [100 * US, 100 * US, 100 * US]
    assert a.wait_matrix.rows() == [("0", 0, 1, 100 * US)]


def test_full_exchange_waits_for_the_last_arriver() -> None:
    a = analyze(_job([[1, 1, 1], [1, 1, 1], [1, 1, 1]], starts_us=[0, 100, 500], ends_us=[600, 600, 600]))
    cr = a.call_ranks.sort("rank")
    assert cr["waited_for"].to_list() == [2, 2, 2]
    assert cr["wait_ns"].to_list() == [500 * US, 400 * US, 0]
    assert a.wait_matrix.sort("waiter").rows() == [("0", 0, 2, 500 * US), ("0", 1, 2, 400 * US)]
    assert a.stragglers.filter(pl.col("rank") == 2)["induced_wait_ns"].to_list() == [900 * US]
