"""Regex filters over event names, matched once per distinct name.

A trace repeats a few hundred names hundreds of thousands of times (1,024 param DLRM ranks: ~250 k
host rows per block of ranks, ~130 distinct ``cpu_op`` names), so a regex run over every row costs
the regex engine per row, for each of the ~20 stage presets. Matching the distinct names once and
filtering the rows by membership selects the same rows, in the same order; a pattern that matches
no name costs no pass over the rows at all.
"""

from __future__ import annotations

import polars as pl

__all__ = ["matching_names", "name_filter"]


def matching_names(names: pl.Series, pattern: str) -> pl.Series:
    """The values of ``names`` (distinct names, e.g. ``df["name"].unique()``) that ``pattern`` matches
    anywhere (``str.contains``; polars' Rust regex dialect); nulls never match."""
    return names.filter(names.str.contains(pattern))


def name_filter(df: pl.DataFrame, pattern: str, col: str = "name") -> pl.DataFrame:
    """``df.filter(pl.col(col).str.contains(pattern))``: the same rows in the same order."""
    hits = matching_names(df.get_column(col).unique(), pattern)
    return df.filter(pl.col(col).is_in(hits.implode())) if hits.len() else df.head(0)
