"""Nsight Systems export tables -> event frames: GPU activity, CUDA API calls, NVTX ranges and domains.

The row readers of :mod:`ep_trace.parsers.nsys` (which assembles them into the canonical tables):
each takes a :class:`~ep_trace.parsers.nsys_source.TableSource` and the resolved ``StringIds`` and
returns one polars frame, discovering the columns the export has (lazy exports omit empty tables).
Facts relied on: shared/reference/nsys.md.
"""

from __future__ import annotations

import polars as pl

from ep_trace.parsers import validate as boundary
from ep_trace.parsers.nsys_source import TableSource

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
GRAPH = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX = "NVTX_EVENTS"

# ENUM_CUDA_MEMCPY_OPER (hard-coded: schema 2.x has no ENUM_* tables).
COPY_KIND = {
    0: "Unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "HtoD",
    12: "DtoH",
    13: "DtoD",
}
# ENUM_NSYS_EVENT_TYPE values of NVTX ranges: 59 push/pop, 60 start/end, 70/71 the NVTXT imports.
RANGE_TYPES = (59, 60, 70, 71)
DOMAIN_CREATE = 75
THREAD_NAME_EVENT = 39
# emit_nvtx appends ", op_id = N", ", seq = N", ", sizes = [...]", ", input_op_ids = [...]".
EMIT_NVTX_SUFFIX = r", (?:op_id|seq|sizes|input_op_ids) = .*$"
TID_MASK = 0xFFFFFF
# torch.profiler's step ranges reach NVTX as "ProfilerStep#N" (emit_nvtx / record_function): events.seq.
STEP = pl.col("name").str.extract(r"^ProfilerStep#(\d+)$").cast(pl.Int64)


def tid_of(g: pl.Expr) -> pl.Expr:
    return g & TID_MASK


def proc_of(g: pl.Expr) -> pl.Expr:
    """Process key of a globalTid: thread bits cleared (works on SQLite's signed int64 too)."""
    return g - (g & TID_MASK)


def pid_of(g: pl.Expr) -> pl.Expr:
    return ((g - (g & TID_MASK)) // (1 << 24)) & TID_MASK


def present(src: TableSource, table: str, wanted: list[str]) -> list[str]:
    have = src.columns(table)
    return [c for c in wanted if c in have]


def read_strings(src: TableSource) -> pl.DataFrame:
    if "StringIds" not in src.tables():
        return pl.DataFrame(schema={"_sid": pl.Int64, "_str": pl.Utf8})
    df = src.read("StringIds", ["id", "value"]).rename({"id": "_sid", "value": "_str"}).cast({"_str": pl.Utf8})
    boundary.check_string_table(getattr(src, "path", "<nsys>"), df, "StringIds", "_sid", "_str")
    return df


def resolve(df: pl.DataFrame, col: str, strings: pl.DataFrame, out: str) -> pl.DataFrame:
    if col not in df.columns:
        return df.with_columns(pl.lit(None, dtype=pl.Utf8).alias(out))
    return df.with_columns(
        pl.col(col).replace_strict(strings["_sid"], strings["_str"], default=None, return_dtype=pl.Utf8).alias(out)
    )


def read_gpu(src: TableSource, strings: pl.DataFrame) -> pl.DataFrame:
    """Kernels, memcpy, memset and whole-graph replays: one frame, capture-relative ns."""
    base = ["start", "end", "deviceId", "streamId", "correlationId", "globalPid"]
    parts = []
    if KERNEL in src.tables():
        cols = present(src, KERNEL, base + ["demangledName", "shortName"])
        k = resolve(
            resolve(src.read(KERNEL, cols), "demangledName", strings, "_dn"), "shortName", strings, "short_name"
        )
        parts.append(
            k.select(
                *base,
                pl.coalesce("_dn", "short_name", pl.lit("<unnamed kernel>")).alias("name"),
                "short_name",
                pl.lit("gpu_kernel").alias("kind"),
                pl.lit(KERNEL).alias("category"),
                pl.lit(None, dtype=pl.Int64).alias("bytes"),
            )
        )
    if MEMCPY in src.tables():
        cols = present(src, MEMCPY, base + ["bytes", "copyKind"])
        m = src.read(MEMCPY, cols)
        kind = (
            pl.col("copyKind").replace_strict(COPY_KIND, default="Unknown", return_dtype=pl.Utf8)
            if "copyKind" in m.columns
            else pl.lit("Unknown")
        )
        parts.append(
            m.select(
                *base,
                pl.format("Memcpy {}", kind).alias("name"),
                pl.lit(None, dtype=pl.Utf8).alias("short_name"),
                pl.lit("gpu_memcpy").alias("kind"),
                pl.lit(MEMCPY).alias("category"),
                (pl.col("bytes") if "bytes" in m.columns else pl.lit(None, dtype=pl.Int64)).alias("bytes"),
            )
        )
    if MEMSET in src.tables():
        m = src.read(MEMSET, present(src, MEMSET, base + ["bytes"]))
        parts.append(
            m.select(
                *base,
                pl.lit("Memset").alias("name"),
                pl.lit(None, dtype=pl.Utf8).alias("short_name"),
                pl.lit("gpu_memset").alias("kind"),
                pl.lit(MEMSET).alias("category"),
                (pl.col("bytes") if "bytes" in m.columns else pl.lit(None, dtype=pl.Int64)).alias("bytes"),
            )
        )
    if GRAPH in src.tables():
        # Graph trace mode `Graph`: a replay is one whole-graph row, not kernel rows (nsys >= 2024).
        g = src.read(GRAPH, present(src, GRAPH, base + ["graphId", "graphExecId"]))
        gid = pl.col("graphExecId") if "graphExecId" in g.columns else pl.lit(None)
        parts.append(
            g.select(
                *base,
                pl.format("CUDA graph (graphExecId={})", gid).alias("name"),
                pl.lit(None, dtype=pl.Utf8).alias("short_name"),
                pl.lit("gpu_kernel").alias("kind"),
                pl.lit(GRAPH).alias("category"),
                pl.lit(None, dtype=pl.Int64).alias("bytes"),
            )
        )
    schema = {
        "start": pl.Int64,
        "end": pl.Int64,
        "deviceId": pl.Int64,
        "streamId": pl.Int64,
        "correlationId": pl.Int64,
        "globalPid": pl.Int64,
        "name": pl.Utf8,
        "short_name": pl.Utf8,
        "kind": pl.Utf8,
        "category": pl.Utf8,
        "bytes": pl.Int64,
    }
    if not parts:
        return pl.DataFrame(schema=schema)
    return pl.concat(
        [
            p.select(
                [pl.col(c).cast(t) if c in p.columns else pl.lit(None, dtype=t).alias(c) for c, t in schema.items()]
            )
            for p in parts
        ]
    )


def read_runtime(src: TableSource, strings: pl.DataFrame) -> pl.DataFrame:
    schema = {
        "start": pl.Int64,
        "end": pl.Int64,
        "eventClass": pl.Int64,
        "globalTid": pl.Int64,
        "correlationId": pl.Int64,
        "name": pl.Utf8,
    }
    if RUNTIME not in src.tables():
        return pl.DataFrame(schema=schema)
    cols = present(src, RUNTIME, ["start", "end", "eventClass", "globalTid", "correlationId", "nameId"])
    rt = src.read(RUNTIME, cols)
    if "eventClass" in rt.columns:
        # eventClass 67 = CUDA backtrace rows duplicating the call (same correlationId; schema 2.9.1).
        rt = rt.filter(pl.col("eventClass").is_in([0, 1]))
    else:
        rt = rt.with_columns(pl.lit(0, dtype=pl.Int64).alias("eventClass"))
    rt = resolve(rt, "nameId", strings, "name")
    # Runtime API names carry a CUDA version suffix (cudaLaunchKernel_v7000); driver names do not.
    return rt.select(
        "start",
        "end",
        "eventClass",
        "globalTid",
        "correlationId",
        pl.col("name").fill_null("<unknown API>").str.replace(r"_v\d+$", ""),
    ).cast(schema)  # type: ignore[arg-type]


def read_nvtx(src: TableSource, strings: pl.DataFrame) -> pl.DataFrame:
    schema = {
        "start": pl.Int64,
        "end": pl.Int64,
        "eventType": pl.Int64,
        "globalTid": pl.Int64,
        "endGlobalTid": pl.Int64,
        "domainId": pl.Int64,
        "name": pl.Utf8,
    }
    if NVTX not in src.tables():
        return pl.DataFrame(schema=schema)
    cols = present(src, NVTX, ["start", "end", "eventType", "globalTid", "endGlobalTid", "domainId", "text", "textId"])
    nv = src.read(NVTX, cols)
    nv = nv.with_columns(
        [pl.lit(None, dtype=pl.Int64).alias(c) for c in ("end", "endGlobalTid", "domainId") if c not in nv.columns]
    )
    nv = resolve(nv, "textId", strings, "_reg")
    text = pl.col("text").cast(pl.Utf8) if "text" in nv.columns else pl.lit(None, dtype=pl.Utf8)
    return nv.select(
        "start", "end", "eventType", "globalTid", "endGlobalTid", "domainId", pl.coalesce(text, "_reg").alias("name")
    ).cast(schema)  # type: ignore[arg-type]


def domains(nv: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """Add ``domain`` to ranges: the name of the eventType-75 row of the same process and domainId.

    Fallback when that row is missing (domain created before the capture / outside a time slice,
    e.g. NCCL's domain in the sliced mfu_2gpu_before export): well-known registered strings name
    it (``nccl*`` API ranges -> ``NCCL``, ``MPI_*`` -> ``MPI``), else ``domain:<id>``.
    Domain 0 / null is the default domain (``domain`` null).
    """
    created = (
        nv.filter(pl.col("eventType") == DOMAIN_CREATE)
        .select(proc_of(pl.col("globalTid")).alias("_proc"), "domainId", pl.col("name").alias("_dname"))
        .unique(["_proc", "domainId"], keep="last")
    )
    guess = (
        ranges.filter(pl.col("domainId").fill_null(0) != 0)
        .group_by("_proc", "domainId")
        .agg(
            pl.when(pl.col("name").str.contains(r"^nccl[A-Z]").any())
            .then(pl.lit("NCCL"))
            .when(pl.col("name").str.contains(r"^MPI_").any())
            .then(pl.lit("MPI"))
            .otherwise(pl.format("domain:{}", pl.col("domainId").first()))
            .alias("_guess")
        )
    )
    return (
        ranges.join(created, on=["_proc", "domainId"], how="left")
        .join(guess, on=["_proc", "domainId"], how="left")
        .with_columns(
            pl.when(pl.col("domainId").fill_null(0) == 0)
            .then(pl.lit(None, dtype=pl.Utf8))
            .otherwise(pl.coalesce("_dname", "_guess"))
            .alias("domain")
        )
        .drop("_dname", "_guess")
    )
