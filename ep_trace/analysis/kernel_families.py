"""Kernel families of MoE frameworks: which device kernel belongs to which EP stage.

The rows are the ``stage`` column of the kernel rows of the knowledge table (:mod:`ep_trace.knowledge`,
``ep_trace/families.toml``): every row was read from the framework's own source or seen in a real
trace (its ``source`` names which) and carries real example names a test matches; ``docs/frameworks.md``
is generated from the same table. The communication classifier reads the ``comm`` column of the same
rows, so a DeepEP kernel is a dispatch wherever it is communication. Names are matched against the kernel name as
Kineto / nsys print it (demangled: ``void deep_ep::intranode::dispatch<8, 768>(...)``; Triton
kernels by their Python function name, ``fused_moe_kernel``; precompiled cubins by their symbol,
``bmm_E4m3_E4m3E4m3_...``). First match wins over *all* kernel rows, so the specific rows come before
the generic ones and a communication row without a stage (NCCL's ``Generic`` kernel) stops the search.

Stages: ``route``, ``permute``, ``dispatch``, ``expert``, ``combine``, ``unpermute`` as in
:data:`ep_trace.stage_names.STAGES`, plus placeholders the detector resolves with context
(:mod:`ep_trace.analysis.stages`):

* ``notify`` -- a communication kernel that only exchanges counts / flags for the call next to it
  (DeepEP ``notify_dispatch``, ``cached_notify``; its stage is that of the neighbouring DeepEP
  dispatch or combine kernel);
* ``route_aux`` -- a softmax: routing inside an MoE range or next to a top-k, else no stage;
* ``gather`` -- a PyTorch index_select / gather / scatter: inside an MoE range after routing it is
  ``expert`` before the first expert kernel of that range (weight / token gathers feeding the batched
  GEMMs) and ``unpermute`` after it; else no stage;
* ``gemm`` -- a plain GEMM (cuBLAS ``nvjet_*`` / ``sm90_xmma_*``, hipBLASLt ``Cijk_*``, CUTLASS
  ``GemmUniversal``): expert work only when it runs inside an MoE range *after* the routing kernels
  of that range (the gate GEMM before routing is not expert work), else no stage;
* ``ep_collective`` -- an NCCL all-gather / reduce-scatter / broadcast / reduce / send-recv kernel
  (vLLM's ``all_gatherv`` / ``reduce_scatterv`` of uneven sizes are grouped broadcasts / reduces): inside an MoE range it
  is the token ``dispatch`` before the range's first expert kernel and the ``combine`` after it
  (vLLM's default expert-parallel backend gathers the tokens and reduce-scatters the outputs);
  outside one (a CUDA-graph replay) only when it sits right before the routing kernels or right
  after the expert / unpermute kernels; else no stage (a data- or tensor-parallel collective);
* ``ep_allreduce`` -- an all-reduce kernel (NCCL, custom, symmetric-memory): the ``combine`` of the MoE
  layer it directly follows (with tensor parallelism, or expert parallelism over the tensor-parallel
  ranks without an all-to-all backend, every rank holds every token and the all-reduce sums the
  experts' partial outputs: vLLM reduces the ``vllm::moe_forward`` output, SGLang the experts' after
  the routed-scaling multiply and the shared-expert add), inside the MoE range after its expert
  kernels or right after the range; else no stage (the attention's and dense MLPs' all-reduces).
"""

from __future__ import annotations

from dataclasses import dataclass

from ep_trace.knowledge import Row, kernel_rows

__all__ = ["KernelFamily", "KERNEL_FAMILIES", "family_table", "stage_table", "POINTWISE"]


@dataclass(frozen=True)
class KernelFamily:
    """One family row: ``framework`` kernels whose name matches ``regex`` belong to ``stage``."""

    framework: str
    stage: str
    regex: str
    source: str


#: The kernel rows that name a stage or placeholder, in match order.
KERNEL_FAMILIES: tuple[KernelFamily, ...] = tuple(
    KernelFamily(r.framework, r.stage, r.pattern, r.source) for r in kernel_rows() if r.stage is not None
)

#: PyTorch / Inductor pointwise kernels (the ``pointwise`` rows, matched on their own: an
#: ``index_elementwise_kernel`` is a gather by its family and pointwise for the edge rules).
POINTWISE = "|".join(f"(?:{r.pattern})" for r in kernel_rows() if r.stage == "pointwise")


def stage_table(extra: tuple[Row, ...] = ()) -> tuple[tuple[str | None, str], ...]:
    """``(stage, regex)`` of the user rows ``extra`` then every knowledge-table kernel row, in match
    order (a communication row without a stage gives null and stops the search)."""
    return tuple((r.stage, r.pattern) for r in (*extra, *kernel_rows()))


def family_table() -> list[dict[str, str]]:
    """The family table as plain rows (for docs and the CLI)."""
    return [{"framework": f.framework, "stage": f.stage, "regex": f.regex, "source": f.source} for f in KERNEL_FAMILIES]
