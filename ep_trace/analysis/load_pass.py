"""Pass 6 of :func:`~ep_trace.analysis.engine.analyze`: routing load and the transfers' α–β fit.

Expert and rank load, imbalance, the count matrix and split violations
(:mod:`~ep_trace.analysis.imbalance`), from the sidecar's exact counts or the collectives' split
lists; the α–β fit of the matched calls (:mod:`~ep_trace.analysis.bandwidth`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import polars as pl

from ep_trace.analysis import bandwidth, imbalance
from ep_trace.analysis.match_pass import MatchPass
from ep_trace.schema import TraceTables

__all__ = ["LoadPass", "load_pass"]


@dataclass(frozen=True)
class LoadPass:
    """Attributes: the :class:`~ep_trace.analysis.result.Analysis` frames of the same names."""

    expert_load: pl.DataFrame
    rank_load: pl.DataFrame
    imbalance: pl.DataFrame
    count_matrix: pl.DataFrame
    split_violations: pl.DataFrame
    alpha_beta: pl.DataFrame


def load_pass(tables: TraceTables, m: MatchPass) -> LoadPass:
    """Routing load per expert and rank, imbalance, count matrix, split checks, α–β fit."""
    ranks = tables.ranks
    n_exp = ranks["num_experts"].max() if ranks.height else None
    el = imbalance.expert_load(tables.routing_counts, cast("int | None", n_exp))
    cm = imbalance.count_matrix(tables.routing_matrix, m.matched)
    rl = imbalance.rank_load(cm, sorted(int(r) for r in ranks["rank"]))
    imb = imbalance.imbalance_table(el, rl, cm, ranks)
    viol = imbalance.split_violations(m.matched)
    return LoadPass(el, rl, imb, cm, viol, bandwidth.alpha_beta_fit(m.calls))
