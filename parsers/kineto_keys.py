"""One join key per ``(file, id)`` pair for the steps after the Kineto decode.

Ids (``event_id``, ``correlation``, ``External id``) are per file, so every join of a batch
(:mod:`ep_trace.parsers.kineto_batch`) is on the file column and an id. polars row-encodes a
two-column key before hashing it: on a 55 MB GPU trace (188k events) a left join on
``(file, correlation)`` cost 6.7 ms against 3.4 ms on one int64 column holding both. Here the pair
becomes ``file * 2^bits + (id - lo)`` (exact: ``bits`` covers the id range of the batch), or, when
that could overflow (ids spanning ~2^62 / files), a struct of the two columns with the same join
semantics (a null id is null, never equal to another null id).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

__all__ = ["KeyPack", "first_rows", "key_packs"]

#: Packed keys stay below this (int64, with room for the sign).
_LIMIT = 1 << 62


@dataclass(frozen=True)
class KeyPack:
    """How ``(file, id)`` pairs of one id domain become one join column.

    Attributes:
        file_key: The file column (None: one file, the id itself is the key).
        lo: Smallest id of the domain in the batch.
        bits: Width of ``id - lo``; None when packing could overflow (struct keys).
    """

    file_key: str | None
    lo: int
    bits: int | None

    def key(self, value: str | pl.Expr, file: str | pl.Expr | None = None) -> pl.Expr:
        """The join key of ``value`` (an id column) in the file column ``file`` (default the
        pack's); null where the id is null. Only ids of the range the pack was made from have
        distinct keys: both sides of a join must take their ids from it."""
        v = pl.col(value) if isinstance(value, str) else value
        if self.file_key is None:
            return v.cast(pl.Int64)
        f = pl.col(file or self.file_key) if not isinstance(file, pl.Expr) else file
        if self.bits is None:
            return pl.when(v.is_not_null()).then(pl.struct(f.cast(pl.Int64).alias("f"), v.cast(pl.Int64).alias("v")))
        return f.cast(pl.Int64) * (1 << self.bits) + (v.cast(pl.Int64) - self.lo)


def key_packs(
    df: pl.DataFrame, domains: dict[str, list[str]], file_key: str | None, n_files: int | None = None
) -> dict[str, KeyPack]:
    """One pack per id domain, from one query over ``df`` (all values of a join's both sides must
    lie in their domain's range).

    Args:
        df: Frame holding the id columns (and ``file_key``).
        domains: Name -> id columns of that domain (e.g. ``{"event": ["event_id", "launch_id"]}``).
        file_key: The file column, or None for one file.
        n_files: Number of files (default: max of ``file_key`` + 1).
    """
    if file_key is None:
        return {d: KeyPack(None, 0, 0) for d in domains}
    exprs = [pl.col(file_key).max().alias("_f")]
    for d, cols in domains.items():
        exprs.append(pl.min_horizontal([pl.col(c).min() for c in cols]).alias(f"lo_{d}"))
        exprs.append(pl.max_horizontal([pl.col(c).max() for c in cols]).alias(f"hi_{d}"))
    stats = df.select(exprs).row(0, named=True)
    files = n_files if n_files is not None else int(stats["_f"] if stats["_f"] is not None else 0) + 1
    out = {}
    for d in domains:
        lo, hi = stats[f"lo_{d}"], stats[f"hi_{d}"]
        if lo is None:  # every id null: all keys null
            out[d] = KeyPack(file_key, 0, 0)
            continue
        bits = max(1, int(hi - lo).bit_length())
        out[d] = KeyPack(file_key, int(lo), bits if (files << bits) < _LIMIT else None)
    return out


def first_rows(build: pl.Series, probe: pl.Series) -> pl.Series:
    """For each ``probe`` key, the row of the first equal ``build`` key (null when there is none
    or the probe is null): ``build.unique(keep="first")`` then a left join, as one gather.

    Kineto ids are dense (CUPTI correlation ids and External ids count up from 1, event ids index
    ``traceEvents``), so a table indexed by ``key - min`` replaces the hash table of a join (a
    unique + left join of 60k launches cost 4.6 ms per 188k events). Keys spread much wider than
    the rows (or struct keys: :class:`KeyPack` without ``bits``) take the join.

    Args:
        build: Keys (int64 or struct; nulls never match).
        probe: Keys to look up.

    Returns:
        UInt32 row numbers into ``build``, one per probe row.
    """
    if build.dtype == pl.Int64 and probe.dtype == pl.Int64:
        b = build.drop_nulls()
        lo, hi = b.min(), b.max()
        if lo is None:
            return pl.repeat(None, probe.len(), dtype=pl.UInt32, eager=True)
        span = int(hi) - int(lo) + 1  # type: ignore[arg-type]
        if span <= 8 * (build.len() + probe.len()) + 4096 and int(lo) + span < 2**63:  # type: ignore[arg-type]
            return _table_rows(build, probe, int(lo), span)  # type: ignore[arg-type]
    right = pl.DataFrame({"_k": build}).with_row_index("_r").unique("_k", keep="first")
    return pl.DataFrame({"_k": probe}).join(right, on="_k", how="left", maintain_order="left").get_column("_r")


def _table_rows(build: pl.Series, probe: pl.Series, lo: int, span: int) -> pl.Series:
    """:func:`first_rows` by a direct-address table over ``[lo, lo + span)`` (one more slot, never
    filled, for the probes outside it or null)."""
    # int32 rows: half the table's memory (it is new memory each call: its pages fault in)
    dtype = np.int32 if build.len() < 2**31 - 1 else np.int64
    table = np.full(span + 1, -1, dtype=dtype)
    rows = np.arange(build.len(), dtype=dtype)
    if build.null_count():
        rows = rows[build.is_not_null().to_numpy()]
        b = build.drop_nulls().to_numpy() - lo
    else:
        b = build.to_numpy() - lo
    table[b] = rows
    if not np.array_equal(table[b], rows):  # repeated keys: the first row of each must win
        big = np.iinfo(dtype).max
        table[b] = big
        np.minimum.at(table, b, rows)
        table[table == big] = -1
    pv = probe.fill_null(lo).to_numpy() if probe.null_count() else probe.to_numpy()
    inside = (pv >= lo) & (pv < lo + span)  # (tested before the subtraction: it could wrap outside)
    if probe.null_count():
        inside &= probe.is_not_null().to_numpy()
    found = table[np.where(inside, pv - lo, span)]
    ok = found >= 0
    if ok.all():
        return pl.Series("_r", found, dtype=pl.UInt32)
    # nulls through a validity mask (a scatter of None into most rows cost more than the lookup)
    return pl.select(pl.when(pl.Series(ok)).then(pl.Series("_r", found)).cast(pl.UInt32)).to_series()
