"""The one parseable name format of ep-trace stage ranges (no torch needed).

``stage("dispatch", layer=3, microbatch=1, phase="bwd")`` records a range named::

    ep:dispatch:l3:mb1:bwd

Grammar: ``ep:<stage>[:l<layer>][:mb<microbatch>]:<phase>`` with ``<stage>`` from
:data:`STAGES`, ``<layer>`` / ``<microbatch>`` non-negative integers (omitted when unknown) and
``<phase>`` ``fwd`` or ``bwd``. The same string is used for the Kineto ``record_function`` range
and for the NVTX range, so Kineto and Nsight input are parsed alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ep_trace.errors import ConfigError

__all__ = ["STAGES", "PHASES", "STAGE_NAME_RE", "StageName", "format_stage_name", "parse_stage_name"]

#: Stage vocabulary, in data-path order.
STAGES: tuple[str, ...] = ("route", "permute", "dispatch", "expert", "combine", "unpermute", "shared_expert", "attn")
PHASES: tuple[str, ...] = ("fwd", "bwd")

#: Regex matching a stage range name; groups ``stage``, ``layer``, ``microbatch``, ``phase``.
STAGE_NAME_RE = re.compile(
    r"^ep:(?P<stage>" + "|".join(STAGES) + r")(?::l(?P<layer>\d+))?(?::mb(?P<microbatch>\d+))?:(?P<phase>fwd|bwd)$"
)


@dataclass(frozen=True)
class StageName:
    """A parsed stage range name."""

    stage: str
    layer: int | None = None
    microbatch: int | None = None
    phase: str = "fwd"


def format_stage_name(stage: str, layer: int | None = None, microbatch: int | None = None, phase: str = "fwd") -> str:
    """Build the range name for a stage.

    Raises:
        ConfigError: unknown stage or phase, or a negative layer / micro-batch.
    """
    if stage not in STAGES:
        raise ConfigError(f"stage: unknown stage {stage!r}; use one of {', '.join(STAGES)}")
    if phase not in PHASES:
        raise ConfigError(f"phase: unknown phase {phase!r}; use 'fwd' or 'bwd'")
    parts = ["ep", stage]
    if layer is not None:
        if int(layer) < 0:
            raise ConfigError(f"layer: must be >= 0, got {layer}")
        parts.append(f"l{int(layer)}")
    if microbatch is not None:
        if int(microbatch) < 0:
            raise ConfigError(f"microbatch: must be >= 0, got {microbatch}")
        parts.append(f"mb{int(microbatch)}")
    parts.append(phase)
    return ":".join(parts)


def parse_stage_name(name: str) -> StageName | None:
    """Parse a range name; ``None`` when it is not an ep-trace stage name."""
    m = STAGE_NAME_RE.match(name)
    if m is None:
        return None
    layer = m.group("layer")
    mb = m.group("microbatch")
    return StageName(
        stage=m.group("stage"),
        layer=int(layer) if layer is not None else None,
        microbatch=int(mb) if mb is not None else None,
        phase=m.group("phase"),
    )
