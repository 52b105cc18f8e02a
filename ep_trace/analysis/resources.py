"""How much of a rank's transfer time can run behind its compute: the resource side of the what-ifs.

On a GPU rank a transfer runs on the NIC / copy engines (or comm kernels on their own SMs), so
pipelining or overlap can hide it behind compute: hidden fraction 1.

On a CPU rank (gloo) the transfer is CPU work of gloo's worker thread (memcpy and socket calls on
loopback TCP): it hides behind the compute thread only if a core is free for it. With ``c`` cores per
rank the hidden fraction is ``clip(c - 1, 0, 1)``: two cores or more hide it all, one core hides
nothing (the overlapped transfer's CPU time lands on the compute it overlaps). Measured on the 2-core
CI machine, 2 gloo ranks, 2048 tokens: 4-chunk pipelining moved the 1-chunk run's ~9 ms of transfer
per step into compute (compute 56 -> 66 ms per step) and the step got 4 ms longer, not shorter
(benchmarks/README.md, what-if validation). That is machine-dependent: on a 2-vCPU VM (stop 19) the
ranks' cores sat idle 31 % of a 1-chunk step (blocked in the synchronous calls), 4 chunks saved 11-53
ms, and this rule got the sign wrong. That gain was page faults, not hiding: glibc malloc faulted
each large op's output in again, and the 1-chunk path's bigger buffers paid more of it. With the
demo's ranks on jemalloc (stop 22, no faults) 4 chunks cost 10-13 ms per step at 512 and 2048
tokens and 8 chunks 20 ms, the sign this rule gives (benchmarks/README.md).

Cores per rank come from the sidecar: ``cpu_cores`` (the process's affinity mask at capture),
``host_cores`` (the host's count) and the number of loaded ranks on the same host, all assumed busy:
``min(cpu_cores, host_cores / ranks on the host)``. That reads a shared mask (every rank may run
anywhere: the host's cores split between them) and pinned masks (a launcher's or a container's cpuset
per rank: at most its own cores) alike. A CPU rank without these fields (a plain Kineto trace) is
assumed to have a spare core, and a note says so.
"""

from __future__ import annotations

import polars as pl

__all__ = ["transfer_hiding", "UNKNOWN_CORES_NOTE"]

UNKNOWN_CORES_NOTE = (
    "CPU ranks {ranks}: the trace does not say how many cores each rank had; the overlap and pipelining "
    "what-ifs assume a free core for gloo's transfer thread (record the trace with ep-trace's Tracer to know)"
)


def transfer_hiding(ranks: pl.DataFrame, mode: dict[int, str]) -> tuple[dict[int, float], list[int]]:
    """Hidden fraction of each rank's transfers (0..1) and the CPU ranks whose core count is unknown.

    Args:
        ranks: The ``ranks`` table (``rank``, ``host``, ``cpu_cores``, ``host_cores``).
        mode: ``rank -> 'gpu' | 'cpu'`` (``analysis.activity.device_activity``).

    Returns:
        ``(fraction per rank, CPU ranks assumed to have a spare core)``.
    """
    cpu = [r for r, m in mode.items() if m != "gpu"]
    out = {r: 1.0 for r in mode}
    if not cpu:
        return out, []
    need = {"cpu_cores", "host_cores", "host"}
    if not need <= set(ranks.columns):
        return out, sorted(cpu)
    cols = ranks.select("rank", "host", "cpu_cores", "host_cores")
    per_host = cols.group_by("host").agg(pl.len().alias("_n"))
    per_rank = (
        pl.when(pl.col("cpu_cores").is_not_null() & pl.col("host_cores").is_not_null())
        .then(pl.min_horizontal("cpu_cores", pl.col("host_cores") / pl.col("_n")))
        .alias("_per_rank")
    )
    rows = (
        cols.filter(pl.col("rank").is_in(cpu))
        .join(per_host, on="host", how="left", nulls_equal=True)
        .select("rank", (per_rank - 1.0).clip(0.0, 1.0).alias("_h"))
    )
    known = rows.filter(pl.col("_h").is_not_null())
    out |= dict(zip(known["rank"].to_list(), known["_h"].to_list(), strict=True))
    unknown = rows.filter(pl.col("_h").is_null())["rank"].to_list()
    return out, sorted(unknown)
