"""Rank mapping for nsys input: which process of an export is which global rank, on which host.

Evidence, best first (each rank's ``rank_source`` says which one decided):

1. an explicit map (``--rank-map FILE`` / ``--rank-map R=PATH``; ``{pid: rank}`` for a file with
   several processes) -> ``rank_map``;
2. MPI rank tables: ``MPI_RANKS`` (MPI tracing) or a thread named ``MPI Rank N`` -> ``nvtx``;
3. the launcher environment nsys records in the export (``TARGET_INFO_SYSTEM_ENV`` row
   ``DeviceEnvironment``, ``NAME=VALUE;...``): ``RANK``, ``OMPI_COMM_WORLD_RANK``, ``PMIX_RANK`` /
   ``PMI_RANK``, ``SLURM_PROCID``; local rank from ``LOCAL_RANK`` / ``OMPI_COMM_WORLD_LOCAL_RANK`` /
   ``SLURM_LOCALID``; world size from ``WORLD_SIZE`` / ``OMPI_COMM_WORLD_SIZE`` / ``PMI_SIZE`` /
   ``SLURM_NTASKS``; job from ``SLURM_JOB_ID`` / ``TORCHELASTIC_RUN_ID`` -> ``environment``. It is the
   environment of the profiled process tree, so it names a rank only for a file with one GPU process
   (``srun nsys profile python ...``, ``torchrun ... nsys profile ...``);
4. the NCCL init line in the process's captured stdout / stderr (``ProcessStreams``, with
   ``NCCL_DEBUG=INFO``: ``... NCCL INFO comm 0x... rank R nranks N ... commId 0x... - Init COMPLETE``;
   the communicator with the most ranks is the world) -> ``nccl_init``; its ``commId`` is the job id;
5. ``rank<N>`` in the file name -> ``file_name``.

Without any of them a single-process file gets rank 0 marked ``assumed`` (and a warning naming what
was looked for); several such files of one directory are refused by the directory reader instead of
all becoming rank 0. A file with several GPU processes and no per-process evidence keeps the
deterministic (device, pid) order, ``process_order``, reported in the load report. The host comes
from the export's target-system information (``Hostname``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from ep_trace.errors import ConfigError
from ep_trace.parsers.nsys_source import TableSource
from ep_trace.schema import LoadIssue, conform

__all__ = [
    "assign_ranks",
    "hostname",
    "ranks_table",
    "launcher_env",
    "launcher_topology",
    "nccl_init_ranks",
    "LOOKED_FOR",
]

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
_LOCAL_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
_SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
_JOB_VARS = ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
#: NCCL's init log line (init.cc, NCCL >= 2.x with NCCL_DEBUG=INFO)
_NCCL_INIT = r"NCCL INFO comm 0x[0-9a-fA-F]+ rank (\d+) nranks (\d+)\b[^\n]*?commId (0x[0-9a-fA-F]+)"
#: What the rank search looks at, in order (quoted in warnings and refusals).
LOOKED_FOR = (
    "--rank-map, MPI_RANKS / 'MPI Rank N' thread names, RANK / OMPI_COMM_WORLD_RANK / PMIX_RANK / PMI_RANK / "
    "SLURM_PROCID in the recorded environment, the NCCL init line in captured stdout, 'rank<N>' in the file name"
)


def launcher_env(src: TableSource) -> dict[str, str]:
    """The environment nsys recorded (``TARGET_INFO_SYSTEM_ENV.DeviceEnvironment``), as a dict."""
    if not {"name", "value"} <= set(src.columns("TARGET_INFO_SYSTEM_ENV")):
        return {}
    rows = src.read("TARGET_INFO_SYSTEM_ENV", ["name", "value"]).filter(pl.col("name") == "DeviceEnvironment")
    env: dict[str, str] = {}
    for text in rows["value"].drop_nulls().to_list():
        for item in str(text).split(";"):
            k, sep, v = item.partition("=")
            if sep and k.strip():
                env[k.strip()] = v
    return env


#: Node of the rank: torchrun's GROUP_RANK (torch/distributed/run.py sets it per agent), Slurm's SLURM_NODEID.
_NODE_VARS = ("GROUP_RANK", "SLURM_NODEID")
#: Ranks per node: torchrun's LOCAL_WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_NTASKS_PER_NODE
#: (``8`` or ``8(x2)``: the leading number).
_PER_NODE_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")
#: torchrun's own arguments when nsys profiled the launcher (``torchrun --nproc_per_node=2 ...``; both
#: spellings, torch/distributed/run.py ``--nproc-per-node`` / ``--nproc_per_node``).
_ARG = re.compile(r"^--(nproc[-_]per[-_]node|node[-_]rank)=(\d+)$")


def launcher_topology(src: TableSource) -> dict[str, int | None]:
    """``{"node_rank", "local_world_size"}`` of the profiled process from its launcher, None where absent.

    Read from the recorded environment (:func:`launcher_env`) and the capture metadata
    (``META_DATA_CAPTURE`` rows ``PROCESS_<i>:ENVIRONMENT_VARIABLE`` = ``NAME="value"`` and
    ``PROCESS_<i>:ARGUMENT_<j>``: the launcher's arguments when nsys profiled ``torchrun``).
    """
    env = dict(launcher_env(src))
    args: list[str] = []
    if {"name", "value"} <= set(src.columns("META_DATA_CAPTURE")):
        rows = src.read("META_DATA_CAPTURE", ["name", "value"]).filter(pl.col("name").str.starts_with("PROCESS_"))
        for name, value in rows.iter_rows():
            text = str(value or "")
            if str(name).endswith(":ENVIRONMENT_VARIABLE"):
                k, sep, v = text.partition("=")
                if sep:
                    env.setdefault(k.strip(), v.strip().strip('"'))
            elif ":ARGUMENT_" in str(name):
                args.append(text.strip())
    found = {m.group(1).replace("-", "_"): int(m.group(2)) for a in args if (m := _ARG.match(a))}
    per = _env_int({k: re.sub(r"\(.*\)$", "", env.get(k, "")) for k in _PER_NODE_VARS}, _PER_NODE_VARS)
    node = _env_int(env, _NODE_VARS)
    return {
        "node_rank": node if node is not None else found.get("node_rank"),
        "local_world_size": per if per is not None else found.get("nproc_per_node"),
    }


def _env_int(env: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    for n in names:
        v = env.get(n, "").strip()
        if v.isdigit():
            return int(v)
    return None


def nccl_init_ranks(src: TableSource, proc_of: pl.Expr) -> pl.DataFrame:
    """Process -> (rank, nranks, commId) of its largest NCCL communicator, from ``ProcessStreams``.

    Args:
        src: The export.
        proc_of: Expression mapping ``globalPid`` to the reader's process key.

    Returns:
        Columns ``_proc, _nccl_rank, _nccl_nranks, _comm_id``.
    """
    empty = pl.DataFrame(
        schema={"_proc": pl.Int64, "_nccl_rank": pl.Int64, "_nccl_nranks": pl.Int64, "_comm_id": pl.Utf8}
    )
    if not {"globalPid", "contentId"} <= set(src.columns("ProcessStreams")):
        return empty
    streams = src.read("ProcessStreams", ["globalPid", "contentId"])
    strings = src.read("StringIds", ["id", "value"]).filter(pl.col("id").is_in(streams["contentId"].implode()))
    lines = (
        streams.join(strings, left_on="contentId", right_on="id")
        .select(proc_of.alias("_proc"), pl.col("value").str.extract_all(_NCCL_INIT).alias("_l"))
        .explode("_l")
        .drop_nulls("_l")
    )
    if lines.is_empty():
        return empty
    g = pl.col("_l").str.extract_groups(_NCCL_INIT)
    return (
        lines.select(
            "_proc",
            g.struct.field("1").cast(pl.Int64).alias("_nccl_rank"),
            g.struct.field("2").cast(pl.Int64).alias("_nccl_nranks"),
            g.struct.field("3").alias("_comm_id"),
        )
        .sort(["_proc", "_nccl_nranks"], descending=[False, True])
        .unique("_proc", keep="first")
    )


def assign_ranks(
    procs: pl.DataFrame,
    path: Path,
    rank: int | None,
    rank_map: Mapping[object, int] | None,
    mpi: pl.DataFrame,
    issues: list[LoadIssue],
    env: Mapping[str, str] | None = None,
    nccl: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """One rank per process. ``procs``: ``_proc``, ``pid``, ``device`` (lowest device or null).

    Args:
        procs: The GPU processes of the file.
        path: The file (named in reports).
        rank: The rank an explicit map gives this file, if any.
        rank_map: ``{file | pid: rank}``.
        mpi: ``_proc, _mpi`` (:func:`ep_trace.parsers.nsys._mpi_ranks`).
        issues: Load report to append to.
        env: :func:`launcher_env`.
        nccl: :func:`nccl_init_ranks`.

    Returns:
        ``_proc, rank, rank_source, world_size, local_rank, job_id``.

    Raises:
        ConfigError: a map does not fit the processes of the file.
    """
    env = env or {}
    nccl = nccl if nccl is not None else nccl_init_ranks_empty()
    procs = (
        procs.join(mpi, on="_proc", how="left")
        .join(nccl, on="_proc", how="left")
        .sort("device", "pid", nulls_last=True)
    )
    rmap = {str(k): int(v) for k, v in (rank_map or {}).items()}
    file_rank = next((rmap[k] for k in (str(path), path.name, path.stem) if k in rmap), None)
    name_match = _RANK_IN_NAME.search(path.name)
    env_rank, env_size = _env_int(env, _RANK_VARS), _env_int(env, _SIZE_VARS)
    env_local = _env_int(env, _LOCAL_VARS)
    env_job = next((env[n] for n in _JOB_VARS if env.get(n)), None)
    if procs.height == 1:
        nr = procs["_nccl_rank"][0]
        if file_rank is not None or rank is not None:
            r, how = (file_rank if file_rank is not None else int(rank)), "rank_map"  # type: ignore[arg-type]
        elif procs["_mpi"][0] is not None:
            r, how = int(procs["_mpi"][0]), "nvtx"
        elif env_rank is not None:
            r, how = env_rank, "environment"
        elif nr is not None:
            r, how = int(nr), "nccl_init"
        elif name_match is not None:
            r, how = int(name_match.group(1)), "file_name"
        else:
            r, how = 0, "assumed"
            issues.append(
                LoadIssue(
                    str(path), 0, "warning", f"rank assumed 0: no rank evidence in the file (looked for: {LOOKED_FOR})"
                )
            )
        size = env_size if env_size is not None else procs["_nccl_nranks"][0]
        job = env_job if env_job is not None else procs["_comm_id"][0]
        return procs.select(
            "_proc",
            pl.lit(r, dtype=pl.Int32).alias("rank"),
            pl.lit(how).alias("rank_source"),
            pl.lit(size, dtype=pl.Int32).alias("world_size"),
            pl.lit(env_local, dtype=pl.Int32).alias("local_rank"),
            pl.lit(job, dtype=pl.Utf8).alias("job_id"),
        )
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
    elif procs["_nccl_rank"].null_count() == 0 and procs["_nccl_rank"].n_unique() == procs.height:
        out = procs.select(
            "_proc", pl.col("_nccl_rank").cast(pl.Int32).alias("rank"), pl.lit("nccl_init").alias("rank_source")
        )
    else:
        if rank is not None or file_rank is not None:
            raise ConfigError(
                f"--rank-map: {path} holds {procs.height} GPU processes (pids {', '.join(pids)}) but one rank was given; "
                "map each pid to its rank, e.g. " + " ".join(f"--rank-map pid:{p}={i}" for i, p in enumerate(pids))
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
    return out.join(
        procs.select(
            "_proc",
            pl.col("_nccl_nranks").cast(pl.Int32).alias("world_size"),
            pl.lit(None, pl.Int32).alias("local_rank"),
            pl.col("_comm_id").alias("job_id"),
        ),
        on="_proc",
        how="left",
    )


def nccl_init_ranks_empty() -> pl.DataFrame:
    """An empty :func:`nccl_init_ranks` frame."""
    return pl.DataFrame(
        schema={"_proc": pl.Int64, "_nccl_rank": pl.Int64, "_nccl_nranks": pl.Int64, "_comm_id": pl.Utf8}
    )


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
    topo: Mapping[str, int | None] | None = None,
) -> pl.DataFrame:
    """The canonical ``ranks`` table: one row per mapped process, trace span from its events; ``topo``:
    :func:`launcher_topology` (every process of one file shares its launcher)."""
    topo = topo or {}
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
            "world_size",
            pl.lit(host, dtype=pl.Utf8).alias("host"),
            "local_rank",
            "job_id",
            pl.when(pl.col("device").is_not_null()).then(pl.format("cuda:{}", pl.col("device"))).alias("device"),
            "backend",
            pl.lit(str(path)).alias("source_file"),
            pl.lit("nsys").alias("format"),
            "trace_start_ns",
            "trace_end_ns",
            pl.lit(0, dtype=pl.Int64).alias("clock_offset_ns"),
            "rank_source",
            pl.lit(False).alias("has_sidecar"),
            pl.lit(topo.get("node_rank"), dtype=pl.Int32).alias("node_rank"),
            pl.lit(topo.get("local_world_size"), dtype=pl.Int32).alias("local_world_size"),
        )
        .sort("rank")
    )
    if df["rank"].n_unique() != df.height:
        dup = df.filter(pl.col("rank").is_duplicated())["rank"][0]
        raise ConfigError(f"--rank-map: rank {dup} is given to two processes of {path}")
    return conform("ranks", df)
