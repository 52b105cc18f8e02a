"""Kernel families of MoE frameworks: which device kernel belongs to which EP stage.

Every row was read from the framework's own source (the ``source`` column names the repository and
file; ``docs/frameworks.md`` renders the same table). Names are matched against the kernel name as
Kineto / nsys print it (demangled: ``void deep_ep::intranode::dispatch<8, 768>(...)``; Triton
kernels by their Python function name, ``fused_moe_kernel``; precompiled cubins by their symbol,
``bmm_E4m3_E4m3E4m3_Fp32_...``). First match wins, so the specific rows come before the generic ones.

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

from ep_trace.comm_classifier import CUSTOM_ALLREDUCE_KERNELS

__all__ = ["KernelFamily", "KERNEL_FAMILIES", "family_table"]

_V = r"^(?:void\s+)?"
#: An all-reduce kernel: NCCL's (every naming era), the custom one-shot / two-shot ones of vLLM, SGLang,
#: aiter, TensorRT-LLM and FlashInfer, torch symmetric memory's one-shot ones (the all-reduce kernels of
#: the ``nccl``, ``custom_allreduce`` and ``torch_symm_mem`` families of :mod:`ep_trace.comm_classifier`;
#: not Transformer Engine's userbuffers, which also gather, nor the two-shot symmetric-memory kernel,
#: which is also the reduce-scatter).
_ALLREDUCE = (
    r"(?:nccl(?:Dev)?Kernel_AllReduce(?:_|\()|ncclAllReduce(?:Ring|Tree|CollNet)"
    r"|(?:\w+::)*(?:" + CUSTOM_ALLREDUCE_KERNELS + r")"
    r"|(?:\(anonymous namespace\)::)?(?:multimem_(?:one_shot_)?all_reduce|one_shot_all_reduce)_kernel)"
)


@dataclass(frozen=True)
class KernelFamily:
    """One family row: ``framework`` kernels whose name matches ``regex`` belong to ``stage``."""

    framework: str
    stage: str
    regex: str
    source: str


#: Ordered family table (first match wins).
KERNEL_FAMILIES: tuple[KernelFamily, ...] = (
    # --- DeepEP (normal intranode / internode, low-latency, layout, elastic) -----------------------
    KernelFamily(
        "DeepEP",
        "permute",
        _V + r"deep_ep::(?:legacy::)?layout::get_dispatch_layout",
        "deepseek-ai/DeepEP csrc/kernels/legacy/layout.cu (namespace deep_ep::legacy::layout; "
        "csrc/kernels/layout.cu before 2026: deep_ep::layout)",
    ),
    KernelFamily(
        "DeepEP",
        "notify",
        _V + r"deep_ep::(?:legacy::)?(?:intranode|internode|internode_ll)::"
        r"(?:notify_dispatch|cached_notify_dispatch|cached_notify_combine|cached_notify|clean_low_latency_buffer|barrier)\b",
        "deepseek-ai/DeepEP csrc/kernels/legacy/intranode.cu, internode.cu, internode_ll.cu",
    ),
    KernelFamily(
        "DeepEP",
        "dispatch",
        _V + r"deep_ep::(?:(?:legacy::)?(?:intranode|internode|internode_ll)::dispatch\b"
        r"|elastic::(?:hybrid_)?dispatch(?:_copy_epilogue)?_impl)",
        "deepseek-ai/DeepEP csrc/kernels/legacy/{intranode,internode,internode_ll}.cu; "
        "deep_ep/include/deep_ep/impls/{dispatch,hybrid_dispatch,dispatch_copy_epilogue}.cuh",
    ),
    KernelFamily(
        "DeepEP",
        "combine",
        _V + r"deep_ep::(?:(?:legacy::)?(?:intranode|internode|internode_ll)::combine\b"
        r"|elastic::(?:hybrid_)?combine(?:_reduce_epilogue)?_impl)",
        "deepseek-ai/DeepEP csrc/kernels/legacy/{intranode,internode,internode_ll}.cu; "
        "deep_ep/include/deep_ep/impls/{combine,hybrid_combine,combine_reduce_epilogue}.cuh",
    ),
    # --- pplx-kernels --------------------------------------------------------------------------------
    KernelFamily(
        "pplx-kernels",
        "dispatch",
        _V + r"(?:\(anonymous namespace\)::)?dispatchKernel<",
        "perplexityai/pplx-kernels csrc/all_to_all/{intranode,internode}_dispatch.cu",
    ),
    KernelFamily(
        "pplx-kernels",
        "combine",
        _V + r"(?:\(anonymous namespace\)::)?combineKernel<",
        "perplexityai/pplx-kernels csrc/all_to_all/{intranode,internode}_combine.cu",
    ),
    # --- MORI (ROCm) ---------------------------------------------------------------------------------
    KernelFamily(
        "MORI",
        "permute",
        _V + r"(?:mori::moe::)?(?:mori_)?Convert(?:DispatchOutput|CombineInput)Kernel",
        "ROCm/mori src/ops/dispatch_combine/convert.hpp, src/ops/kernels/ep_intranode.hip",
    ),
    KernelFamily(
        "MORI",
        "dispatch",
        _V + r"(?:mori::moe::)?EpDispatch\w*",
        "ROCm/mori src/ops/dispatch_combine/{intranode,internode,internode_v1,low_latency_async}.hpp",
    ),
    KernelFamily(
        "MORI",
        "combine",
        _V + r"(?:mori::moe::)?EpCombine\w*",
        "ROCm/mori src/ops/dispatch_combine/{intranode,internode,internode_v1,low_latency_async}.hpp",
    ),
    # --- TensorRT-LLM / FlashInfer MoE all-to-all -----------------------------------------------------
    KernelFamily(
        "TensorRT-LLM",
        "dispatch",
        _V + r"(?:\w+::)*moeA2A(?:Prepare)?DispatchKernel",
        "flashinfer-ai/flashinfer csrc/nv_internal/tensorrt_llm/kernels/communicationKernels/moeAlltoAllKernels.cu "
        "(TensorRT-LLM cpp/tensorrt_llm/kernels/communicationKernels/moeAlltoAllKernels.cu)",
    ),
    KernelFamily(
        "TensorRT-LLM",
        "combine",
        _V + r"(?:\w+::)*moeA2A(?:Prepare)?CombineKernel",
        "same file (moeA2ACombineKernel, moeA2APrepareCombineKernel)",
    ),
    # --- routing ---------------------------------------------------------------------------------------
    KernelFamily(
        "TensorRT-LLM / FlashInfer",
        "route",
        r"(?:moe::dev::routing::\w+::)?routing(?:Main|IndicesCluster|IndicesMultiTileCluster|IndicesDynBlock)Kernel"
        r"|deepseek_v3_topk_kernel",
        "flashinfer-ai/flashinfer csrc/fused_moe/trtllm_backend/trtllm_fused_moe_routing_{deepseek,llama4,custom,"
        "common}.cu; csrc/fused_moe/noAuxTcKernels.cu",
    ),
    KernelFamily(
        "vLLM / SGLang / aiter",
        "route",
        r"(?:\w+::)*(?:topkGatingSoftmax|moeSoftmax|moeTopK|moe_fused_gate_kernel|grouped_topk_kernel)\b",
        "vllm-project/vllm csrc/moe/topk_softmax_kernels.cu, csrc/moe/moe_fused_gate.cu, "
        "csrc/moe/grouped_topk_kernels.cu; ROCm/aiter csrc/kernels (moeTopK, moe_fused_gate_kernel)",
    ),
    KernelFamily(
        "TransformerEngine (Megatron-Core)",
        "route",
        r"(?:\w+::)*fused_(?:topk_with_score_function|topk|score_for_moe_aux_loss)_(?:forward|backward)\w*kernel",
        "NVIDIA/TransformerEngine transformer_engine/common/fused_router/fused_topk_with_score_function.cu, "
        "fused_score_for_moe_aux_loss.cu",
    ),
    KernelFamily(
        "PyTorch",
        "route",
        r"at::native::sbtopk::|at::native::mbtopk::|gatherTopK"
        r"|bitonicSortKVInPlace|radixSortKVInPlace|at_cuda_detail::cub::DeviceRadixSort|DeviceSegmentedRadixSort",
        "pytorch/pytorch aten/src/ATen/native/cuda/{TensorTopK.cu,SortImpl.cu,Sort.cu} (kernel names as in "
        "../shared/external/kineto/tracelens_moe_micro)",
    ),
    KernelFamily(
        "PyTorch",
        "route_aux",
        r"(?:\w+::)*softmax_warp_forward|cunn_SoftMaxForward",
        "pytorch/pytorch aten/src/ATen/native/cuda/{PersistentSoftmax.cuh,SoftMax.cu}: route only inside an MoE "
        "range or in one contiguous group with top-k / sort (attention uses the same softmax)",
    ),
    # --- permute (token -> expert layout, counts) ------------------------------------------------------
    KernelFamily(
        "vLLM / SGLang / aiter",
        "permute",
        r"(?:\w+::)*(?:moe_align_block_size\w*kernel|count_and_sort_expert_tokens_kernel"
        r"|batched_moe_align_block_size_kernel)\b",
        "vllm-project/vllm csrc/moe/moe_align_sum_kernels.cu (namespace vllm::moe); ROCm/aiter csrc/kernels",
    ),
    KernelFamily(
        "TensorRT-LLM / FlashInfer (CUTLASS MoE)",
        "permute",
        r"(?:\w+::)*(?:expandInputRowsKernel|fusedBuildExpertMapsSortFirstTokenKernel|blockExpertPrefixSumKernel"
        r"|globalExpertPrefixSum\w*Kernel|mergeExpertPrefixSumKernel|buildMinLatencyActiveExpertMapsKernel"
        r"|computeStridesTmaWarpSpecializedKernel|moePermuteKernel)\b",
        "flashinfer-ai/flashinfer csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh "
        "(namespace tensorrt_llm::kernels::cutlass_kernels); csrc/nv_internal/tensorrt_llm/kernels/cuteDslKernels/moeUtils.cu",
    ),
    KernelFamily(
        "FlashInfer (TensorRT-LLM gen)",
        "permute",
        r"moe::dev::permute::permuteKernel",
        "flashinfer-ai/flashinfer csrc/fused_moe/trtllm_backend/trtllm_fused_moe_dev_kernel.cu (namespace moe::dev::permute)",
    ),
    KernelFamily(
        "TransformerEngine (Megatron-Core)",
        "permute",
        r"^_?(?:row_id_map_pass_[123]_kernel|permute_kernel|make_chunk_sort_map_kernel|sort_chunks_by_map_kernel)\b"
        r"|(?:\w+::)*moe_permute_(?:row_map|kernel)\b",
        "NVIDIA/TransformerEngine transformer_engine/common/triton/permutation.py, common/permutation/permutation.cu",
    ),
    KernelFamily(
        "SGLang",
        "permute",
        r"^(?:deepep_permute_triton_kernel|pre_reorder_triton_kernel|compute_seg_indptr_triton_kernel"
        r"|_fwd_kernel_ep_scatter_\d)\b",
        "sgl-project/sglang python/sglang/srt/layers/moe/ep_moe/kernels.py",
    ),
    KernelFamily(
        "aiter / composable_kernel",
        "permute",
        r"MoeSorting\w*Kernel|moe_sorting|sort_(?:count|cumsum|place_pad)_kernel_impl",
        "ROCm/aiter csrc/include/moe_sorting_opus.h (MoeSortingKernel); composable_kernel "
        "include/ck_tile/ops/fused_moe/kernel/moe_sorting_kernel.hpp",
    ),
    # --- unpermute / finalize --------------------------------------------------------------------------
    KernelFamily(
        "TensorRT-LLM / FlashInfer (CUTLASS MoE)",
        "unpermute",
        r"(?:\w+::)*(?:finalizeMoeRouting\w*Kernel|moeUnpermuteKernel)\b|moe::dev::finalize::finalize\w*Kernel",
        "flashinfer-ai/flashinfer csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh; "
        "csrc/fused_moe/trtllm_backend/trtllm_fused_moe_dev_kernel.cu (moe::dev::finalize)",
    ),
    KernelFamily(
        "TransformerEngine (Megatron-Core)",
        "unpermute",
        r"^_?unpermute(?:_bwd_with_merging_probs)?_kernel\b|(?:\w+::)*moe_unpermute_kernel\b",
        "NVIDIA/TransformerEngine transformer_engine/common/triton/permutation.py, common/permutation/permutation.cu",
    ),
    KernelFamily(
        "vLLM / SGLang / aiter",
        "unpermute",
        r"(?:\w+::)*moe_sum_kernel\b|^(?:post_reorder_triton_kernel|deepep_post_reorder_triton_kernel"
        r"|_fwd_kernel_ep_gather)\b|_?moe_sum_reduce\w*kernel",
        "vllm-project/vllm csrc/moe/moe_align_sum_kernels.cu (vllm::moe::moe_sum_kernel); "
        "sgl-project/sglang python/sglang/srt/layers/moe/ep_moe/kernels.py; SGLang's top-k sum: "
        "_moe_sum_reduce_kernel (python/sglang/srt/layers/moe/fused_moe_triton/fused_moe_triton_kernels.py) "
        "and sgl-kernel's moe_sum_reduce*_kernel CUDA kernels",
    ),
    # --- expert GEMMs ---------------------------------------------------------------------------------
    KernelFamily(
        "vLLM / SGLang (Triton)",
        "expert",
        r"^fused_moe_kernel\w*|^grouped_gemm_triton\w*|^(?:silu|gelu)_and_mul_triton_kernel\b",
        "vllm-project/vllm vllm/model_executor/layers/fused_moe/fused_moe.py (fused_moe_kernel, "
        "fused_moe_kernel_gptq_awq); sgl-project/sglang python/sglang/srt/layers/moe/ep_moe/kernels.py",
    ),
    KernelFamily(
        "TensorRT-LLM / FlashInfer",
        "expert",
        r"MoeFCGemm|^bmm_\w+|moe::dev::activation::activation\w*Kernel|(?:\w+::)*doGatedActivationKernel\b",
        "TensorRT-LLM cpp/tensorrt_llm/cutlass_extensions/include/cutlass_extensions/gemm/kernel/moe_cutlass_kernel.h "
        "(MoeFCGemm); flashinfer-ai/flashinfer csrc/trtllm_batched_gemm_runner.cu (trtllm-gen bmm_* cubins), "
        "csrc/fused_moe/trtllm_backend/trtllm_fused_moe_dev_kernel.cu",
    ),
    KernelFamily(
        "CUTLASS grouped GEMM",
        "expert",
        r"cutlass::gemm::kernel::GemmGrouped|GroupProblemShape|KernelPtrArray\w*|cutlass\w*grouped",
        "NVIDIA/cutlass include/cutlass/gemm/kernel/gemm_grouped.h, include/cutlass/gemm/group_array_problem_shape.hpp",
    ),
    KernelFamily(
        "aiter / composable_kernel",
        "expert",
        r"(?:_ZN5aiter\w*)?fmoe_\w+|MoeFlatmmKernel|FusedMoeGemmKernel|(?i:moe_?gemm)",
        "ROCm/aiter csrc/py_itfs_cu/asm_fmoe.cu (fmoe_* asm kernels), csrc/ck_gemm_moe_2stages_codegen/"
        "gemm_moe_ck2stages_common.cuh (ck DeviceMoeGemm)",
    ),
    KernelFamily(
        "DeepGEMM (SGLang / vLLM DeepEP paths)",
        "expert",
        r"deep_gemm::\w*(?:m_grouped|grouped)\w*|(?i:group_gemm|grouped_gemm)",
        "deepseek-ai/DeepGEMM deep_gemm/include/deep_gemm/impls (m_grouped_* GEMMs used by "
        "sglang ep_moe/layer.py moe_ep_deepgemm_preprocess)",
    ),
    # --- PyTorch index / gather / scatter: permute or unpermute by position inside an MoE range -------
    KernelFamily(
        "PyTorch",
        "gather",
        r"indexSelect(?:Large|Small)Index|index_elementwise_kernel|vectorized_gather_kernel"
        r"|_scatter_gather_elementwise_kernel|scatter_gather_elementwise_kernel|indexFuncLargeIndex|indexFuncSmallIndex",
        "pytorch/pytorch aten/src/ATen/native/cuda/{Indexing.cu,ScatterGatherKernel.cu,IndexKernel.cu} "
        "(vectorized_gather_kernel as in tracelens_moe_micro)",
    ),
    # --- generic GEMMs: expert only after routing inside an MoE range ----------------------------------
    KernelFamily(
        "cuBLAS / hipBLASLt / CUTLASS",
        "gemm",
        r"^nvjet_|sm\d+_xmma_gemm|^(?:ampere|volta|turing|hopper)_\w*gemm|^Cijk_|cutlass::gemm::kernel::GemmUniversal"
        r"|cublasLt\w*|gemv2?T?_kernel|gemmSN_",
        "cuBLAS / hipBLASLt kernel naming (nvjet_sm103_* in tracelens_moe_micro; Tensile Cijk_* on ROCm)",
    ),
    # --- NCCL collectives inside an MoE range: dispatch before its expert kernels, combine after -------
    KernelFamily(
        "vLLM (allgather_reducescatter EP) / NCCL",
        "ep_collective",
        _V + r"(?:::)?nccl(?:Dev)?Kernel_(?:AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|AllToAll)(?:_|\()",
        "vllm-project/vllm vllm/distributed/device_communicators/all2all.py (AgRsAll2AllManager: dispatch = "
        "all_gatherv, combine = reduce_scatterv, the default all2all_backend of vllm/config/parallel.py; with "
        "uneven sizes PyNcclCommunicator runs them as grouped ncclBroadcast / ncclReduce, pynccl.py), "
        "called from vllm::moe_forward (model_executor/layers/fused_moe/layer.py); NCCL kernel names from "
        "NVIDIA/nccl src/device/generate.py",
    ),
    # --- the all-reduce right after an MoE layer: its combine under tensor / expert parallelism ------
    KernelFamily(
        "vLLM / SGLang / TensorRT-LLM (MoE output all-reduce)",
        "ep_allreduce",
        _V + r"(?:::)?" + _ALLREDUCE,
        "vllm-project/vllm vllm/model_executor/layers/fused_moe/runner/default_moe_runner.py (forward: "
        "tensor_model_parallel_all_reduce of the vllm::moe_forward output when tp_size > 1 or ep_size > 1 and "
        "no all-to-all kernel reduced it); sgl-project/sglang python/sglang/srt/models/deepseek_v2.py "
        "(DeepseekV2MoE.forward_normal: experts, routed-scaling multiply, shared-expert add, then the "
        "all-reduce); kernel names: NCCL AllReduce, ep_trace.comm_classifier custom_allreduce",
    ),
)


def family_table() -> list[dict[str, str]]:
    """The family table as plain rows (for docs and the CLI)."""
    return [{"framework": f.framework, "stage": f.stage, "regex": f.regex, "source": f.source} for f in KERNEL_FAMILIES]
