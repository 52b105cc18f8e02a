"""The ranks of one job as a set: sidecars that must agree, ranks missing from the world, ranks
without a sidecar (issue 40). Called by :func:`ep_trace.parsers.dispatch.read_batches` once every
file is read; part of the validation layer (:mod:`ep_trace.parsers.validate`).

* :func:`check_sidecar_agreement`: every sidecar of a job states the same ``num_experts``,
  ``top_k``, ``redundant_experts`` and ``placement`` (the writer copies them to each rank); two
  that differ come from different runs, refused naming both files (a conflict: ``--keep-going``
  cannot say which one is right);
* :func:`coverage_issues`: load-report warnings, shown by the report and the terminal, for what
  the analysis does not cover: ranks of the world (``distributedInfo.world_size``, the sidecar's
  ``world_size``) with no trace file, and, when some ranks have a sidecar, the ranks without one
  (their expert counts and count-matrix rows are missing: the analysis's routing figures say which
  ranks they cover, :mod:`ep_trace.analysis.rank_coverage`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from ep_trace import schema
from ep_trace.errors import RankConflictError

__all__ = ["check_sidecar_agreement", "coverage_issues", "is_coverage_issue"]

_FIELDS = ("num_experts", "top_k", "redundant_experts", "placement")
#: Ranks without a sidecar named one issue each up to this many; beyond, one issue names them all.
_PER_RANK = 8


def _listed(ranks: Iterable[int], limit: int = 16) -> str:
    """Sorted ranks, the first ``limit`` of them (then ``...``)."""
    xs = sorted(set(ranks))
    return ", ".join(map(str, xs[:limit])) + (", ..." if len(xs) > limit else "")


def _differ(a: Any, b: Any, field: str) -> str:
    if field != "placement":
        return f"{a!r} in one, {b!r} in the other"
    if len(a) != len(b):
        return f"{len(a)} experts in one, {len(b)} in the other"
    x = next(i for i, (u, v) in enumerate(zip(a, b, strict=True)) if u != v)
    return f"expert {x} on ranks {list(a[x])} in one, {list(b[x])} in the other"


def check_sidecar_agreement(facts: Sequence[tuple[int, str, tuple[Any, ...]]]) -> None:
    """The sidecars' job-wide meta agree (see the module doc); ``facts`` = ``(rank, path, facts)``.

    Raises:
        RankConflictError: naming both sidecars and the first field that differs.
    """
    first: dict[str, tuple[str, Any]] = {}
    for _, path, vals in sorted(facts):
        for field, v in zip(_FIELDS, vals, strict=True):
            if v is None:
                continue
            seen = first.setdefault(field, (path, v))
            if seen[1] != v:
                raise RankConflictError(
                    f"{path}: sidecar {field} differs from {seen[0]} ({_differ(seen[1], v, field)}); the sidecars "
                    "are from different runs: put one run per directory, or re-capture (--keep-going does not mix them)"
                )


def coverage_issues(
    path: str | Path, ranks: pl.DataFrame, sidecars: dict[int, Path] | None = None
) -> list[schema.LoadIssue]:
    """Warnings for the ranks of the world without a trace file and, when some ranks have a
    sidecar, for the ranks without one (see the module doc).

    Args:
        path: The directory (or file) read; named by the missing-ranks warning.
        ranks: The ranks rows of every rank read.
        sidecars: ``{rank: sidecar path}`` found beside the traces (a left-out sidecar is named
            with its path; a missing one as ``rank<r>.ep.jsonl`` beside the trace).
    """
    if ranks.height == 0:
        return []
    have = sorted(int(r) for r in ranks["rank"])
    out: list[schema.LoadIssue] = []
    ws_vals = ranks["world_size"].drop_nulls()
    ws = int(ws_vals.max()) if ws_vals.len() else None  # type: ignore[arg-type]
    if ws is not None:
        missing = sorted(set(range(ws)) - set(have))
        if missing:
            n = len(missing)
            out.append(
                schema.LoadIssue(
                    str(path),
                    missing[0] if n == 1 else None,
                    "warning",
                    f"world size {ws} but no trace file for {n} rank{'s' if n > 1 else ''} ({_listed(missing)}): "
                    f"every figure covers rank{'s' if len(have) > 1 else ''} {_listed(have)} only",
                )
            )
    if "has_sidecar" not in ranks.columns:
        return out
    with_sc = ranks.filter(pl.col("has_sidecar"))
    if with_sc.height == 0 or with_sc.height == ranks.height:
        return out
    covered = _listed(int(r) for r in with_sc["rank"])
    lacking = ranks.filter(~pl.col("has_sidecar")).sort("rank")
    what = f"expert load, the count matrix and I_e / I_r cover rank{'s' if with_sc.height > 1 else ''} {covered} only"
    if lacking.height > _PER_RANK:
        out.append(
            schema.LoadIssue(
                str(path),
                None,
                "warning",
                f"no sidecar for {lacking.height} ranks ({_listed(int(r) for r in lacking['rank'])}): {what}",
            )
        )
        return out
    for r, src in lacking.select("rank", "source_file").iter_rows():
        sc = (sidecars or {}).get(int(r)) or Path(src).parent / f"rank{r}.ep.jsonl"
        out.append(schema.LoadIssue(str(sc), int(r), "warning", f"no sidecar for rank {r}: {what}"))
    return out


def is_coverage_issue(issue: schema.LoadIssue) -> bool:
    """Whether a load-report line is one of :func:`coverage_issues` (said again when directories merge)."""
    return issue.level == "warning" and (
        (issue.message.startswith("world size ") and "but no trace file for" in issue.message)
        or issue.message.startswith("no sidecar for ")
    )
