"""Consistency of one sidecar with itself and with its trace, checked before it is merged (issue 40).

Part of the validation layer (:mod:`ep_trace.parsers.validate`): :func:`check_sidecar` runs in
:func:`ep_trace.parsers.read_pool._merge_sidecar_checked` after the identity check
(``job_id``, world size, rank, time window) and before any table is built from the records, so
nothing is allocated from a size the checks refuse (``num_experts`` = 10,000,000 exhausted 4 GB;
1,000,000 gave I_e = 138,143). Each violation is one :class:`~ep_trace.errors.TraceFormatError`
line naming the sidecar, the record (``line N`` or ``meta``) and the fix; ``--keep-going`` leaves
the sidecar out (the rank stays, without routing records, and the load report says so).

* ``meta``: integer fields are integers; ``num_experts`` in ``[1, MAX_EXPERTS]``, ``top_k`` in
  ``[1, num_experts]``, ``redundant_experts`` >= 0; ``ep_group_ranks`` distinct ranks of the world,
  holding the sidecar's own rank; ``placement`` a partition of the experts: ``num_experts``
  entries, each a non-empty list of distinct ranks, ``num_experts + redundant_experts`` owners in
  all (replicas only where declared; docs/sidecar.md);
* ``routing``: ``step`` / ``layer`` / ``microbatch`` integers in range (a layer of 10^9 is refused),
  ``expert_counts`` ``num_experts`` non-negative integers summing to
  ``tokens x top_k - dropped + padded``, one record per (step, layer, micro-batch);
* ``placement`` (a layer re-placed from a step on): ``step`` / ``layer`` integers in range, its
  ``placement`` a partition of the experts as the meta's, replicas only as the record's own
  ``redundant_experts`` declares; one record per (step, layer);
* ``a2a``: ``direction`` / ``phase`` from the vocabulary, ``group_ranks`` distinct ranks of the
  world holding this rank, ``send_splits`` / ``recv_splits`` the group's length, one record per
  (step, call);
* steps: every ``routing`` / ``a2a`` record's step is a ``ProfilerStep#N`` of the trace (when the
  trace has any);
* sizes: at most :data:`MAX_ROUTING_CELLS` expert counts and split entries per sidecar (the rows
  its routing tables would take).

Lines appended from another rank's sidecar repeat that rank's (step, layer, micro-batch) and
(step, call) keys, or name a group without this rank: they are refused as duplicates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import polars as pl

from ep_trace import schema
from ep_trace.errors import ResourceLimitError, TraceFormatError

__all__ = [
    "MAX_EXPERTS",
    "MAX_LAYER",
    "MAX_MICROBATCH",
    "MAX_ROUTING_CELLS",
    "check_sidecar",
    "sidecar_facts",
]

#: Most routed experts per layer (``EP_TRACE_MAX_EXPERTS`` raises it); 256 in DeepSeek-V3.
MAX_EXPERTS = 1 << 16
#: Layers and micro-batches are numbered below these.
MAX_LAYER = 1 << 16
MAX_MICROBATCH = 1 << 16
#: Most expert counts plus split entries per sidecar (rows of its routing tables).
MAX_ROUTING_CELLS = 1 << 26

_CELLS_FIX = "analyse fewer steps (a shorter profiler window), or split the run"
_FIX = "the sidecar is corrupt or holds lines of another rank or run; re-capture it or remove it (--keep-going leaves it out)"
_DIRECTIONS = ("count", "dispatch", "combine")
_PHASES = ("fwd", "bwd")
_MISSING = object()


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _max_experts() -> int:
    from ep_trace.parsers.input_guard import env_bytes

    return env_bytes("EP_TRACE_MAX_EXPERTS", MAX_EXPERTS)


class _Ctx:
    """The sidecar being checked: raises its errors."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, record: str, problem: str, fix: str = _FIX) -> NoReturn:
        raise TraceFormatError(self.path, problem, fix, record=record)

    def cap_cells(self, cells: int, what: str, record: str | None = None, fix: str = _CELLS_FIX) -> None:
        """At most :data:`MAX_ROUTING_CELLS` routing cells (``what``: the cells counted) so far."""
        if cells > MAX_ROUTING_CELLS:
            raise ResourceLimitError(self.path, f"more than {MAX_ROUTING_CELLS:,} {what}", fix, record=record)

    def int_field(self, record: str, key: str, v: object, lo: int | None = 0, hi: int | None = None) -> None:
        """``v`` (the value of ``key``) is an integer in ``[lo, hi)``."""
        if not _is_int(v):
            self.fail(record, f"'{key}' is {str(v)[:40]!r} ({type(v).__name__}), not an integer")
        assert isinstance(v, int)
        if lo is not None and v < lo:
            self.fail(record, f"'{key}' is {v:,}; it must be at least {lo}")
        if hi is not None and v >= hi:
            self.fail(record, f"'{key}' is {v:,}, outside [{lo}, {hi:,})")

    def int_list(self, record: str, key: str, v: object, lo: int = 0, hi: int | None = None) -> list[int]:
        """``v`` is a list of integers in ``[lo, hi)``."""
        if not isinstance(v, list):
            self.fail(record, f"'{key}' is {str(v)[:40]!r} ({type(v).__name__}), not a list of integers")
        assert isinstance(v, list)
        if not set(map(type, v)) <= {int}:
            bad = next(x for x in v if not _is_int(x))
            self.fail(record, f"'{key}' holds {str(bad)[:40]!r} ({type(bad).__name__}), not an integer")
        if v and (min(v) < lo or (hi is not None and max(v) >= hi)):
            bad = next(x for x in v if x < lo or (hi is not None and x >= hi))
            if bad < 0 and lo == 0:
                self.fail(record, f"'{key}' holds a negative value ({bad:,})")
            self.fail(record, f"'{key}' holds {bad:,}, outside [{lo}, {hi:,})")
        return v


# --- meta ------------------------------------------------------------------------------------


def _check_meta(c: _Ctx, meta: dict[str, Any], world: int | None, rank: int) -> tuple[int | None, int | None, int]:
    """The meta keys the merge and the analysis use; returns (num_experts, top_k, redundant_experts)."""
    for key in ("rank", "world_size", "local_rank", "cpu_cores", "host_cores", "hidden_size"):
        v = meta.get(key)
        if v is not None:
            c.int_field("meta", key, v, 1 if key == "world_size" else 0, schema_hi(key))
    e, k = meta.get("num_experts"), meta.get("top_k")
    if e is not None:
        cap = _max_experts()
        c.int_field("meta", "num_experts", e, 1)
        if e > cap:
            raise ResourceLimitError(
                c.path,
                f"'num_experts' is {e:,}, above the cap of {cap:,} experts",
                f"if the model really routes to that many experts, set EP_TRACE_MAX_EXPERTS={e}; else {_FIX}",
                record="meta",
            )
    if k is not None:
        c.int_field("meta", "top_k", k, 1)
        if isinstance(e, int) and k > e:
            c.fail("meta", f"'top_k' is {k} but 'num_experts' is {e}: a token cannot go to more experts than exist")
    r_extra = meta.get("redundant_experts", 0)
    r_extra = 0 if r_extra is None else r_extra
    c.int_field("meta", "redundant_experts", r_extra, 0, _max_experts() + 1)
    group = meta.get("ep_group_ranks")
    if group is not None:
        g = c.int_list("meta", "ep_group_ranks", group, 0, world)
        if len(set(g)) != len(g):
            c.fail("meta", f"'ep_group_ranks' lists a rank twice ({_dup(g)})")
        if g and rank not in g:
            c.fail("meta", f"'ep_group_ranks' ({_short(g)}) does not hold the sidecar's rank {rank}")
    if meta.get("placement") is not None:
        _check_placement(c, meta["placement"], e if _is_int(e) else None, r_extra, world)
    return (e if _is_int(e) else None, k if _is_int(k) else None, int(r_extra))


def schema_hi(key: str) -> int | None:
    """Upper bound of an integer meta key: ranks and world size below the world cap."""
    from ep_trace.parsers.validate import MAX_WORLD_SIZE

    return MAX_WORLD_SIZE + (1 if key == "world_size" else 0) if key in ("rank", "world_size", "local_rank") else None


def _short(xs: Sequence[int]) -> str:
    return ", ".join(str(x) for x in xs[:8]) + (", ..." if len(xs) > 8 else "")


def _dup(xs: Sequence[int]) -> int:
    seen: set[int] = set()
    return next(x for x in xs if x in seen or seen.add(x))  # type: ignore[func-returns-value]


def _check_placement(c: _Ctx, pl_: object, e: int | None, r_extra: int, world: int | None, record: str = "meta") -> int:
    """``placement`` (of ``record``: the meta or a ``placement`` record's line) is a partition of the experts
    over ranks, replicas only as declared; returns its copies."""
    if not isinstance(pl_, list):
        c.fail(record, f"'placement' is {str(pl_)[:40]!r}, not a list of rank lists")
    assert isinstance(pl_, list)
    if e is not None and len(pl_) != e:
        c.fail(record, f"'placement' has {len(pl_):,} entries but 'num_experts' is {e:,}")
    if len(pl_) > _max_experts():
        c.fail(record, f"'placement' has {len(pl_):,} entries, above the cap of {_max_experts():,} experts")
    owners = 0
    for x, entry in enumerate(pl_):
        got = c.int_list(record, f"placement[{x}]", entry, 0, world)
        if not got:
            c.fail(record, f"'placement[{x}]' is empty: expert {x} has no rank")
        if len(set(got)) != len(got):
            c.fail(record, f"'placement[{x}]' lists rank {_dup(got)} twice")
        owners += len(got)
    n = len(pl_)
    if owners != n + r_extra:
        most = max(range(n), key=lambda x: len(pl_[x]))
        whose = "meta" if record == "meta" else "the record's"
        c.fail(
            record,
            f"'placement' holds {owners:,} expert copies for {n:,} experts (expert {most} on ranks "
            f"{_short(pl_[most])}) but 'redundant_experts' is {r_extra}: each expert has one rank plus the "
            "declared replicas",
            f"declare the replicas as {whose} 'redundant_experts' (docs/sidecar.md), or re-capture the sidecar "
            "(--keep-going leaves it out)",
        )
    return owners


# --- records ---------------------------------------------------------------------------------


def _lines(sc: Any, kind: str) -> Sequence[int]:
    got: Sequence[int] = getattr(sc, f"{kind}_lines", ())
    n = len(getattr(sc, kind))
    return got if len(got) == n else range(1, n + 1)


def _int_column(c: _Ctx, lines: Sequence[int], key: str, vals: list[Any], hi: int | None, nullable: bool) -> None:
    """One field of every record: an integer in ``[0, hi)`` (or null when ``nullable``)."""
    kinds = set(map(type, vals))
    ok = {int, type(None)} if nullable else {int}
    if kinds <= ok:
        have = [v for v in vals if v is not None] if nullable and type(None) in kinds else vals
        if not have or (min(have) >= 0 and (hi is None or max(have) < hi)):
            return
    for i, v in enumerate(vals):
        if v is None and nullable:
            continue
        if v is None or v is _MISSING:
            c.fail(f"line {lines[i]}", f"no '{key}'")
        c.int_field(f"line {lines[i]}", key, v, 0, hi)


def _no_duplicates(
    c: _Ctx, lines: Sequence[int], keys: list[tuple[Any, ...]], what: Callable[[tuple[Any, ...]], str]
) -> None:
    first: dict[tuple[Any, ...], int] = {}
    for i, k in enumerate(keys):
        j = first.setdefault(k, i)
        if j != i:
            c.fail(f"line {lines[i]}", f"a second record for {what(k)} (the first is line {lines[j]})")


def _steps_traced(c: _Ctx, lines: Sequence[int], steps: list[int], traced: set[int], trace_file: str) -> None:
    if not traced:
        return
    for i, s in enumerate(steps):
        if s not in traced:
            c.fail(
                f"line {lines[i]}",
                f"step {s} is no ProfilerStep of its trace {trace_file} (steps {_short(sorted(traced))})",
                "the records are shifted or from another run; re-capture the sidecar or remove it "
                "(--keep-going leaves it out)",
            )


def _check_routing(c: _Ctx, sc: Any, e: int | None, k: int | None, traced: set[int], trace_file: str) -> int:
    """The routing records; returns their expert-count cells."""
    recs: list[dict[str, Any]] = sc.routing
    if not recs:
        return 0
    lines = _lines(sc, "routing")
    steps = [r.get("step", _MISSING) for r in recs]
    layers = [r.get("layer", _MISSING) for r in recs]
    mbs = [r.get("microbatch", 0) for r in recs]
    _int_column(c, lines, "step", steps, None, False)
    _int_column(c, lines, "layer", layers, MAX_LAYER, False)
    _int_column(c, lines, "microbatch", mbs, MAX_MICROBATCH, True)
    counts = [r.get("expert_counts", _MISSING) for r in recs]
    want = e
    cells = 0
    for i, cnt in enumerate(counts):
        rec = f"line {lines[i]}"
        if cnt is _MISSING:
            continue
        got = c.int_list(rec, "expert_counts", cnt, 0)
        want = len(got) if want is None else want
        if len(got) != want:
            c.fail(rec, f"'expert_counts' has {len(got):,} entries but there are {want:,} experts")
        cells += len(got)
        c.cap_cells(cells, "expert counts", rec)
        _check_sum(c, rec, recs[i], sum(got), k)
    keys = [(s, l_, 0 if m is None else m) for s, l_, m in zip(steps, layers, mbs, strict=True)]
    _no_duplicates(c, lines, keys, lambda t: f"step {t[0]}, layer {t[1]}, micro-batch {t[2]}")
    _steps_traced(c, lines, steps, traced, trace_file)
    return cells


def _check_sum(c: _Ctx, rec: str, r: dict[str, Any], total: int, meta_k: int | None) -> None:
    """``sum(expert_counts) = tokens x top_k - dropped + padded`` (when tokens and top_k are recorded)."""
    t, k = r.get("tokens"), r.get("top_k")
    for key, v, lo in (("tokens", t, 0), ("top_k", k, 1)):
        if v is not None:
            c.int_field(rec, key, v, lo)
    d, p = r.get("dropped", 0), r.get("padded", 0)
    c.int_field(rec, "dropped", 0 if d is None else d)
    c.int_field(rec, "padded", 0 if p is None else p)
    if meta_k is not None and k is not None and k != meta_k:
        c.fail(rec, f"'top_k' is {k} but the meta's 'top_k' is {meta_k}")
    if t is None or k is None:
        return
    want = t * k - (d or 0) + (p or 0)
    if total != want:
        extra = (f" - {d:,} dropped" if d else "") + (f" + {p:,} padded" if p else "")
        c.fail(
            rec,
            f"'expert_counts' sum to {total:,}, not tokens x top_k{' - dropped' if d else ''}"
            f"{' + padded' if p else ''} = {t:,} x {k}{extra} = {want:,}",
            "the counts are corrupt or not this rank's; a router that drops or pads assignments records them "
            "as 'dropped' / 'padded' (docs/sidecar.md); else re-capture the sidecar (--keep-going leaves it out)",
        )


def _check_placements(c: _Ctx, sc: Any, e: int | None, world: int | None, traced: set[int], trace_file: str) -> int:
    """The ``placement`` records (module doc); returns their expert copies."""
    recs = getattr(sc, "placements", [])
    got: Sequence[int] = getattr(sc, "placement_lines", ())
    lines = got if len(got) == len(recs) else range(1, len(recs) + 1)
    for key, hi in (("step", None), ("layer", MAX_LAYER)):
        _int_column(c, lines, key, [r.get(key, _MISSING) for r in recs], hi, nullable=False)
    _no_duplicates(c, lines, [(r["step"], r["layer"]) for r in recs], lambda k: f"step {k[0]} layer {k[1]}")
    _steps_traced(c, lines, [r["step"] for r in recs], traced, trace_file)
    cells = 0
    for i, r in enumerate(recs):
        r_extra = r.get("redundant_experts", 0)
        c.int_field(f"line {lines[i]}", "redundant_experts", r_extra, 0, _max_experts() + 1)
        cells += _check_placement(c, r.get("placement"), e, r_extra, world, f"line {lines[i]}")
    return cells


def _check_a2a(c: _Ctx, sc: Any, world: int | None, rank: int, traced: set[int], trace_file: str) -> int:
    """The all-to-all records; returns their split cells."""
    recs: list[dict[str, Any]] = sc.a2a
    if not recs:
        return 0
    lines = _lines(sc, "a2a")
    steps = [r.get("step", _MISSING) for r in recs]
    calls = [r.get("call") for r in recs]
    _int_column(c, lines, "step", steps, None, False)
    _int_column(c, lines, "layer", [r.get("layer") for r in recs], MAX_LAYER, True)
    _int_column(c, lines, "microbatch", [r.get("microbatch") for r in recs], MAX_MICROBATCH, True)
    _int_column(c, lines, "call", calls, None, True)
    for key in ("row_bytes", "start_ns", "end_ns", "link_delay_ns"):
        _int_column(c, lines, key, [r.get(key) for r in recs], None, True)
    group_meta = sc.meta.get("ep_group_ranks")
    cells = 0
    for i, r in enumerate(recs):
        rec = f"line {lines[i]}"
        if r.get("direction") not in _DIRECTIONS:
            c.fail(rec, f"'direction' is {str(r.get('direction'))[:40]!r}, not one of {', '.join(_DIRECTIONS)}")
        if r.get("phase") is not None and r.get("phase") not in _PHASES:
            c.fail(rec, f"'phase' is {str(r.get('phase'))[:40]!r}, not fwd or bwd")
        g = r.get("group_ranks", group_meta)
        if g is not None:
            g = c.int_list(rec, "group_ranks", g, 0, world)
            if len(set(g)) != len(g):
                c.fail(rec, f"'group_ranks' lists rank {_dup(g)} twice")
            if rank not in g:
                c.fail(rec, f"'group_ranks' ({_short(g)}) does not hold the sidecar's rank {rank}")
        for key in ("send_splits", "recv_splits"):
            v = r.get(key)
            if v is None:
                continue
            got = c.int_list(rec, key, v, 0)
            if g is not None and len(got) != len(g):
                c.fail(rec, f"'{key}' has {len(got):,} entries but the group has {len(g):,} ranks")
            cells += len(got)
        c.cap_cells(cells, "split entries", rec)
    keyed = [(i, (s, cl)) for i, (s, cl) in enumerate(zip(steps, calls, strict=True)) if cl is not None]
    _no_duplicates(c, [lines[i] for i, _ in keyed], [k for _, k in keyed], lambda t: f"step {t[0]}, call {t[1]}")
    _steps_traced(c, lines, steps, traced, trace_file)
    return cells


# --- entry points ----------------------------------------------------------------------------


def _traced_steps(trace: schema.TraceTables) -> set[int]:
    ev = trace.events
    if ev.height == 0 or "seq" not in ev.columns:
        return set()
    s = ev.filter(pl.col("name").cast(pl.Utf8).str.starts_with("ProfilerStep#") & pl.col("seq").is_not_null())
    return set(s["seq"].to_list())


def check_sidecar(trace: schema.TraceTables, sc: Any) -> None:
    """Every check of the module doc on one rank's sidecar against its trace (one rank's tables).

    Raises:
        TraceFormatError: the first violation, naming the sidecar, the record and the fix.
        ResourceLimitError: a size beyond its cap (checked before anything is allocated from it).
    """
    c = _Ctx(str(sc.path))
    r = trace.ranks.row(0, named=True)
    world = r.get("world_size")
    meta_ws = sc.meta.get("world_size")
    world = world if world is not None else (meta_ws if _is_int(meta_ws) else None)
    e, k, _ = _check_meta(c, sc.meta, world, int(r["rank"]))
    traced = _traced_steps(trace)
    cells = _check_routing(c, sc, e, k, traced, str(r.get("source_file")))
    cells += _check_a2a(c, sc, world, int(r["rank"]), traced, str(r.get("source_file")))
    cells += _check_placements(c, sc, e, world, traced, str(r.get("source_file")))
    c.cap_cells(cells, "expert counts and split entries", fix="analyse fewer steps")


def sidecar_facts(sc: Any) -> tuple[Any, ...]:
    """What every sidecar of one job must agree on: experts, top-k, replicas and the placement."""
    meta = sc.meta
    placement = meta.get("placement")
    frozen = tuple(tuple(o) for o in placement) if isinstance(placement, list) else None
    return (meta.get("num_experts"), meta.get("top_k"), meta.get("redundant_experts", 0) or 0, frozen)
