"""Canonical tables: the contract between the parsers and the analysis.

Every parser (Kineto, Nsight, CUPTI) produces exactly these tables; the analysis reads nothing
else. Declared once, here, as polars schemas with a one-line doc per column. Conventions:

* times are int64 **nanoseconds since the Unix epoch** on the rank's own clock (``start_ns``,
  ``end_ns``); a per-host clock offset estimated later is recorded in ``ranks.clock_offset_ns``
  and never folded into the event times by the parsers;
* every row carries ``rank`` (global rank, int32);
* ids (``event_id``, ``coll_id``) are unique within a rank only;
* split lists are **rows of dim 0**, in group-local order (index j = j-th rank of ``group_ranks``).

:func:`validate` is called by every parser at its boundary (types, ``end_ns >= start_ns``, rank
present); the analysis trusts its inputs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal, cast

import polars as pl

__all__ = [
    "SCHEMA_VERSION",
    "EVENT_KINDS",
    "SCHEMAS",
    "COLUMN_DOCS",
    "RANKS",
    "EVENTS",
    "COLLECTIVES",
    "STAGES",
    "ROUTING_COUNTS",
    "ROUTING_MATRIX",
    "PLACEMENT",
    "LoadIssue",
    "TraceTables",
    "empty",
    "conform",
    "validate",
]

#: Version of the canonical tables' layout; part of the ingest cache key (2: ``events.kind`` an
#: Enum; 3: ``events.category`` Categorical; 4: ``events.seq`` also on serving engines' iteration
#: annotations where a rank has no ``ProfilerStep``, ``parsers/serving_steps.py``; 5: kind
#: ``python_frame``; 6: gloo calls' process group read from their worker threads,
#: ``parsers/kineto_gloo_groups.py``; ``ranks.node_rank`` / ``local_world_size``, ``routing_counts.tokens`` /
#: ``top_k`` / ``dropped`` / ``padded``, ``collectives.link_delay_ns``; 7: ``placement.first_step``, so that
#: the sidecar's ``placement`` records (a layer re-placed from a step on: an EPLB rearrangement, each flip of
#: ``ep-trace demo --alt-placement``) are kept beside ``meta.placement`` instead of dropped; a cache of 6 has
#: only the meta's placement and would check every re-placed step against the wrong one).
SCHEMA_VERSION = 7

#: Values of ``events.kind``. ``comm_worker`` = a gloo (or other CPU backend) worker-thread range
#: that performs a collective's transfer; ``python_frame`` = a Python call frame of the profiler's
#: stack tracer (Kineto ``python_function``, ``with_stack=True``: vLLM's and SGLang's default): call
#: context that encloses the ops, never work itself (read as ``cpu_op`` it covered every collective
#: call of a CPU rank and turned its exposed communication into "overlapped"); ``other`` = an
#: unknown category kept, never an error.
EVENT_KINDS: tuple[str, ...] = (
    "gpu_kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_annotation",
    "cpu_annotation",
    "cpu_op",
    "runtime",
    "comm_worker",
    "other",
    "python_frame",
)

_I32 = pl.Int32
_I64 = pl.Int64
_S = pl.Utf8
_B = pl.Boolean

# (name, dtype, nullable, doc)
_RANKS_COLS = [
    ("rank", _I32, False, "global rank"),
    ("world_size", _I32, True, "world size the file claims (distributedInfo / sidecar)"),
    ("host", _S, True, "host name"),
    ("local_rank", _I32, True, "rank within its host"),
    ("device", _S, True, "device the rank computes on, e.g. 'cuda:3' or 'cpu'"),
    (
        "cpu_cores",
        _I32,
        True,
        "CPU cores the rank's process could run on at capture (sched_getaffinity; sidecar): sets how much of a "
        "CPU-executed transfer (gloo) can hide behind compute in the what-ifs",
    ),
    ("host_cores", _I32, True, "CPU cores of the rank's host (os.cpu_count at capture; sidecar)"),
    ("backend", _S, True, "communication backend: 'nccl', 'gloo', ..."),
    ("source_file", _S, False, "trace file the rank was read from"),
    ("format", _S, False, "'kineto', 'nsys' or 'cupti'"),
    ("job_id", _S, True, "identifier of the job, used to reject mixed directories"),
    ("trace_start_ns", _I64, True, "first event start, epoch ns"),
    ("trace_end_ns", _I64, True, "last event end, epoch ns"),
    ("clock_offset_ns", _I64, False, "offset added to this rank's times to align hosts (0 = none)"),
    (
        "rank_source",
        _S,
        False,
        "where the rank came from: 'distributedInfo', 'file_name', 'sidecar', 'nvtx', 'rank_map', 'process_order', 'cupti_metadata' (footer of a CUPTI events file)",
    ),
    ("has_sidecar", _B, False, "an ep-trace sidecar (rank{r}.ep.jsonl) was merged"),
    ("ep_group_ranks", pl.List(_I32), True, "global ranks of the EP group (sidecar)"),
    ("hidden_size", _I64, True, "model hidden size (sidecar)"),
    ("dtype", _S, True, "activation dtype of dispatched tokens (sidecar)"),
    ("num_experts", _I32, True, "number of routed experts (sidecar)"),
    ("top_k", _I32, True, "experts per token (sidecar)"),
    ("torch_version", _S, True, "torch version of the capture"),
    ("ep_trace_version", _S, True, "ep-trace version of the capture"),
    (
        "node_rank",
        _I32,
        True,
        "index of the rank's node from its launcher (torchrun GROUP_RANK / --node-rank, SLURM_NODEID), when recorded",
    ),
    (
        "local_world_size",
        _I32,
        True,
        "ranks per node from the launcher (LOCAL_WORLD_SIZE, torchrun --nproc-per-node, SLURM_NTASKS_PER_NODE)",
    ),
]

_EVENTS_COLS = [
    ("rank", _I32, False, "global rank"),
    ("event_id", _I64, False, "row id, unique within the rank"),
    ("kind", pl.Enum(EVENT_KINDS), False, "one of EVENT_KINDS (an Enum: 1 byte per row, where a String costs 16)"),
    ("name", _S, False, "kernel / op / range name as recorded"),
    (
        "category",
        pl.Categorical(),
        True,
        "raw category of the source (Kineto 'cat', nsys table); Categorical: 4 bytes per row",
    ),
    ("domain", _S, True, "NVTX domain (nsys), None elsewhere"),
    ("device", _I32, True, "GPU device index for device activity"),
    ("stream", _I64, True, "GPU stream for device activity"),
    ("pid", _I64, True, "host process id (device pid for Kineto GPU rows)"),
    ("tid", _I64, True, "host thread id (stream for Kineto GPU rows)"),
    ("start_ns", _I64, False, "start, epoch ns"),
    ("end_ns", _I64, False, "end, epoch ns (>= start_ns)"),
    ("correlation", _I64, True, "CUPTI correlation id (GPU activity and its runtime launch)"),
    ("external_id", _I64, True, "Kineto 'External id' / nsys external correlation"),
    ("launch_id", _I64, True, "event_id of the runtime call that launched this GPU op"),
    ("op_id", _I64, True, "event_id of the innermost CPU op / annotation enclosing the launch"),
    ("coll_id", _I64, True, "collectives.coll_id this event implements (comm kernels, gloo ranges)"),
    ("bytes", _I64, True, "bytes moved (memcpy / memset)"),
    (
        "seq",
        _I64,
        True,
        "profiler-step number of 'ProfilerStep#N' rows (on a rank without them: the ordinal of a serving "
        "engine's iteration annotation, parsers/serving_steps.py), else None",
    ),
]

_COLLECTIVES_COLS = [
    ("rank", _I32, False, "global rank"),
    ("coll_id", _I64, False, "row id, unique within the rank"),
    (
        "collective",
        _S,
        False,
        "normalised type: all_to_all, all_to_allv, allreduce, allgather, reduce_scatter, broadcast, send, recv, barrier, unknown",
    ),
    ("op_name", _S, False, "name of the launching op, e.g. 'c10d::alltoall_base_', 'nccl:all_to_all'"),
    ("backend", _S, True, "'nccl', 'gloo', 'deepep', ..."),
    ("pg_name", _S, True, "process group name / id; None when the trace cannot tell"),
    ("pg_desc", _S, True, "process group description"),
    ("group_ranks", pl.List(_I32), True, "global ranks of the group, group-local order"),
    ("group_size", _I32, True, "size of the group"),
    ("seq", _I64, True, "per-group collective sequence number ('Seq'); None when absent"),
    ("comms_id", pl.UInt64, True, "'Comms Id' hash, equal on all ranks (may exceed int64)"),
    (
        "ordinal",
        _I64,
        False,
        "0-based ordinal of this call among the rank's calls of the same pg_name (None pg = one group), by cpu_start_ns",
    ),
    ("op_id", _I64, True, "event_id of the launching CPU op"),
    ("cpu_start_ns", _I64, True, "host op start, epoch ns"),
    ("cpu_end_ns", _I64, True, "host op end, epoch ns"),
    ("start_ns", _I64, False, "start of the device / worker activity implementing the call, epoch ns"),
    ("end_ns", _I64, False, "end of that activity, epoch ns"),
    ("n_kernels", _I32, False, "number of kernels / worker ranges aggregated into the call"),
    ("in_splits", pl.List(_I64), True, "rows sent to each group-local peer (None = not a v-collective or unknown)"),
    ("out_splits", pl.List(_I64), True, "rows received from each group-local peer"),
    ("splits_truncated", _B, False, "Kineto truncated a list beyond 30 entries and no sidecar replaced it"),
    ("splits_source", _S, True, "'kineto', 'concrete_inputs', 'sidecar' or None"),
    ("in_nelems", _I64, True, "input element count"),
    ("out_nelems", _I64, True, "output element count"),
    ("dtype", _S, True, "element dtype as recorded ('Float', 'BFloat16', 'float32', ...)"),
    ("row_bytes", _I64, True, "bytes per row of dim 0 (elements per row x itemsize)"),
    ("peer_rank", _I32, True, "global rank of the p2p peer (send / recv)"),
    ("layer", _I32, True, "MoE layer (sidecar), when known"),
    ("direction", _S, True, "'dispatch', 'combine', 'count' (sidecar), when known"),
    (
        "link_delay_ns",
        _I64,
        True,
        "an injected link delay the caller waited just before the call (sidecar a2a link_delay_ns: ep-trace demo's "
        "emulated link), ns; part of the call's link cost",
    ),
]

_STAGES_COLS = [
    ("rank", _I32, False, "global rank"),
    ("step", _I64, True, "profiler step"),
    ("layer", _I32, True, "MoE layer"),
    ("microbatch", _I32, True, "micro-batch"),
    ("phase", _S, True, "'fwd' or 'bwd'"),
    ("stage", _S, False, "route, permute, dispatch, expert, combine, unpermute, shared_expert, attn"),
    ("cpu_start_ns", _I64, False, "host range start, epoch ns"),
    ("cpu_end_ns", _I64, False, "host range end, epoch ns"),
    ("start_ns", _I64, True, "first start of the device work attributed to the stage"),
    ("end_ns", _I64, True, "last end of that work"),
    ("window_ns", _I64, False, "end_ns - start_ns (0 when no device work)"),
    ("busy_ns", _I64, False, "|union of the attributed device intervals|"),
    (
        "method",
        _S,
        False,
        "how the stage was detected: 'ep_trace', 'preset:<name>', 'kernel_family', 'module:<block class>', 'cpu_op', "
        "'name_token' (docs/metrics.md, Stages)",
    ),
]

_ROUTING_COUNTS_COLS = [
    ("rank", _I32, False, "rank whose router produced the counts"),
    ("step", _I64, False, "step"),
    ("layer", _I32, False, "MoE layer"),
    ("microbatch", _I32, False, "micro-batch (0 when not micro-batched)"),
    ("expert", _I32, False, "global expert id"),
    ("count", _I64, False, "token assignments routed to the expert (top-k counted k times)"),
    ("tokens", _I64, True, "tokens the rank routed in this (step, layer, micro-batch), on each of its expert rows"),
    ("top_k", _I32, True, "experts per token of that routing decision"),
    (
        "dropped",
        _I64,
        True,
        "assignments of the decision that were not dispatched (capacity drops), when recorded; counted in ``count``",
    ),
    ("padded", _I64, True, "padding rows dispatched beyond the assignments (capacity padding), when recorded"),
]

_ROUTING_MATRIX_COLS = [
    ("step", _I64, False, "step"),
    ("layer", _I32, True, "MoE layer (None when only collective ordinals are known)"),
    ("microbatch", _I32, False, "micro-batch"),
    ("direction", _S, False, "'dispatch' or 'combine'"),
    ("call", _I64, False, "ordinal of the all-to-all within (step, direction) when the layer is unknown, else 0"),
    ("src", _I32, False, "sending global rank"),
    ("dst", _I32, False, "receiving global rank"),
    ("rows", _I64, False, "rows sent from src to dst"),
    ("row_bytes", _I64, True, "bytes per row"),
    ("source", _S, False, "'sidecar' or 'splits'"),
]

_PLACEMENT_COLS = [
    ("layer", _I32, True, "MoE layer (None = same for all layers)"),
    ("expert", _I32, False, "global expert id"),
    ("rank", _I32, False, "a rank holding a replica of the expert"),
    (
        "first_step",
        _I64,
        True,
        "first step that runs this placement (None = from the start: the sidecar's meta.placement, a routing "
        "dump's map); the placement of (step s, layer l) is that of the last first_step <= s of layer l, else "
        "the one with first_step None (ep_trace/analysis/placement_in_force.py)",
    ),
]

SCHEMAS: dict[str, pl.Schema] = {}
COLUMN_DOCS: dict[str, dict[str, str]] = {}
_NOT_NULL: dict[str, tuple[str, ...]] = {}
for _name, _cols in (
    ("ranks", _RANKS_COLS),
    ("events", _EVENTS_COLS),
    ("collectives", _COLLECTIVES_COLS),
    ("stages", _STAGES_COLS),
    ("routing_counts", _ROUTING_COUNTS_COLS),
    ("routing_matrix", _ROUTING_MATRIX_COLS),
    ("placement", _PLACEMENT_COLS),
):
    SCHEMAS[_name] = pl.Schema([(c, cast(pl.DataType, t)) for c, t, _, _ in _cols])
    COLUMN_DOCS[_name] = {c: d for c, _, _, d in _cols}
    _NOT_NULL[_name] = tuple(c for c, _, nullable, _ in _cols if not nullable)

RANKS = SCHEMAS["ranks"]
EVENTS = SCHEMAS["events"]
COLLECTIVES = SCHEMAS["collectives"]
STAGES = SCHEMAS["stages"]
ROUTING_COUNTS = SCHEMAS["routing_counts"]
ROUTING_MATRIX = SCHEMAS["routing_matrix"]
PLACEMENT = SCHEMAS["placement"]

TableName = Literal["ranks", "events", "collectives", "stages", "routing_counts", "routing_matrix", "placement"]


def empty(table: TableName) -> pl.DataFrame:
    """An empty frame with the table's schema."""
    return _empty(table).clone()  # building one costs ~1 ms (nested dtypes); readers ask per file


@functools.cache
def _empty(table: str) -> pl.DataFrame:
    return pl.DataFrame(schema=SCHEMAS[table])


def conform(table: TableName, df: pl.DataFrame) -> pl.DataFrame:
    """Select the table's columns in order, cast to their dtypes, add missing nullable ones as nulls.

    Args:
        table: Canonical table name.
        df: A frame holding at least the table's non-nullable columns.

    Returns:
        The frame with exactly the canonical columns and dtypes.
    """
    schema = SCHEMAS[table]
    exprs = []
    for col, dtype in schema.items():
        if col in df.columns and isinstance(dtype, pl.Enum) and df.schema[col] != dtype:
            # a strict cast would fail with a bare polars error; name the value instead
            bad = df.filter(pl.col(col).is_not_null() & ~pl.col(col).cast(pl.Utf8).is_in(dtype.categories.to_list()))
            if bad.height:
                from ep_trace.errors import TraceFormatError

                raise TraceFormatError(
                    f"<{table}>",
                    f"unknown {col} {bad[col][0]!r}",
                    "this is a parser bug; please report it",
                    record=table,
                )
        if col in df.columns:
            exprs.append(pl.col(col).cast(dtype, strict=True))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(col))
    return df.select(exprs)


def validate(table: TableName, df: pl.DataFrame, source: str = "<tables>") -> pl.DataFrame:
    """Check a frame against the canonical schema; raise on the first violation.

    Checks: exact column names and dtypes, no nulls in non-nullable columns, ``end_ns >= start_ns``
    where both exist, ``events.kind`` in :data:`EVENT_KINDS`.

    Args:
        table: Canonical table name.
        df: The frame to check.
        source: File or parser name used in the error message.

    Returns:
        ``df`` unchanged, for chaining.

    Raises:
        TraceFormatError: naming ``source``, the table and the first offending row.
    """
    from ep_trace.errors import TraceFormatError

    schema = SCHEMAS[table]
    if df.schema != schema:
        missing = [c for c in schema if c not in df.schema]
        wrong = [f"{c}: {df.schema[c]} != {t}" for c, t in schema.items() if c in df.schema and df.schema[c] != t]
        extra = [c for c in df.schema if c not in schema]
        raise TraceFormatError(
            source,
            f"table '{table}' does not match the canonical schema (missing {missing}, wrong types {wrong}, extra {extra})",
            "this is a parser bug; please report it with the trace",
        )
    for col in _NOT_NULL[table]:
        n = df[col].null_count()
        if n:
            row = int(df.with_row_index("_i").filter(pl.col(col).is_null())["_i"][0])
            raise TraceFormatError(
                source, f"null {col} in table '{table}'", "every row needs a value here", record=f"{table}[{row}]"
            )
    if "start_ns" in schema and "end_ns" in schema and df.height:
        bad = df.with_row_index("_i").filter(pl.col("end_ns") < pl.col("start_ns"))
        if bad.height:
            r = bad.row(0, named=True)
            raise TraceFormatError(
                source,
                f"negative duration in table '{table}' (start_ns={r['start_ns']}, end_ns={r['end_ns']})",
                "the trace is corrupt; re-export it",
                record=f"{table}[{r['_i']}]",
            )
    if table == "events" and df.height:
        bad_kind = df.filter(~pl.col("kind").is_in(EVENT_KINDS))
        if bad_kind.height:
            raise TraceFormatError(
                source,
                f"unknown event kind {bad_kind['kind'][0]!r}",
                "this is a parser bug; please report it",
                record="events",
            )
    return df


@dataclass(frozen=True)
class LoadIssue:
    """One line of the load report: something that was skipped, guessed or flagged while reading.

    Attributes:
        file: The file concerned.
        rank: The rank concerned, when known.
        level: ``'warning'`` (read with a caveat) or ``'error'`` (the file/rank was skipped).
        message: One line saying what happened and what it means for the numbers.
    """

    file: str
    rank: int | None
    level: Literal["warning", "error"]
    message: str


@dataclass(frozen=True)
class TraceTables:
    """All canonical tables of one trace directory (or one file), validated.

    ``stages`` is filled by the analysis; parsers leave it empty. ``load_report`` lists skipped ranks,
    guessed ranks, truncated splits and similar caveats that must reach the report.
    """

    ranks: pl.DataFrame
    events: pl.DataFrame
    collectives: pl.DataFrame
    routing_counts: pl.DataFrame = field(default_factory=lambda: empty("routing_counts"))
    routing_matrix: pl.DataFrame = field(default_factory=lambda: empty("routing_matrix"))
    placement: pl.DataFrame = field(default_factory=lambda: empty("placement"))
    stages: pl.DataFrame = field(default_factory=lambda: empty("stages"))
    load_report: tuple[LoadIssue, ...] = ()
    #: The events, when they stay on disk: a lazy scan of an ingest directory's ``events/`` Parquet
    #: partitions (``events`` is then empty). The analysis reads them a block of ranks at a time
    #: (:mod:`ep_trace.analysis.rank_pass`), so that its memory does not grow with the ranks.
    events_scan: pl.LazyFrame | None = field(default=None, compare=False)

    def table(self, name: TableName) -> pl.DataFrame:
        """The table called ``name`` (``events``: every event, read from ``events_scan`` if set)."""
        if name == "events" and self.events_scan is not None:
            return self.events_scan.collect()
        return cast(pl.DataFrame, getattr(self, name))

    def scan_events(self) -> pl.LazyFrame:
        """The events as a lazy frame: ``events_scan``, or the in-memory ``events``."""
        return self.events_scan if self.events_scan is not None else self.events.lazy()

    def n_events(self) -> int:
        """Number of events (a count over ``events_scan`` when the events stay on disk)."""
        if self.events_scan is None:
            return self.events.height
        return int(self.events_scan.select(pl.len()).collect().item())

    def validate(self, source: str = "<tables>") -> TraceTables:
        """Validate every table; returns self."""
        for name in SCHEMAS:
            validate(name, self.table(name), source)  # type: ignore[arg-type]
        return self
