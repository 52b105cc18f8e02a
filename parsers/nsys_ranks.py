"""Rank mapping for nsys input: which process of an export is which global rank.

One file per rank (``nsys profile -o rep_%q{RANK}``): the rank comes from an explicit map, the
caller, an MPI rank recorded in the file, or ``rank<N>`` in the file name. One file with several
processes (``nsys profile torchrun ...``): one rank per process that owns GPU activity (PROCESSES also
lists launchers, shells and nsys itself), ordered deterministically, the mapping reported.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from ep_trace.errors import ConfigError
from ep_trace.parsers.nsys_source import TableSource
from ep_trace.schema import LoadIssue, conform

__all__ = ["assign_ranks", "hostname", "ranks_table"]

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


def assign_ranks(
    procs: pl.DataFrame,
    path: Path,
    rank: int | None,
    rank_map: Mapping[object, int] | None,
    mpi: pl.DataFrame,
    issues: list[LoadIssue],
) -> pl.DataFrame:
    """One rank per process. ``procs``: ``_proc``, ``pid``, ``device`` (lowest device or null).

    Single process: rank_map[file] > ``rank`` > MPI rank > ``rank<N>`` in the file name > 0.
    Several processes: rank_map[pid] for every process, else MPI ranks when every process has
    one, else order by (device, pid); the mapping goes to the load report.
    """
    procs = procs.join(mpi, on="_proc", how="left").sort("device", "pid", nulls_last=True)
    rmap = {str(k): int(v) for k, v in (rank_map or {}).items()}
    file_rank = next((rmap[k] for k in (str(path), path.name, path.stem) if k in rmap), None)
    name_match = _RANK_IN_NAME.search(path.name)
    if procs.height == 1:
        if file_rank is not None:
            r, how = file_rank, "rank_map"
        elif rank is not None:
            r, how = int(rank), "file_name"
        elif procs["_mpi"][0] is not None:
            r, how = int(procs["_mpi"][0]), "nvtx"
        elif name_match is not None:
            r, how = int(name_match.group(1)), "file_name"
        else:
            r, how = 0, "process_order"
        return procs.select("_proc", pl.lit(r, dtype=pl.Int32).alias("rank"), pl.lit(how).alias("rank_source"))
    pids = [str(p) for p in procs["pid"].to_list()]
    if rmap and any(p in rmap for p in pids):
        missing = [p for p in pids if p not in rmap]
        if missing:
            raise ConfigError(
                f"--rank-map: {path} holds GPU processes {', '.join(pids)}; no rank given for pid {', '.join(missing)}"
            )
        out = procs.select(
            "_proc", pl.Series("rank", [rmap[p] for p in pids], dtype=pl.Int32), pl.lit("rank_map").alias("rank_source")
        )
    elif procs["_mpi"].null_count() == 0 and procs["_mpi"].n_unique() == procs.height:
        out = procs.select("_proc", pl.col("_mpi").cast(pl.Int32).alias("rank"), pl.lit("nvtx").alias("rank_source"))
    else:
        if rank is not None or file_rank is not None:
            raise ConfigError(
                f"--rank-map: {path} holds {procs.height} GPU processes (pids {', '.join(pids)}) but one rank was given; "
                "map each pid to its rank, e.g. --rank-map " + ",".join(f"{p}={i}" for i, p in enumerate(pids))
            )
        out = procs.select(
            "_proc", pl.int_range(pl.len(), dtype=pl.Int32).alias("rank"), pl.lit("process_order").alias("rank_source")
        )
    mapping = ", ".join(
        f"pid {p} (device {d if d is not None else '-'}) -> rank {r}"
        for p, d, r in zip(procs["pid"].to_list(), procs["device"].to_list(), out["rank"].to_list(), strict=False)
    )
    how = out["rank_source"][0]
    issues.append(
        LoadIssue(
            str(path),
            None,
            "warning",
            f"{procs.height} GPU processes in one file, one rank each ({how}): {mapping}; pass a rank map to override",
        )
    )
    return out


def hostname(src: TableSource) -> str | None:
    """Capture host from ``TARGET_INFO_SYSTEM_ENV`` (``Hostname`` row), when recorded."""
    if {"name", "value"} <= set(src.columns("TARGET_INFO_SYSTEM_ENV")):
        env = src.read("TARGET_INFO_SYSTEM_ENV", ["name", "value"]).filter(pl.col("name") == "Hostname")
        if env.height:
            return str(env["value"][0])
    return None


def ranks_table(
    events: pl.DataFrame,
    collectives: pl.DataFrame,
    rank_of: pl.DataFrame,
    owners: pl.DataFrame,
    path: Path,
    host: str | None,
) -> pl.DataFrame:
    """The canonical ``ranks`` table: one row per mapped process, trace span from its events."""
    span = events.group_by("rank").agg(
        pl.col("start_ns").min().alias("trace_start_ns"), pl.col("end_ns").max().alias("trace_end_ns")
    )
    backend = collectives.group_by("rank").agg(pl.col("backend").drop_nulls().first())
    df = (
        rank_of.join(owners.select("_proc", "device"), on="_proc", how="left")
        .join(span, on="rank", how="left")
        .join(backend, on="rank", how="left")
        .select(
            "rank",
            pl.lit(host, dtype=pl.Utf8).alias("host"),
            pl.when(pl.col("device").is_not_null()).then(pl.format("cuda:{}", pl.col("device"))).alias("device"),
            "backend",
            pl.lit(str(path)).alias("source_file"),
            pl.lit("nsys").alias("format"),
            "trace_start_ns",
            "trace_end_ns",
            pl.lit(0, dtype=pl.Int64).alias("clock_offset_ns"),
            "rank_source",
            pl.lit(False).alias("has_sidecar"),
        )
        .sort("rank")
    )
    if df["rank"].n_unique() != df.height:
        dup = df.filter(pl.col("rank").is_duplicated())["rank"][0]
        raise ConfigError(f"--rank-map: rank {dup} is given to two processes of {path}")
    return conform("ranks", df)
