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
                    ``ncclDevKernel_Generic_1``; NVLS / NVLS_TREE / COLLNET_DIRECT / COLLNET_CHAIN
                    algorithm tokens in the same places; pre-2.4 ``ncclAllReduceRingLLKernel_sum_f32``
                    (also RCCL builds, which keep NCCL's kernel names)
``rccl``            RCCL-only names: ``ncclDevKernelDebug_Generic``, ``rccl...Kernel...``
``msccl``           MSCCL / MSCCL++: ``mscclKernel_Sum_float_LL``, ``mscclpp::collective::...``
``deepep``          DeepEP: ``deep_ep::intranode::dispatch``, ``deep_ep::legacy::internode_ll::combine``,
                    ``deep_ep::elastic::dispatch_impl``, ``dpsk::ep::...`` (not ``deep_ep::layout::``)
``pplx``            pplx-kernels: ``(anonymous namespace)::dispatchKernel<...>``, ``combineKernel<...>``
``mori``            MORI: ``mori::moe::EpDispatchIntraNodeKernel``, ``EpCombineInterNodeKernel_bf16``
``nvshmem``         NVSHMEM device kernels: ``nvshmemi_...``, ``nvshmemx_...``, ``nvshmem_...``
``trtllm_moe_a2a``  TensorRT-LLM MoE all-to-all: ``moeA2ADispatchKernel``, ``moeA2ACombineKernel``,
                    ``moeAllToAllKernel``
``torch_symm_mem``  torch symmetric memory: ``multimem_all_reduce_kernel``,
                    ``multimem_one_shot_all_reduce_kernel``, ``one_shot_all_reduce_kernel``,
                    ``two_shot_all_reduce_kernel``, ``multimem_all_gather_kernel``
``custom_allreduce``  vLLM / SGLang / aiter custom all-reduce: ``cross_device_reduce_1stage|2stage``,
                    TensorRT-LLM / FlashInfer ``allreduce_fusion_kernel_oneshot_lamport``,
                    ``oneShotAllReduceKernel``, MNNVL ``oneshotAllreduceFusionKernel``,
                    Transformer Engine userbuffers ``userbuffers_...``
==================  =========================================================================

Order matters: the first matching family wins (``rccl`` before ``nccl`` because RCCL debug
kernels also start with ``nccl``).
"""

from __future__ import annotations

import re
from typing import Any

import polars as pl

__all__ = [
    "COMM_KERNEL_PATTERNS",
    "CUSTOM_ALLREDUCE_KERNELS",
    "FAMILY_COLLECTIVE",
    "comm_family",
    "comm_family_expr",
    "first_match_expr",
    "is_comm_expr",
]

# Optional return type / leading qualifiers printed by demangled names.
_P = r"^(?:void\s+)?(?:::)?"

#: The one-shot / two-shot all-reduce kernels of vLLM, SGLang, aiter, TensorRT-LLM and FlashInfer (an
#: alternation, no anchor): the ``custom_allreduce`` family below, with Transformer Engine's userbuffers,
#: and the MoE output all-reduce of :mod:`ep_trace.analysis.kernel_families`, without them.
CUSTOM_ALLREDUCE_KERNELS = (
    r"cross_device_reduce_[12]stage|allreduce_fusion_kernel|oneShotAllReduceKernel"
    r"|twoShotAllReduceKernel|oneshotAllreduceFusionKernel|twoshotAllreduceKernel"
    r"|lamport_style_one_shot_all_reduce_norm_kernel|moe(?:finalize|reduce)_allreduce_fusion_kernel"
)

#: (family, regex) pairs, tried in order; regexes use the Rust ``regex`` syntax shared by polars and
#: Python ``re`` (no look-around).
COMM_KERNEL_PATTERNS: tuple[tuple[str, str], ...] = (
    ("rccl", _P + r"(?:ncclDevKernelDebug_|rccl\w*Kernel)"),
    # every NCCL era: ncclKernel_<Coll>_<ALGO>_<PROTO>_<Op>_<type> (< 2.19, ALGO incl. NVLS, NVLS_TREE,
    # COLLNET_DIRECT, COLLNET_CHAIN), ncclDevKernel_<...> (>= 2.19, same algorithm tokens),
    # nccl<Coll><Algo><Proto>Kernel_<op>_<type> (< 2.4); NVIDIA/nccl src/device/generate.py
    ("nccl", _P + r"(?:ncclKernel_|ncclDevKernel_|nccl[A-Z][A-Za-z]*Kernel)"),
    ("msccl", _P + r"(?:msccl\w*Kernel|mscclpp::)"),
    # deep_ep::layout::get_dispatch_layout is local compute (counts per rank / expert), not comm
    (
        "deepep",
        _P + r"(?:deep_ep::(?:legacy::)?(?:intranode|internode|internode_ll)::|deep_ep::elastic::|dpsk::ep::)",
    ),
    # pplx-kernels: dispatchKernel / combineKernel templates in an anonymous namespace (intranode) or
    # at global scope (internode_combine.cu); perplexityai/pplx-kernels csrc/all_to_all/*.cu
    ("pplx", _P + r"(?:pplx::|(?:\(anonymous namespace\)::)?(?:dispatch|combine)Kernel<)"),
    # MORI: mori::moe::EpDispatch*/EpCombine* (C++) or extern "C" EpDispatchIntraNodeKernel_bf16 ...;
    # mori_shmem_* / mori::shmem:: barriers; ROCm/mori src/ops/dispatch_combine, src/ops/kernels
    ("mori", _P + r"(?:mori::moe::Ep(?:Dispatch|Combine)|Ep(?:Dispatch|Combine)\w*Kernel|mori_shmem_|mori::shmem::)"),
    ("nvshmem", _P + r"nvshmem[ix]?_"),
    (
        "trtllm_moe_a2a",
        _P + r"(?:\w+::)*(?:moeA2A(?:Prepare)?(?:Dispatch|Combine)Kernel|moeAllToAllKernel)",
    ),
    # torch symmetric memory (torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu): kernels in
    # an anonymous namespace; two_shot_all_reduce_kernel<..., true> is the reduce-scatter
    (
        "torch_symm_mem",
        _P + r"(?:\(anonymous namespace\)::)?(?:multimem_(?:one_shot_)?all_reduce|multimem_all_gather"
        r"|one_shot_all_reduce|two_shot_all_reduce)_kernel",
    ),
    ("custom_allreduce", _P + r"(?:\w+::)*(?:" + CUSTOM_ALLREDUCE_KERNELS + r"|userbuffers_)"),
)

#: Collective a kernel of each family implements when no launching op names it (one row per kernel
#: launch; DeepEP / pplx / MORI / TensorRT-LLM dispatch and combine move variable-size token lists).
FAMILY_COLLECTIVE: dict[str, str] = {
    "deepep": "all_to_allv",
    "pplx": "all_to_allv",
    "mori": "all_to_allv",
    "trtllm_moe_a2a": "all_to_allv",
    "torch_symm_mem": "allreduce",
    "custom_allreduce": "allreduce",
}

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
