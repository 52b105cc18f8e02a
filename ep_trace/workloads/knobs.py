"""Parsing of the demo's routing-skew and straggler knobs (no torch).

Errors name the CLI option, e.g. ``--skew: unknown spec 'foo'; use uniform, zipf:EXP or hot:EXPERT:SHARE``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ep_trace.errors import ConfigError

__all__ = ["SkewSpec", "Straggler", "parse_skew", "parse_straggler", "skew_probabilities"]

_SKEW_HELP = "use uniform, zipf:EXPONENT (e.g. zipf:1.2) or hot:EXPERT:SHARE (e.g. hot:3:0.5)"


@dataclass(frozen=True)
class SkewSpec:
    """Router skew: ``kind`` is ``uniform``, ``zipf`` (``exponent``) or ``hot`` (``expert``, ``share``)."""

    kind: str = "uniform"
    exponent: float = 0.0
    expert: int = 0
    share: float = 0.0

    def __str__(self) -> str:
        if self.kind == "zipf":
            return f"zipf:{self.exponent:g}"
        if self.kind == "hot":
            return f"hot:{self.expert}:{self.share:g}"
        return "uniform"


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


def parse_skew(spec: str, experts: int, top_k: int, option: str = "--skew") -> SkewSpec:
    """Parse ``uniform`` | ``zipf:EXP`` | ``hot:EXPERT:SHARE`` against the expert count and top-k.

    ``hot:E:S`` makes expert E receive the fraction S of all assignments; a token picks an expert at
    most once, so S cannot exceed ``1/top_k``.

    Raises:
        ConfigError: unknown form, non-numeric or out-of-range values (message names ``option``).
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
    raise ConfigError(f"{option}: unknown spec {spec!r}; {_SKEW_HELP}")


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


def skew_probabilities(skew: SkewSpec, experts: int) -> list[float]:
    """Target routing probability of each expert (expert 0 is the most popular under Zipf)."""
    if skew.kind == "zipf":
        w = [(e + 1) ** -skew.exponent for e in range(experts)]
    elif skew.kind == "hot":
        rest = (1.0 - skew.share) / (experts - 1) if experts > 1 else 0.0
        w = [skew.share if e == skew.expert else rest for e in range(experts)]
    else:
        w = [1.0] * experts
    total = sum(w)
    return [v / total for v in w]
