"""One vocabulary for collective names, shared by the Kineto and Nsight parsers.

Names a collective call can go by, per era and tool:

* c10d dispatcher ops: ``c10d::alltoall_base_``, ``c10d::_allgather_base_``, ``c10d::recv_``;
* functional collectives: ``_c10d_functional::all_to_all_single``;
* ProcessGroup profiling titles (Kineto ``user_annotation``, nsys NVTX): ``nccl:all_to_all``,
  ``nccl:_all_gather_base``, ``gloo:all_to_all``;
* ``record_param_comms``' ``Collective name`` metadata: ``all_to_allv``, ``_reduce_scatter_base``;
* NCCL API NVTX ranges (nsys, NCCL's own domain): ``ncclAllReduce``, ``ncclBcast``.

:func:`normalise_collective` maps any of them to the schema vocabulary (``collectives.collective``)
or ``'unknown'``; :func:`collective_range_type` also says whether a range *name* is a collective
marker at all (Nsight ranges: every NVTX range is a candidate, so a name must carry one of the
prefixes above to count), and :func:`collective_range_types` applies it to a column once per
distinct name.
"""

from __future__ import annotations

import functools
import re

import polars as pl

__all__ = ["normalise_collective", "collective_range_type", "collective_range_types"]

_TYPES = {
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "alltoallv": "all_to_allv",
    "all_to_allv": "all_to_allv",
    "allreduce": "allreduce",
    "all_reduce": "allreduce",
    "allgather": "allgather",
    "all_gather": "allgather",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "broadcast": "broadcast",
    "bcast": "broadcast",
    "send": "send",
    "recv": "recv",
    "recv_any_source": "recv",
    "recvanysource": "recv",
    "barrier": "barrier",
    "monitored_barrier": "barrier",
}
_SUFFIXES = ("_single", "_coalesced", "_into_tensor", "_tensor", "_base", "_out")
#: torch symmetric-memory op prefixes (torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu:
#: ``symm_mem::multimem_all_reduce_``, ``one_shot_all_reduce``, ``two_shot_all_reduce_``, ...)
_SYMM_PREFIXES = ("multimem_one_shot_", "multimem_", "one_shot_", "two_shot_")
#: serving-engine custom op prefixes: SGLang's GroupCoordinator ops (python/sglang/srt/distributed/
#: parallel_state.py: ``sglang::inplace_all_reduce``, ``sglang::outplace_all_reduce``,
#: ``sglang::reg_all_gather_into_tensor``) and TensorRT-LLM's MoE finalize + all-reduce fusion
#: (``trtllm::moe_allreduce``, ``trtllm::moe_finalize_allreduce``)
_ENGINE_PREFIXES = ("inplace_", "outplace_", "reg_", "moe_finalize_", "moe_")
_NCCL_API = re.compile(r"^nccl(?=[A-Z])")
#: Range names that mark a collective call (the type is then :func:`normalise_collective`'s).
_MARKER = re.compile(r"^(?:c10d::|_c10d_functional::|nccl:|gloo:|nccl[A-Z])")


def normalise_collective(name: str | None) -> str:
    """Normalise an op / title / ``Collective name`` / NCCL API name to the schema vocabulary.

    ``'c10d::alltoall_base_'`` -> ``'all_to_all'``, ``'nccl:_all_gather_base'`` -> ``'allgather'``,
    ``'_reduce_scatter_base'`` -> ``'reduce_scatter'``, ``'ncclBcast'`` -> ``'broadcast'``;
    anything else -> ``'unknown'``.
    """
    # a few dozen distinct names per trace, each met once per call (x4 per collective): cached
    return _normalise(name) if name.__class__ is str else _normalise.__wrapped__(name)


@functools.lru_cache(maxsize=4096)
def _normalise(name: str | None) -> str:
    if not name:
        return "unknown"
    token = _NCCL_API.sub("", name.split("::")[-1].split(":")[-1]).lower().strip("_")
    for prefix in _SYMM_PREFIXES + _ENGINE_PREFIXES:
        token = token.removeprefix(prefix)
    for suffix in _SUFFIXES:
        token = token.replace(suffix, "")
    return _TYPES.get(token.strip("_"), "unknown")


def collective_range_type(name: str | None) -> str | None:
    """The collective a host range name marks, or None when it marks none.

    ``'nccl:all_to_all'`` -> ``'all_to_all'``; ``'ncclGroupEnd'``, ``'ncclSend'``,
    ``'_c10d_functional::wait_tensor'``, ``'aten::mm'`` -> None."""
    if not name or not _MARKER.match(name):
        return None
    t = normalise_collective(name)
    if t == "unknown" or (t in ("send", "recv") and _NCCL_API.match(name)):
        # ncclSend / ncclRecv sit between ncclGroupStart / ncclGroupEnd and launch nothing
        # themselves; the Nsight parser types the group by counting them (nsys_collectives)
        return None
    return t


def collective_range_types(names: pl.Series) -> pl.Series:
    """:func:`collective_range_type` of every name (null where none), computed once per distinct name."""
    uniq = names.drop_nulls().unique().to_list()
    mapping = {n: t for n in uniq if (t := collective_range_type(n)) is not None}
    return names.replace_strict(mapping, default=None, return_dtype=pl.Utf8)
