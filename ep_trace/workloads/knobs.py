"""Parsing of the demo's routing-workload (``--skew``) and straggler knobs (no torch).

Errors name the CLI option, e.g. ``--skew: unknown spec 'foo'; use uniform, zipf:EXPONENT ...``.

Routing workloads (what EP load-balancing benchmarks vary; docs/capture.md has the table):
``uniform``, ``zipf:A`` and ``hot:E:S`` (the first three, realised by Gumbel-top-k, see
:func:`ep_trace.workloads.demo.routing_bias`), and the *hot-set* family, each a set of experts that
gets the share S of all assignments (evenly) while the other experts share the rest evenly:
``hotset:E1,E2,...:S`` (the listed experts), ``hotrank:R:S`` (every expert rank R holds),
``spread:N:S`` (N experts spread evenly over the id range: ``i*E//N``), ``rotate:N:S`` (N
consecutive experts starting at ``(step*N) mod E``: the hot spot moves every step),
``cold-rank:R`` (rank R's experts get nothing: a hot set of share 0), ``affinity:OFFSET:S`` (rank
r's tokens prefer the experts of rank ``(r + OFFSET) mod W``: source-dependent routing, the case for
node-local placement), and ``burst:EVERY:SPEC`` (SPEC on steps ``s % EVERY == 0``, uniform between).
"Rank R's experts" are those R holds under ``--placement`` (contiguous blocks without one), so that
an ``--alt-placement`` A/B keeps the routing and changes only where the experts live.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ep_trace.errors import ConfigError

__all__ = ["SkewSpec", "Straggler", "parse_skew", "parse_straggler", "skew_probabilities", "HOT_SET_KINDS"]

_SKEW_HELP = (
    "use uniform, zipf:EXPONENT (e.g. zipf:1.2), hot:EXPERT:SHARE (e.g. hot:3:0.5), hotset:E1,E2,...:SHARE, "
    "hotrank:RANK:SHARE, spread:N:SHARE, rotate:N:SHARE, cold-rank:RANK, affinity:OFFSET:SHARE or "
    "burst:EVERY:SPEC (docs/capture.md)"
)

#: Kinds realised as "a set of experts gets a share" (exact marginals, :func:`skew_probabilities`).
HOT_SET_KINDS = ("hotset", "hotrank", "spread", "rotate", "cold-rank", "affinity", "burst")


@dataclass(frozen=True)
class SkewSpec:
    """A routing workload; ``kind`` is ``uniform``, ``zipf``, ``hot`` or one of :data:`HOT_SET_KINDS`.

    Attributes:
        kind: The workload.
        exponent: Zipf exponent.
        expert: The hot expert of ``hot``.
        share: Share of all assignments the hot expert / hot set gets (0 for ``cold-rank``).
        experts: The hot set of ``hotset`` / ``hotrank`` / ``spread`` / ``cold-rank`` (resolved ids).
        rank: The rank of ``hotrank`` / ``cold-rank``.
        count: N of ``spread`` / ``rotate``.
        offset: OFFSET of ``affinity``.
        every: EVERY of ``burst``.
        inner: The bursting workload of ``burst``.
        rank_experts: Experts each rank holds (``affinity``'s preferred blocks).
    """

    kind: str = "uniform"
    exponent: float = 0.0
    expert: int = 0
    share: float = 0.0
    experts: tuple[int, ...] = ()
    rank: int = -1
    count: int = 0
    offset: int = 0
    every: int = 0
    inner: SkewSpec | None = None
    rank_experts: tuple[tuple[int, ...], ...] = ()

    def __str__(self) -> str:
        k, s = self.kind, f"{self.share:g}"
        text = {
            "zipf": f"zipf:{self.exponent:g}",
            "hot": f"hot:{self.expert}:{s}",
            "hotset": f"hotset:{','.join(map(str, self.experts))}:{s}",
            "hotrank": f"hotrank:{self.rank}:{s}",
            "spread": f"spread:{self.count}:{s}",
            "rotate": f"rotate:{self.count}:{s}",
            "cold-rank": f"cold-rank:{self.rank}",
            "affinity": f"affinity:{self.offset}:{s}",
            "burst": f"burst:{self.every}:{self.inner}",
        }
        return text.get(k, "uniform")

    def at(self, step: int) -> SkewSpec:
        """The workload step ``step`` routes with: a burst's inner one on its steps, else uniform; others themselves."""
        if self.kind != "burst":
            return self
        assert self.inner is not None
        return self.inner if step % self.every == 0 else SkewSpec()

    def hot_set(self, experts: int, step: int, rank: int) -> tuple[tuple[int, ...], float] | None:
        """``(hot experts, their share)`` at ``step`` for source ``rank``; None when not a hot-set kind.

        ``burst`` is resolved by :meth:`at` first.
        """
        if self.kind == "rotate":
            return tuple((step * self.count + i) % experts for i in range(self.count)), self.share
        if self.kind == "affinity":
            return self.rank_experts[(rank + self.offset) % len(self.rank_experts)], self.share
        if self.kind in HOT_SET_KINDS and self.kind != "burst":
            return self.experts, self.share
        return None


@dataclass(frozen=True)
class Straggler:
    """Delay (a sleep) of ``rank`` inside each of its expert stages, in milliseconds."""

    rank: int
    ms: float


def _num(text: str, what: str, spec: str, option: str = "--skew") -> float:
    try:
        v = float(text)
    except ValueError:
        raise ConfigError(f"{option}: {what} {text!r} in {spec!r} is not a number; {_SKEW_HELP}") from None
    if not math.isfinite(v):
        raise ConfigError(f"{option}: {what} in {spec!r} must be finite; {_SKEW_HELP}")
    return v


def _int(text: str, what: str, spec: str, option: str) -> int:
    v = _num(text, what, spec, option)
    if v != int(v):
        raise ConfigError(f"{option}: {what} {text} in {spec!r} is not an integer")
    return int(v)


def _share(text: str, kind: str, spec: str, option: str) -> float:
    s = _num(text, "share", spec, option)
    if not 0 < s <= 1:
        raise ConfigError(f"{option}: {kind} share {text} must be in (0, 1]")
    return s


def _rank(text: str, kind: str, spec: str, option: str, rank_experts: Sequence[Sequence[int]]) -> int:
    r = _int(text, "rank", spec, option)
    if not 0 <= r < len(rank_experts):
        w = len(rank_experts)
        raise ConfigError(f"{option}: {kind} rank {r} is out of range 0..{w - 1} (--ranks {w})")
    return r


def _count(text: str, kind: str, spec: str, option: str, experts: int) -> int:
    n = _int(text, "count", spec, option)
    if not 1 <= n < experts:
        raise ConfigError(f"{option}: {kind} count {n} must be in 1..{experts - 1} (--experts {experts})")
    return n


def _hotset_ids(text: str, spec: str, option: str, experts: int) -> tuple[int, ...]:
    ids: list[int] = []
    for part in text.split(","):
        e = _int(part, "expert", spec, option)
        if not 0 <= e < experts:
            raise ConfigError(
                f"{option}: hotset expert {e} is not an expert id in 0..{experts - 1} (--experts {experts})"
            )
        if e in ids:
            raise ConfigError(f"{option}: hotset lists expert {e} twice")
        ids.append(e)
    return tuple(ids)


def _parse_hot_set(
    parts: list[str], spec: str, experts: int, option: str, rank_experts: Sequence[Sequence[int]]
) -> SkewSpec | None:
    """The hot-set kinds (except burst); None when ``parts`` is none of them."""
    kind, n = parts[0], len(parts)
    groups = tuple(tuple(g) for g in rank_experts)
    if kind == "hotset" and n == 3:
        return SkewSpec(kind, experts=_hotset_ids(parts[1], spec, option, experts), share=_share(parts[2], kind, spec, option))  # fmt: skip
    if kind in ("hotrank", "cold-rank") and n == (3 if kind == "hotrank" else 2):
        r = _rank(parts[1], kind, spec, option, groups)
        share = _share(parts[2], kind, spec, option) if kind == "hotrank" else 0.0
        return SkewSpec(kind, rank=r, experts=groups[r], share=share)
    if kind in ("spread", "rotate") and n == 3:
        c = _count(parts[1], kind, spec, option, experts)
        ids = tuple(i * experts // c for i in range(c)) if kind == "spread" else ()
        return SkewSpec(kind, count=c, experts=ids, share=_share(parts[2], kind, spec, option))
    if kind == "affinity" and n == 3:
        off = _int(parts[1], "offset", spec, option)
        return SkewSpec(kind, offset=off, share=_share(parts[2], kind, spec, option), rank_experts=groups)
    return None


def _check_realisable(sk: SkewSpec, spec: str, experts: int, top_k: int, option: str) -> None:
    """Every expert's share at most 1/top_k, and a hot set that leaves experts for the rest."""
    for r in range(len(sk.rank_experts)) if sk.kind == "affinity" else (0,):
        hs = sk.hot_set(experts, 0, r)
        if hs is None:
            continue
        hot = hs[0]
        if len(hot) >= experts:
            raise ConfigError(f"{option}: {spec!r}: the hot set covers all {experts} experts; leave some out")
        if not hot and sk.kind != "cold-rank":
            raise ConfigError(f"{option}: {spec!r}: the hot set is empty (rank holds no experts)")
        if sk.kind == "cold-rank" and experts - len(hot) < top_k:
            raise ConfigError(
                f"{option}: {spec!r} leaves {experts - len(hot)} experts with tokens, fewer than --top-k {top_k} "
                "(a token picks top_k distinct experts)"
            )
        p = skew_probabilities(sk, experts, 0, r)
        e = max(range(experts), key=lambda i: p[i])
        if p[e] > 1.0 / top_k + 1e-12:
            raise ConfigError(
                f"{option}: {spec!r} gives expert {e} a share of {p[e]:.4g}, more than 1/top_k = {1.0 / top_k:g} "
                f"(--top-k {top_k}: a token picks an expert at most once); choose a smaller share or more experts"
            )


def parse_skew(
    spec: str,
    experts: int,
    top_k: int,
    option: str = "--skew",
    rank_experts: Sequence[Sequence[int]] = (),
) -> SkewSpec:
    """Parse a routing workload (module doc) against the expert count, top-k and the experts per rank.

    ``hot:E:S`` makes expert E receive the fraction S of all assignments; a token picks an expert at
    most once, so no expert's share can exceed ``1/top_k``.

    Args:
        spec: The text of ``option``.
        experts: E.
        top_k: k.
        option: The option named in errors.
        rank_experts: Experts each rank holds under the run's placement (``hotrank``, ``cold-rank``,
            ``affinity``).

    Raises:
        ConfigError: unknown form, non-numeric or out-of-range values, an unrealisable share (names ``option``).
    """
    parts = spec.strip().lower().split(":")
    if parts == ["uniform"]:
        return SkewSpec()
    if parts[0] == "zipf" and len(parts) == 2:
        a = _num(parts[1], "exponent", spec, option)
        if a <= 0:
            raise ConfigError(f"{option}: zipf exponent must be > 0, got {parts[1]}; {_SKEW_HELP}")
        return SkewSpec("zipf", exponent=a)
    if parts[0] == "hot" and len(parts) == 3:
        e = _num(parts[1], "expert", spec, option)
        s = _num(parts[2], "share", spec, option)
        if e != int(e) or not 0 <= e < experts:
            raise ConfigError(
                f"{option}: hot expert {parts[1]} is not an expert id in 0..{experts - 1} (--experts {experts})"
            )
        if not 0 < s <= 1.0 / top_k + 1e-12:
            raise ConfigError(
                f"{option}: hot share {parts[2]} must be in (0, 1/top_k] = (0, {1.0 / top_k:g}] "
                f"(--top-k {top_k}: a token picks an expert at most once)"
            )
        return SkewSpec("hot", expert=int(e), share=s)
    if parts[0] == "burst" and len(parts) >= 3:
        every = _int(parts[1], "period", spec, option)
        if every < 1:
            raise ConfigError(f"{option}: burst period {every} must be an integer >= 1")
        if parts[2] == "burst":
            raise ConfigError(f"{option}: burst cannot nest another burst in {spec!r}")
        inner = parse_skew(":".join(parts[2:]), experts, top_k, option, rank_experts)
        return SkewSpec("burst", every=every, inner=inner)
    sk = _parse_hot_set(parts, spec, experts, option, rank_experts)
    if sk is None:
        raise ConfigError(f"{option}: unknown spec {spec!r}; {_SKEW_HELP}")
    _check_realisable(sk, spec, experts, top_k, option)
    return sk


def parse_straggler(spec: str | None, ranks: int) -> Straggler | None:
    """Parse ``RANK:MS`` (``None`` or empty: no straggler).

    Raises:
        ConfigError: bad form, rank outside ``0..ranks-1`` or a negative delay (names ``--straggler``).
    """
    if spec is None or not spec.strip():
        return None
    parts = spec.strip().split(":")
    if len(parts) != 2:
        raise ConfigError(f"--straggler: expected RANK:MS (e.g. 2:30), got {spec!r}")
    try:
        rank, ms = int(parts[0]), float(parts[1])
    except ValueError:
        raise ConfigError(
            f"--straggler: expected RANK:MS with an integer rank and a number of ms, got {spec!r}"
        ) from None
    if not 0 <= rank < ranks:
        raise ConfigError(f"--straggler: rank {rank} is out of range 0..{ranks - 1} (--ranks {ranks})")
    if not math.isfinite(ms) or ms < 0:
        raise ConfigError(f"--straggler: delay must be a finite number of ms >= 0, got {parts[1]}")
    return Straggler(rank, ms)


def skew_probabilities(skew: SkewSpec, experts: int, step: int = 0, rank: int = 0) -> list[float]:
    """Target routing probability of each expert at ``step`` for source ``rank`` (sums to 1).

    Zipf: expert 0 is the most popular. Hot-set kinds: the exact share of all assignments each expert
    gets (the demo samples these marginals exactly); ``hot``: the hot expert's share, the rest even.
    """
    skew = skew.at(step)
    if skew.kind == "zipf":
        w = [(e + 1) ** -skew.exponent for e in range(experts)]
    elif skew.kind == "hot":
        rest = (1.0 - skew.share) / (experts - 1) if experts > 1 else 0.0
        w = [skew.share if e == skew.expert else rest for e in range(experts)]
    else:
        hs = skew.hot_set(experts, step, rank)
        if hs is None:
            w = [1.0] * experts
        else:
            hot, share = set(hs[0]), hs[1]
            rest = (1.0 - share) / (experts - len(hot))
            w = [share / len(hot) if e in hot else rest for e in range(experts)]
    total = sum(w)
    return [v / total for v in w]
