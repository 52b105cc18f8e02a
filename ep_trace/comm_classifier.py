"""Communication-kernel classifier: kernel name -> communication library family (or None).

Pure module (polars only, no torch, no parsers): the parsers use it to flag comm kernels and the
analysis uses it to split device time into communication and compute.

The families are the ``comm`` column of the kernel rows of the knowledge table
(:mod:`ep_trace.knowledge`, ``ep_trace/families.toml``), the same rows that give each kernel its EP
stage, so a kernel is never communication here and unknown to the stage detector. Why a table and
not ``^nccl``: kernel names of communication libraries changed across versions and vendors, and
several EP libraries (DeepEP, pplx, NVSHMEM-based kernels, MORI) do not start with ``nccl``. The
family says *which library* moved the bytes, never *which collective* it was: one
``ncclDevKernel_SendRecv`` serves all-to-all, p2p and grouped collectives (NVIDIA/nccl#739), so the
collective type comes from the launching op / NVTX range, and only the EP libraries' kernels
(DeepEP, pplx, MORI, TensorRT-LLM all-to-all, symmetric memory, custom all-reduce) carry a
collective of their own (:data:`FAMILY_COLLECTIVE`).

The rows are tried in the table's order and the first match decides, so a compute row placed before
a communication row shadows it: DeepEP's ``get_dispatch_layout`` (local counts) is compute although
it lives in DeepEP's namespaces. Every communication pattern is anchored at the start of the name,
optionally after a ``void`` return type, so that a library name inside a template argument of a
compute kernel never matches.
"""

from __future__ import annotations

import polars as pl

from ep_trace.knowledge import first_match, first_match_expr, kernel_rows

__all__ = [
    "COMM_KERNEL_PATTERNS",
    "FAMILY_COLLECTIVE",
    "comm_family",
    "comm_family_expr",
    "first_match_expr",
    "is_comm_expr",
]

#: ``(family, regex)`` of every knowledge-table kernel row, in match order; ``family`` is None on the
#: compute rows (they stop the search: first match wins).
_LABELLED: tuple[tuple[str | None, str], ...] = tuple((r.comm, r.pattern) for r in kernel_rows())

#: ``(family, regex)`` of the communication rows, in match order (several rows per family).
COMM_KERNEL_PATTERNS: tuple[tuple[str, str], ...] = tuple((r.comm, r.pattern) for r in kernel_rows() if r.comm)


def _family_collectives() -> dict[str, str]:
    out: dict[str, str] = {}
    for r in kernel_rows():
        if r.comm and r.collective and r.comm not in out:
            out[r.comm] = r.collective
    return out


#: Collective a kernel of each family implements when no launching op names it (the family's first
#: row that says one; DeepEP / pplx / MORI / TensorRT-LLM dispatch and combine move variable-size
#: token lists: ``all_to_allv``). NCCL, RCCL, MSCCL and NVSHMEM have none: their type comes from the op.
FAMILY_COLLECTIVE: dict[str, str] = _family_collectives()


#: Family of every name classified so far in this process (the built-in rows only: the table is fixed at
#: import). polars compiles the table's regexes on every evaluation, ~28 ms a call whatever the names,
#: and ingest classifies each file's kernels twice (0.45 s of an 8-file, 574k-event set); a trace repeats
#: a few hundred names, so later calls only look them up. Bounded: emptied past _MEMO_CAP names.
_MEMO: dict[str, str | None] = {}
_MEMO_CAP = 200_000
_UNSEEN = object()


def _classify(names: pl.Series) -> pl.Series:
    """The family of each name, each distinct name classified once per process."""
    # one atomic get per name (reader threads share the memo and one may empty it meanwhile)
    known = {n: _MEMO.get(n, _UNSEEN) for n in names.unique().drop_nulls().to_list()}
    new = [n for n, f in known.items() if f is _UNSEEN]
    if new:
        fam = pl.DataFrame({"_n": new}, schema={"_n": pl.Utf8}).with_columns(
            first_match_expr(pl.col("_n"), _LABELLED).alias("_f")
        )
        fresh = dict(zip(new, fam["_f"].to_list(), strict=True))
        known.update(fresh)
        if len(_MEMO) + len(fresh) > _MEMO_CAP:
            _MEMO.clear()
        _MEMO.update(fresh)
    lookup = pl.DataFrame({"_n": list(known), "_f": list(known.values())}, schema={"_n": pl.Utf8, "_f": pl.Utf8})
    mapped = names.to_frame("_n").join(lookup, on="_n", how="left", maintain_order="left")["_f"]
    return mapped.alias(names.name)


def comm_family_expr(name: pl.Expr) -> pl.Expr:
    """Polars expression: the communication family of a kernel name, or null for compute kernels.

    Every regex of the table runs once per *distinct* name (a trace repeats a few hundred names
    millions of times), then the labels are joined back.

    Args:
        name: A Utf8 expression holding kernel names (short or demangled).

    Returns:
        A Utf8 expression with a family of :data:`COMM_KERNEL_PATTERNS` or null.
    """
    return name.map_batches(_classify, return_dtype=pl.Utf8)


def is_comm_expr(name: pl.Expr) -> pl.Expr:
    """Polars expression: True where ``name`` is a communication kernel (null names give False)."""
    return comm_family_expr(name).is_not_null()


def comm_family(name: str) -> str | None:
    """The communication family of one kernel name (scalar helper for tests and small lookups)."""
    row = first_match(name, kernel_rows())
    return row.comm if row is not None else None
