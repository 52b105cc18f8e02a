"""The proposed placement in the formats that take one (the CLI writes them: ``--propose-placement``).

* ep-trace's own (``ep-trace demo --placement FILE``): ``{"num_experts": E, "ranks": [[experts of rank 0],
  ...]}``; an expert id on several ranks is a replica; rank i is the i-th rank of the EP group.
* SGLang's ``--init-expert-location FILE.json`` (python/sglang/srt/eplb/expert_location.py,
  ``compute_initial_expert_location_metadata``: a JSON object with ``physical_to_logical_map`` goes to
  ``ExpertLocationMetadata.init_by_mapping``): ``physical_to_logical_map[layer][p]`` = the logical
  expert of physical slot p, and slot p lives on GPU ``p // num_local_physical_experts``
  (``_compute_gpu_id_of_physical_expert``), every GPU with the same number of slots. A rank holding
  fewer experts than the most loaded one repeats its first expert in the spare slots (a second
  physical copy on one GPU, which SGLang accepts); run SGLang with ``--ep-num-redundant-experts``
  = slots x ranks - E. One row per MoE layer of the trace (the same placement for each).

vLLM takes no placement file (its EPLB places replicas at run time: ``--enable-eplb``,
``EPLBConfig.num_redundant_experts``, vllm/config/parallel.py), nor does Megatron-Core (contiguous
expert blocks per EP rank).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from ep_trace.analysis.placement_plan import PlacementProposal

__all__ = ["ep_trace_placement", "sglang_expert_location", "best_proposal", "sglang_redundant"]


def ep_trace_placement(p: PlacementProposal) -> dict[str, Any]:
    """``{"num_experts": E, "ranks": [[...], ...]}``."""
    return {"num_experts": p.num_experts, "ranks": [sorted(x) for x in p.experts]}


def _slots(p: PlacementProposal) -> list[list[int]]:
    n = max(len(x) for x in p.experts)
    return [sorted(x) + [sorted(x)[0]] * (n - len(x)) for x in p.experts]


def sglang_expert_location(p: PlacementProposal) -> dict[str, Any]:
    """SGLang's ``--init-expert-location`` JSON (module doc)."""
    row = [e for slots in _slots(p) for e in slots]
    return {"physical_to_logical_map": [list(row) for _ in (p.layers or (0,))]}


def sglang_redundant(p: PlacementProposal) -> int:
    """The ``--ep-num-redundant-experts`` SGLang needs for :func:`sglang_expert_location`."""
    return sum(len(s) for s in _slots(p)) - p.num_experts


def best_proposal(proposals: Sequence[PlacementProposal], whatif: pl.DataFrame | None) -> PlacementProposal | None:
    """The proposal with the largest simulated saving (the first on a tie; None without proposals)."""
    if not proposals:
        return None
    saving = {r["scenario"]: int(r["saving_ns"]) for r in whatif.iter_rows(named=True)} if whatif is not None else {}
    return max(proposals, key=lambda p: saving.get(p.scenario, -(1 << 62)))
