"""The process group of each gloo call, from the worker thread that carried it out.

gloo records no ``record_param_comms`` (kineto.md section 6): the caller's ``c10d::*`` op prints its
process group as ``""`` and the ``gloo:*`` range on the worker thread has none either. Two facts of
the trace tell it:

* each ``ProcessGroupGloo`` runs its calls on worker threads of its own, created in a loop by its
  constructor (``threads_[i] = std::thread(&ProcessGroupGloo::runLoop, this, i)``; thread name
  ``pt_gloo_runloop``), ``Options::threads`` of them, 2 by default (torch 2.13
  ``torch/csrc/distributed/c10d/ProcessGroupGloo.hpp``: ``int threads{2};``), so a worker thread
  belongs to one group, and the threads of groups created later have larger thread ids;
* ``distributedInfo.pg_config`` lists the groups the rank is a member of, in creation order
  (torch/profiler ``_get_distributed_info`` -> ``_get_all_pg_configs`` iterates ``_world.pg_map``):
  name, size and global ranks.

So the rank's worker threads, sorted by thread id, map in order onto its gloo groups, at most
:data:`THREADS_PER_GROUP` threads per group, each thread's calls of a size that fits its group (the
split lists' length, ``Group size``). Where exactly one such assignment exists, every call of a
thread gets its group's ``pg_name`` / ``pg_desc`` / ``group_ranks`` / ``group_size``; elsewhere (no
``pg_config``, a group made after the profiler started, more threads than the groups can hold, or
several assignments fit) the calls keep no group, and the analysis matches them as before.

Real case: ``tests/data/ep2_gloo`` (4 ranks, EP groups {0, 1} {2, 3}, expert-data-parallel groups
{0, 2} {1, 3}, the world): rank 0's six worker threads 11487-11488, 11499-11500, 11507-11508 are
groups ``0`` (world), ``1`` ({0, 1}) and ``3`` ({0, 2}).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from ep_trace.parsers.kineto_coll_fields import FILE
from ep_trace.parsers.splits import parse_int_list

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

    from ep_trace.parsers.kineto_collectives import FileContext

__all__ = ["THREADS_PER_GROUP", "assign_threads", "with_gloo_groups"]

#: Worker threads of a ProcessGroupGloo (``ProcessGroupGloo::Options::threads``, torch's default).
THREADS_PER_GROUP = 2

_GROUP_COLS: dict[str, PolarsDataType] = {
    "pg_name": pl.Utf8,
    "pg_desc": pl.Utf8,
    "group_ranks": pl.List(pl.Int32),
    "group_size": pl.Int32,
}


def _groups(dist: dict[str, Any], rank: int) -> list[dict[str, Any]]:
    """The file's gloo groups from ``pg_config``, in creation order: ``pg_name, pg_desc, ranks, size``."""
    out = []
    for pg in dist.get("pg_config") or []:
        if not isinstance(pg, dict) or "gloo" not in str(pg.get("backend_config", "gloo")):
            continue
        parsed = parse_int_list(pg.get("ranks"))
        ranks = list(parsed.values) if parsed is not None and not parsed.truncated else None
        size = pg.get("pg_size") if isinstance(pg.get("pg_size"), int) else len(ranks) if ranks else None
        if pg.get("pg_name") is None or (ranks is not None and rank not in ranks):
            continue
        out.append(
            {"pg_name": str(pg["pg_name"]), "pg_desc": pg.get("pg_desc"), "group_ranks": ranks, "group_size": size}
        )
    return out


def assign_threads(sizes: Sequence[set[int]], group_sizes: Sequence[int | None]) -> list[int] | None:
    """The one assignment of worker threads (in thread-id order) to groups (in creation order), or None.

    Args:
        sizes: Per thread, the group sizes its calls imply (empty: unknown).
        group_sizes: Per group, its size (None: unknown).

    Returns:
        Per thread its group's index, when exactly one assignment is non-decreasing in thread order,
        holds at most :data:`THREADS_PER_GROUP` threads per group and fits every thread's sizes.
    """
    n, m, k = len(sizes), len(group_sizes), THREADS_PER_GROUP
    fits = [[not s or group_sizes[j] is None or s == {group_sizes[j]} for j in range(m)] for s in sizes]
    # ways[i][j][c]: assignments of threads i.. given thread i-1 sits in group j as its c-th thread (capped at 2)
    ways = [[[0] * (k + 1) for _ in range(m)] for _ in range(n + 1)]
    for j in range(m):
        for c in range(k + 1):
            ways[n][j][c] = 1

    def options(i: int, j: int, c: int) -> list[tuple[int, int]]:
        same = [(j, c + 1)] if j >= 0 and c < k and fits[i][j] else []
        return same + [(g, 1) for g in range(j + 1, m) if fits[i][g]]

    for i in range(n - 1, 0, -1):
        for j in range(m):
            for c in range(1, k + 1):
                ways[i][j][c] = min(2, sum(ways[i + 1][g][d] for g, d in options(i, j, c)))
    if n == 0 or sum(ways[1][g][d] for g, d in options(0, -1, 0)) != 1:
        return None
    out: list[int] = []
    j, c = -1, 0
    for i in range(n):
        j, c = next((g, d) for g, d in options(i, j, c) if ways[i + 1][g][d])
        out.append(j)
    return out


def with_gloo_groups(
    df: pl.DataFrame, members: pl.DataFrame, ev: pl.DataFrame, files: Sequence[FileContext]
) -> pl.DataFrame:
    """``df`` (the calls, with :data:`FILE` and ``_call``) with the group columns filled for the gloo
    calls that have none, where their worker threads tell it (see the module doc).

    Args:
        df: The calls being built (``kineto_collectives._finish``).
        members: ``FILE, event_id, _call``: the events implementing each call.
        ev: The batch's events (``kind``, ``tid``).
        files: One context per file (its ``distributedInfo`` and rank).
    """
    kind = ev.get_column("kind")
    workers = ev.select(FILE, "event_id", "tid").filter(kind == "comm_worker")
    if workers.is_empty() or not any((f.dist.get("pg_config") or []) for f in files):
        return df
    tid_of = (
        members.join(workers, on=[FILE, "event_id"])
        .group_by("_call")
        .agg(pl.col("tid").first().cast(pl.Int64).alias("_tid"))
    )
    calls = df.filter(pl.col("pg_name").is_null()).join(tid_of, on="_call").select(FILE, "_call", "_tid", "group_size")
    per_thread = calls.group_by(FILE, "_tid").agg(pl.col("group_size").drop_nulls().unique().alias("_sizes"))
    rows: list[dict[str, Any]] = []
    for part in per_thread.sort(FILE, "_tid").partition_by(FILE, maintain_order=True):
        fi = int(part[FILE][0])
        groups = _groups(files[fi].dist, files[fi].rank)
        got = assign_threads([set(s) for s in part["_sizes"].to_list()], [g["group_size"] for g in groups])
        if got is not None:
            rows += [{FILE: fi, "_tid": t, **groups[j]} for t, j in zip(part["_tid"].to_list(), got, strict=True)]
    if not rows:
        return df
    fill = pl.DataFrame(rows, schema={FILE: pl.Int64, "_tid": pl.Int64, **_GROUP_COLS}).with_columns(
        pl.col(FILE).cast(df.schema[FILE])
    )
    g = calls.select("_call", FILE, "_tid").join(fill, on=[FILE, "_tid"])
    g = g.select("_call", *(pl.col(c).alias(f"_g_{c}") for c in _GROUP_COLS))
    return (
        df.join(g, on="_call", how="left")
        .with_columns(pl.coalesce(c, f"_g_{c}").cast(t).alias(c) for c, t in _GROUP_COLS.items())
        .drop([f"_g_{c}" for c in _GROUP_COLS])
    )
