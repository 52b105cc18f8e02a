"""Communication-kernel classifier: kernel name -> communication library family (or None).

Pure module (polars only, no torch, no parsers): the parsers use it to flag comm kernels and the
analysis uses it to split device time into communication and compute.

Why a table and not ``^nccl``: kernel names of communication libraries changed across versions and
vendors, and several EP libraries (DeepEP, pplx, NVSHMEM-based kernels) do not start with ``nccl``.
The family says *which library* moved the bytes, never *which collective* it was: one
``ncclDevKernel_SendRecv`` serves all-to-all, p2p and grouped collectives (NVIDIA/nccl#739), so the
collective type must come from the launching op / NVTX range.

Every pattern is anchored at the start of the name, optionally after a ``void `` return type
(Kineto and nsys ``demangledName`` print ``void deep_ep::intranode::dispatch<...>(...)``), so that
a library name appearing inside a template argument of a compute kernel never matches.

==================  =========================================================================
family              names matched (examples)
==================  =========================================================================
``nccl``            NCCL < 2.19 ``ncclKernel_AllReduce_RING_LL_Sum_float``; NCCL >= 2.19
                    ``ncclDevKernel_SendRecv``, ``ncclDevKernel_AllGather_RING_LL``,
                    ``ncclDevKernel_Generic_1``; pre-2.4 ``ncclAllReduceRingLLKernel_sum_f32``
                    (also RCCL builds, which keep NCCL's kernel names)
``rccl``            RCCL-only names: ``ncclDevKernelDebug_Generic``, ``rccl...Kernel...``
``msccl``           MSCCL / MSCCL++: ``mscclKernel_Sum_float_LL``, ``mscclpp::...``
``deepep``          DeepEP: ``deep_ep::intranode::dispatch``, ``deep_ep::internode_ll::combine``,
                    ``dpsk::ep::...``
``pplx``            pplx-kernels: ``pplx::...dispatchKernel``, ``pplx::...combineKernel``
``nvshmem``         NVSHMEM device kernels: ``nvshmemi_...``, ``nvshmemx_...``, ``nvshmem_...``
``trtllm_moe_a2a``  TensorRT-LLM MoE all-to-all: ``moeA2ADispatchKernel``, ``moeA2ACombineKernel``
``custom_allreduce``  vLLM / SGLang custom all-reduce: ``cross_device_reduce_1stage|2stage``,
                    TensorRT-LLM ``allreduce_fusion_kernel``/``oneShotAllReduceKernel``,
                    Transformer Engine userbuffers ``userbuffers_...``
==================  =========================================================================

Order matters: the first matching family wins (``rccl`` before ``nccl`` because RCCL debug
kernels also start with ``nccl``).
"""

from __future__ import annotations

import re
from typing import Any

import polars as pl

__all__ = ["COMM_KERNEL_PATTERNS", "comm_family", "comm_family_expr", "first_match_expr", "is_comm_expr"]

# Optional return type / leading qualifiers printed by demangled names.
_P = r"^(?:void\s+)?(?:::)?"

#: (family, regex) pairs, tried in order; regexes use the Rust ``regex`` syntax shared by polars and
#: Python ``re`` (no look-around).
COMM_KERNEL_PATTERNS: tuple[tuple[str, str], ...] = (
    ("rccl", _P + r"(?:ncclDevKernelDebug_|rccl\w*Kernel)"),
    ("nccl", _P + r"(?:ncclKernel_|ncclDevKernel_|nccl[A-Z][A-Za-z]*Kernel)"),
    ("msccl", _P + r"(?:msccl\w*Kernel|mscclpp::)"),
    ("deepep", _P + r"(?:deep_ep::|dpsk::ep::)"),
    ("pplx", _P + r"pplx::"),
    ("nvshmem", _P + r"nvshmem[ix]?_"),
    ("trtllm_moe_a2a", _P + r"(?:\w+::)*moeA2A\w*Kernel"),
    (
        "custom_allreduce",
        _P + r"(?:\w+::)*(?:cross_device_reduce_[12]stage|allreduce_fusion_kernel|oneShotAllReduceKernel"
        r"|twoShotAllReduceKernel|userbuffers_)",
    ),
)

_COMPILED = tuple((family, re.compile(rx)) for family, rx in COMM_KERNEL_PATTERNS)


def first_match_expr(name: pl.Expr, table: tuple[tuple[str, str], ...]) -> pl.Expr:
    """Polars expression: the label of the first ``(label, regex)`` row whose regex matches, else null.

    Args:
        name: A Utf8 expression.
        table: ``(label, regex)`` rows, tried in order.
    """
    rows = list(table)
    label, rx = rows[0]
    chain: Any = pl.when(name.str.contains(rx)).then(pl.lit(label))  # Then, then ChainedThen
    for label, rx in rows[1:]:
        chain = chain.when(name.str.contains(rx)).then(pl.lit(label))
    return chain.otherwise(pl.lit(None, dtype=pl.Utf8))


def comm_family_expr(name: pl.Expr) -> pl.Expr:
    """Polars expression: the communication family of a kernel name, or null for compute kernels.

    Args:
        name: A Utf8 expression holding kernel names (short or demangled).

    Returns:
        A Utf8 expression with a family from :data:`COMM_KERNEL_PATTERNS` or null.
    """
    return first_match_expr(name, COMM_KERNEL_PATTERNS)


def is_comm_expr(name: pl.Expr) -> pl.Expr:
    """Polars expression: True where ``name`` is a communication kernel (null names give False)."""
    rx = "|".join(f"(?:{p})" for _, p in COMM_KERNEL_PATTERNS)
    return name.str.contains(rx).fill_null(False)


def comm_family(name: str) -> str | None:
    """The communication family of one kernel name (scalar helper for tests and small lookups)."""
    for family, rx in _COMPILED:
        if rx.search(name):
            return family
    return None
