"""Physical expert slots: where each routed assignment goes under a placement with replicas.

A placement (:class:`ep_trace.expert_placement.ExpertPlacement`) puts ``n_r`` experts on rank r.
Its *physical slots* are those experts numbered rank-major: rank 0's experts are slots
``0 .. n_0-1`` (in its local weight order), rank 1's the next ``n_1``, and so on; a replica is a
slot of its own. Mapping every assignment (token, top-k slot) to a physical slot and sorting by it
makes the send buffer contiguous per destination rank and, within it, grouped by local expert,
which is what the EP layer's count exchange and token all-to-all need
(:func:`ep_trace.workloads.moe.ep_moe_forward`).

The choice among an expert's replicas follows the replica rule of :mod:`ep_trace.expert_placement`
(the source's node first, then the i-th assignment to candidate ``i mod n``), vectorised here.
For the contiguous placement without replicas the slot of expert e is e, and nothing is computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ep_trace.expert_placement import ExpertPlacement

__all__ = ["SlotMap", "slot_map"]


@dataclass(frozen=True)
class SlotMap:
    """One placement's physical slots, seen from one source rank.

    Attributes:
        slots: Experts held by each rank (``n_r``); their sum is the number of physical slots P.
        slot_expert: ``[P]`` global expert id of each slot.
        candidates: ``[E, M]`` the slots this source may send expert e to (padded with the first).
        n_candidates: ``[E]`` how many of ``candidates[e]`` are real.
        identity: Slot e is expert e and has no replica (contiguous placement): :meth:`assign` is the identity.
    """

    slots: tuple[int, ...]
    slot_expert: torch.Tensor
    candidates: torch.Tensor
    n_candidates: torch.Tensor
    identity: bool

    @property
    def world_size(self) -> int:
        """Ranks."""
        return len(self.slots)

    @property
    def num_slots(self) -> int:
        """P, physical slots over all ranks."""
        return sum(self.slots)

    @property
    def uniform(self) -> bool:
        """Every rank holds the same number of slots."""
        return len(set(self.slots)) == 1

    def assign(self, flat_ids: torch.Tensor) -> torch.Tensor:
        """Physical slot of each assignment; ``flat_ids`` = ``topk_ids.reshape(-1)`` (token-major order).

        The i-th assignment to expert e (in token order) goes to ``candidates[e, i mod n_candidates[e]]``.
        """
        if self.identity:
            return flat_ids
        n_e = self.candidates.shape[0]
        order = torch.argsort(flat_ids, stable=True)
        counts = torch.bincount(flat_ids, minlength=n_e)
        start = torch.cumsum(counts, 0) - counts
        occurrence = torch.empty_like(flat_ids)
        occurrence[order] = torch.arange(flat_ids.numel(), device=flat_ids.device) - start[flat_ids[order]]
        pick = occurrence % self.n_candidates[flat_ids]
        return self.candidates[flat_ids, pick]

    def rows_per_rank(self, slot_counts: torch.Tensor) -> torch.Tensor:
        """``[W]`` rows for each rank from ``[P]`` rows per slot."""
        if self.uniform:
            return slot_counts.view(self.world_size, -1).sum(1)
        owner = torch.repeat_interleave(
            torch.arange(self.world_size, device=slot_counts.device),
            torch.tensor(self.slots, device=slot_counts.device),
        )
        return torch.zeros(self.world_size, dtype=slot_counts.dtype, device=slot_counts.device).index_add_(
            0, owner, slot_counts
        )


def slot_map(
    placement: ExpertPlacement, src: int, node_of: Sequence[int] | None = None, device: torch.device | None = None
) -> SlotMap:
    """The :class:`SlotMap` of ``placement`` for source rank ``src`` (group-local ranks).

    Args:
        placement: Experts per rank.
        src: The source rank (its node decides which replicas are near).
        node_of: Node of each rank (``None``: all on one node).
        device: Where the index tensors live.
    """
    first = [0]
    for held in placement.ranks:
        first.append(first[-1] + len(held))
    slot_of = {(r, e): first[r] + i for r, held in enumerate(placement.ranks) for i, e in enumerate(held)}
    cand = [[slot_of[(r, e)] for r in placement.candidates(e, src, node_of)] for e in range(placement.num_experts)]
    width = max(len(c) for c in cand)
    padded = [c + [c[0]] * (width - len(c)) for c in cand]
    experts = [e for held in placement.ranks for e in held]
    identity = width == 1 and all(c[0] == e for e, c in enumerate(cand)) and len(experts) == placement.num_experts
    return SlotMap(
        slots=tuple(len(h) for h in placement.ranks),
        slot_expert=torch.tensor(experts, dtype=torch.int64, device=device),
        candidates=torch.tensor(padded, dtype=torch.int64, device=device),
        n_candidates=torch.tensor([len(c) for c in cand], dtype=torch.int64, device=device),
        identity=identity,
    )
