"""What the analysis covers of the job: ranks of the world without a trace, ranks whose routing is
not counted (issue 40).

The parsers name both in the load report (:mod:`ep_trace.parsers.rank_set`); here the same facts are
derived from the tables, so that every figure that sums over ranks says which ranks it sums: the
analysis notes, the terminal summary, the report's routing section and the JSON summary
(``missing_ranks``, ``imbalance.routing_missing_ranks``) use these functions. Expert load, I_e and
the sidecar's count matrix from 3 of 4 ranks are the load of those 3 ranks' tokens, not the job's.
"""

from __future__ import annotations

import polars as pl

from ep_trace.schema import TraceTables

__all__ = ["missing_ranks", "routing_missing_ranks", "coverage_notes", "rank_ranges", "ranks_phrase"]


def rank_ranges(ranks: list[int], limit: int = 12) -> str:
    """``0-3, 5, 7``: sorted ranks, runs of three or more as ranges (at most ``limit`` items, then ``...``)."""
    xs = sorted(set(ranks))
    out: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out += [f"{xs[i]}-{xs[j]}"] if j - i >= 2 else [str(x) for x in xs[i : j + 1]]
        i = j + 1
    return ", ".join(out[:limit]) + (", ..." if len(out) > limit else "")


def ranks_phrase(ranks: list[int]) -> str:
    """``rank 3 has`` / ``ranks 0, 1 have``: the ranks as the subject of a sentence."""
    return f"rank {ranks[0]} has" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)} have"


def missing_ranks(ranks: pl.DataFrame) -> list[int]:
    """Ranks below the world size (the largest ``ranks.world_size``) that no trace file gave."""
    if ranks.height == 0:
        return []
    ws = ranks["world_size"].drop_nulls()
    if ws.len() == 0:
        return []
    have = set(ranks["rank"].to_list())
    return [r for r in range(int(ws.max())) if r not in have]  # type: ignore[arg-type]


def routing_missing_ranks(tables: TraceTables) -> list[int]:
    """Ranks read whose routing the figures do not count: when some ranks' expert counts (or the
    sidecar's count-matrix rows) are present, the ranks without them; else none."""
    have: set[int] = set(tables.routing_counts["rank"].unique().to_list())
    rm = tables.routing_matrix
    if rm.height and "source" in rm.columns:
        have |= set(rm.filter(pl.col("source") == "sidecar")["src"].unique().to_list())
    if not have:
        return []
    return sorted(set(tables.ranks["rank"].to_list()) - have)


def coverage_notes(tables: TraceTables) -> tuple[str, ...]:
    """The analysis notes for the two gaps (empty when the job is whole)."""
    out = []
    gone = missing_ranks(tables.ranks)
    n = tables.ranks.height
    if gone:
        ws = n + len(gone)
        subject = ranks_phrase(gone)
        out.append(
            f"{subject[0].upper()}{subject[1:]} no trace file (world size {ws}): every figure covers the other "
            f"{n} rank{'s' if n > 1 else ''} only."
        )
    lack = routing_missing_ranks(tables)
    if lack:
        counted = sorted(set(tables.ranks["rank"].to_list()) - set(lack))
        out.append(
            f"Expert load, I_e / I_r and the count matrix count the routing of {len(counted)} of {n} ranks "
            f"({rank_ranges(counted)}): {ranks_phrase(lack)} no sidecar routing records."
        )
    return tuple(out)
