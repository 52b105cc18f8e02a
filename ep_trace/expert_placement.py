"""The expert placement file and the replica rule: which rank computes an assignment (no torch, no polars).

A placement says which experts each rank holds. Its file, written by ``ep-trace analyze
--propose-placement FILE`` and read by ``ep-trace demo --placement FILE``, is one JSON object::

    {"num_experts": 8, "ranks": [[0, 1, 7], [2, 3, 7], [4, 5], [6]]}

``ranks[r]`` lists the expert ids rank r holds, in the order of its local weight slots. An id on
several ranks is a *replica* (here expert 7 on ranks 0 and 1): ``redundant_experts`` counts the
copies beyond one per expert (1 here; 0 for a partition). Every expert must be on at least one rank.
A rank may hold no experts (an empty list): it still routes its own tokens and takes part in every
all-to-all, but computes none. Other keys are ignored (room for a framework's own fields).

The replica rule (what ``ep-trace demo`` runs and what a placement what-if must price): an
assignment of source rank s to expert e goes to one of e's *candidates*: the ranks holding e on
s's node when there are any (s itself included), else every rank holding e. Among the n candidates
(ascending rank order) the i-th assignment of s to e, in token order, goes to candidate ``i mod n``:
an even split, exact to one row, deterministic. vLLM's EPLB splits the same way, by the
assignment's flat position modulo the replica count (``vllm-project/vllm``,
``vllm/model_executor/layers/fused_moe/router/base_router.py``, ``eplb_map_to_physical_and_record``);
SGLang's static dispatch prefers a replica on the same GPU, then the same node, before spreading
over the rest (``sgl-project/sglang``, ``python/sglang/srt/eplb/expert_location.py``,
``compute_logical_to_rank_dispatch_physical_map``). Hence for ``c`` assignments of s to e,
candidate j (0-based) receives ``c // n + (1 if j < c % n else 0)`` rows (:meth:`ExpertPlacement.dispatch_rows`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ep_trace.errors import ConfigError

__all__ = ["ExpertPlacement", "contiguous_placement", "parse_placement", "read_placement", "FORMAT_HINT"]

#: What a placement file looks like (error messages).
FORMAT_HINT = '{"num_experts": E, "ranks": [[expert ids of rank 0], [expert ids of rank 1], ...]}'


@dataclass(frozen=True)
class ExpertPlacement:
    """Experts held by each rank (``ranks[r]``, in local slot order); replicas allowed.

    Attributes:
        num_experts: Routed experts E (ids ``0 .. E-1``).
        ranks: ``ranks[r]`` = expert ids rank r holds; every id on at least one rank.
    """

    num_experts: int
    ranks: tuple[tuple[int, ...], ...]

    @property
    def world_size(self) -> int:
        """Ranks the placement spans."""
        return len(self.ranks)

    @property
    def holders(self) -> list[list[int]]:
        """``holders[e]`` = ranks holding expert e, ascending (the sidecar's ``meta.placement``)."""
        out: list[list[int]] = [[] for _ in range(self.num_experts)]
        for r, experts in enumerate(self.ranks):
            for e in experts:
                out[e].append(r)
        return out

    @property
    def redundant_experts(self) -> int:
        """Copies beyond one per expert (the sidecar's ``meta.redundant_experts``; 0 for a partition)."""
        return sum(len(x) for x in self.ranks) - self.num_experts

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object."""
        return {"num_experts": self.num_experts, "ranks": [list(x) for x in self.ranks]}

    def candidates(self, expert: int, src: int, node_of: Sequence[int] | None = None) -> list[int]:
        """Ranks that may compute ``src``'s assignments to ``expert``: its holders on ``src``'s node, else all.

        Args:
            expert: Expert id.
            src: Source rank.
            node_of: Node of each rank (``None``: one node).
        """
        held = self.holders[expert]
        if node_of is None:
            return held
        near = [r for r in held if node_of[r] == node_of[src]]
        return near or held

    def dispatch_rows(self, src: int, expert_counts: Sequence[int], node_of: Sequence[int] | None = None) -> list[int]:
        """Rows ``src`` sends to each rank for its per-expert assignment counts, under the replica rule.

        Args:
            src: Source rank.
            expert_counts: Assignments of ``src`` to each expert (length E).
            node_of: Node of each rank (``None``: one node).

        Returns:
            Rows to each rank (length :attr:`world_size`): a row of the layer's dispatch count matrix.
        """
        rows = [0] * self.world_size
        for e, c in enumerate(expert_counts):
            if not c:
                continue
            cand = self.candidates(e, src, node_of)
            n = len(cand)
            for j, r in enumerate(cand):
                rows[r] += c // n + (1 if j < c % n else 0)
        return rows


def contiguous_placement(num_experts: int, world_size: int) -> ExpertPlacement:
    """Rank r holds experts ``r*L .. r*L+L-1`` (L = E / W; E must be a multiple of W): no replicas."""
    per = num_experts // world_size
    return ExpertPlacement(num_experts, tuple(tuple(range(r * per, (r + 1) * per)) for r in range(world_size)))


def _show(v: Any) -> str:
    """A JSON value as it reads in the file, on one line, at most 40 characters."""
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _expert_id(v: Any, r: int, where: str, experts: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{where}: rank {r} lists {_show(v)}, not an expert id; expected {FORMAT_HINT}")
    if not 0 <= v < experts:
        raise ConfigError(f"{where}: rank {r} lists expert {v}, outside 0..{experts - 1} (num_experts {experts})")
    return v


def parse_placement(
    obj: Any, where: str, *, num_experts: int | None = None, world_size: int | None = None
) -> ExpertPlacement:
    """Validate a placement file's JSON object.

    Args:
        obj: The parsed JSON.
        where: Prefix of error messages (the option and the file, e.g. ``"--placement p.json"``).
        num_experts: E the placement must have (``None``: any).
        world_size: Ranks it must list (``None``: any).

    Raises:
        ConfigError: one line naming ``where``: not an object, missing or mistyped keys, a
            ``num_experts`` or rank count other than required, an id out of range or listed twice on
            one rank, an expert on no rank.
    """
    if not isinstance(obj, dict) or not isinstance(obj.get("ranks"), list) or "num_experts" not in obj:
        raise ConfigError(f"{where}: expected an object {FORMAT_HINT}")
    e = obj["num_experts"]
    if isinstance(e, bool) or not isinstance(e, int) or e < 1:
        raise ConfigError(f"{where}: num_experts must be an integer >= 1, got {e!r}")
    if num_experts is not None and e != num_experts:
        raise ConfigError(f"{where}: num_experts is {e} but --experts is {num_experts}")
    lists = obj["ranks"]
    if world_size is not None and len(lists) != world_size:
        raise ConfigError(f"{where}: lists {len(lists)} ranks but --ranks is {world_size}")
    if not lists:
        raise ConfigError(f"{where}: lists no ranks; expected {FORMAT_HINT}")
    ranks: list[tuple[int, ...]] = []
    for r, held in enumerate(lists):
        if not isinstance(held, list):
            raise ConfigError(f"{where}: rank {r} is {_show(held)}, not a list of expert ids; expected {FORMAT_HINT}")
        ids = tuple(_expert_id(v, r, where, e) for v in held)
        dup = next((x for i, x in enumerate(ids) if x in ids[:i]), None)
        if dup is not None:
            raise ConfigError(f"{where}: rank {r} lists expert {dup} twice (a replica goes on another rank)")
        ranks.append(ids)
    placed = {x for ids in ranks for x in ids}
    missing = [x for x in range(e) if x not in placed]
    if missing:
        listed = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
        what = f"expert {listed} is" if len(missing) == 1 else f"experts {listed} ({len(missing)}) are"
        raise ConfigError(f"{where}: {what} on no rank; every expert needs at least one rank")
    return ExpertPlacement(e, tuple(ranks))


def read_placement(
    path: str | Path, option: str, *, num_experts: int | None = None, world_size: int | None = None
) -> ExpertPlacement:
    """Read and validate a placement file (:func:`parse_placement`); errors start with ``"{option} {path}: "``.

    Raises:
        ConfigError: the file cannot be read, is not JSON, or fails :func:`parse_placement`.
    """
    where = f"{option} {path}"
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the file ({exc.strerror or exc})") from None
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{where}: not JSON ({msg}); expected {FORMAT_HINT}") from None
    return parse_placement(obj, where, num_experts=num_experts, world_size=world_size)
