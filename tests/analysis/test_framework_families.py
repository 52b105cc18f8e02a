"""One synthetic Kineto trace per framework family, built from the kernel and range names read from each
framework's source (``ep_trace/analysis/kernel_families.py`` names the file of every name), with the
exact stages, layers and communication each must give."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import ep_trace
from ep_trace.analysis.config import AnalysisConfig

BASE = 1_700_000_000_000_000_000

# A program is a list of items: ("op", name, [items]) = a host range (cpu_op when the name has '::',
# else a user_annotation) around its items; ("k", kernel_name, dur_us[, stream]) = a kernel launched here
# (stream 7 unless given).
Item = tuple[Any, ...]


def _trace(path: Path, rank: int, world: int, program: list[Item]) -> Path:
    ev: list[dict[str, Any]] = []
    state = {"t": 10.0, "dev": 0.0, "corr": 1}

    def emit(items: list[Item]) -> None:
        for it in items:
            if it[0] == "op":
                start = state["t"]
                state["t"] += 1
                emit(it[2])
                state["t"] += 1
                cat = "python_function" if ".py(" in it[1] else "cpu_op" if "::" in it[1] else "user_annotation"
                ev.append(
                    {"ph": "X", "cat": cat, "name": it[1], "pid": 1, "tid": 1, "ts": start, "dur": state["t"] - start}
                )
            else:
                name, dur = it[1], it[2]
                stream = it[3] if len(it) > 3 else 7
                c = state["corr"]
                state["corr"] += 1
                launch = state["t"]
                ev.append(
                    {
                        "ph": "X",
                        "cat": "cuda_runtime",
                        "name": "cudaLaunchKernel",
                        "pid": 1,
                        "tid": 1,
                        "ts": launch,
                        "dur": 1,
                        "args": {"correlation": c},
                    }
                )
                start = max(launch + 5, state["dev"] + 1)
                state["dev"] = start + dur
                ev.append(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": name,
                        "pid": 0,
                        "tid": stream,
                        "ts": start,
                        "dur": dur,
                        "args": {"correlation": c, "stream": stream, "device": rank},
                    }
                )
                state["t"] += 2

    emit(program)
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "baseTimeNanoseconds": BASE,
        "traceEvents": ev,
    }
    path.write_text(json.dumps(doc))
    return path


def _analyze(tmp_path: Path, program: list[Item], world: int = 2) -> ep_trace.Analysis:
    for r in range(world):
        _trace(tmp_path / f"rank{r}.json", r, world, program)
    return ep_trace.load([tmp_path], config=AnalysisConfig())


def _stages(a: ep_trace.Analysis, rank: int = 0) -> list[tuple[Any, ...]]:
    s = a.stages.filter(pl.col("rank") == rank).sort("cpu_start_ns")
    return s.select("layer", "stage", "busy_ns", "comm_ns").rows()


def _calls(a: ep_trace.Analysis) -> list[tuple[Any, ...]]:
    c = a.tables.collectives.sort(["rank", "start_ns"])
    return c.select("rank", "collective", "backend", "direction", "n_kernels").rows()


def test_vllm_triton_fused_moe_and_custom_allreduce(tmp_path):
    # vllm::moe_forward (fused_moe/layer.py) around: gate GEMM, topkGatingSoftmax, moe_align_block_size +
    # count_and_sort, fused_moe_kernel x2 (an activation kernel between them), moe_sum; attention op with a
    # grouped-GEMM-named kernel; custom all-reduce under vllm::all_reduce
    prog = [
        (
            "op",
            "vllm::unified_attention_with_output",
            [("k", "void cutlass::Kernel<cutlass::gemm::kernel::GemmGrouped<X>>(Params)", 30)],
        ),
        (
            "op",
            "vllm::all_reduce",
            [("k", "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*)", 20)],
        ),
        (
            "op",
            "vllm::moe_forward",
            [
                ("k", "nvjet_sm90_tst_128x64_64x8_1x1_v_bz_TNT", 7),
                ("k", "void vllm::moe::topkGatingSoftmax<4, 64, 4, 16>(float const*)", 5),
                ("k", "void vllm::moe::moe_align_block_size_kernel<int>(int const*)", 3),
                ("k", "void vllm::moe::count_and_sort_expert_tokens_kernel<int>(int const*)", 2),
                ("k", "fused_moe_kernel", 40),
                ("k", "void vllm::act_and_mul_kernel<c10::BFloat16>(c10::BFloat16*)", 4),
                ("k", "fused_moe_kernel", 30),
                ("k", "void vllm::moe::moe_sum_kernel<c10::BFloat16, 2>(c10::BFloat16*)", 6),
            ],
        ),
    ]
    a = _analyze(tmp_path, prog)
    assert _stages(a) == [
        (None, "attn", 30_000, 0),  # a grouped GEMM inside an attention range is attention
        (0, "route", 5_000, 0),  # the gate GEMM before routing is no stage
        (0, "permute", 5_000, 0),  # align + count/sort: one contiguous group
        (0, "expert", 70_000, 0),  # the activation kernel between the GEMMs has no family: one group
        (0, "unpermute", 6_000, 0),
    ]
    assert _calls(a) == [(0, "allreduce", "custom_allreduce", None, 1), (1, "allreduce", "custom_allreduce", None, 1)]
    assert a.calls.filter(pl.col("complete"))["n_ranks"].to_list() == [2]
    assert a.steps["comm_ns"].to_list() == [20_000, 20_000]


def test_vllm_default_ep_allgather_reducescatter(tmp_path):
    # vLLM's default EP backend (all2all_backend "allgather_reducescatter", AgRsAll2AllManager in
    # vllm/distributed/device_communicators/all2all.py): inside vllm::moe_forward the tokens and router
    # logits are all-gathered, the experts run, the outputs are reduce-scattered; PyNcclCommunicator
    # calls NCCL through ctypes, so the kernels have no collective op of their own
    prog = [
        (
            "op",
            "vllm::moe_forward",
            [
                ("k", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 25),
                ("k", "void vllm::moe::topkGatingSoftmax<4, 64, 4, 16>(float const*)", 5),
                ("k", "void vllm::moe::moe_align_block_size_kernel<int>(int const*)", 3),
                ("k", "fused_moe_kernel", 40),
                ("k", "void vllm::act_and_mul_kernel<c10::BFloat16>(c10::BFloat16*)", 4),
                ("k", "fused_moe_kernel", 30),
                ("k", "void vllm::moe::moe_sum_kernel<c10::BFloat16, 2>(c10::BFloat16*)", 6),
                ("k", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20),
            ],
        ),
        # a data-parallel all-gather outside the MoE layer is no EP stage
        ("op", "dp_gather", [("k", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 8)]),
    ]
    a = _analyze(tmp_path, prog)
    assert _stages(a) == [
        (0, "dispatch", 25_000, 25_000),
        (0, "route", 5_000, 0),
        (0, "permute", 3_000, 0),
        (0, "expert", 70_000, 0),
        (0, "unpermute", 6_000, 0),
        (0, "combine", 20_000, 20_000),
    ]
    # one call per kernel, typed from the kernel name, matched across the 2 ranks by order within its type
    assert _calls(a) == [(r, t, "nccl", None, 1) for r in (0, 1) for t in ("allgather", "reduce_scatter", "allgather")]
    assert a.calls.filter(pl.col("complete"))["n_ranks"].to_list() == [2, 2, 2]
    assert set(a.calls["pg_name"]) == {"nccl:allgather", "nccl:reduce_scatter"}
    # the calls inside the MoE layer take their stage as direction (the what-ifs that edit dispatch /
    # combine transfers see them); the DP all-gather outside has none
    assert a.calls.sort("arrival_ns").select("collective", "direction", "layer").rows() == [
        ("allgather", "dispatch", 0),
        ("reduce_scatter", "combine", 0),
        ("allgather", None, None),
    ]
    assert "fp8_dispatch" in a.whatif["scenario"].to_list()
    top = a.findings[0]
    assert top.kind == "exposed_comm"
    assert top.remedy.startswith(
        "The dispatch is an all-gather and the combine a reduce-scatter (vLLM's default EP backend)"
    )


def test_vllm_default_ep_with_uneven_token_counts(tmp_path):
    # with uneven per-rank token counts PyNcclCommunicator runs all_gatherv / reduce_scatterv as grouped
    # ncclBroadcast / ncclReduce (vllm/distributed/device_communicators/pynccl.py): one kernel each
    prog = [
        (
            "op",
            "vllm::moe_forward",
            [
                ("k", "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 25),
                ("k", "void vllm::moe::topkGatingSoftmax<4, 64, 4, 16>(float const*)", 5),
                ("k", "fused_moe_kernel", 40),
                ("k", "ncclDevKernel_Reduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20),
            ],
        ),
    ]
    a = _analyze(tmp_path, prog)
    assert _stages(a) == [
        (0, "dispatch", 25_000, 25_000),
        (0, "route", 5_000, 0),
        (0, "expert", 40_000, 0),
        (0, "combine", 20_000, 20_000),
    ]
    assert a.calls.sort("arrival_ns").select("collective", "direction").rows() == [
        ("broadcast", "dispatch"),
        ("unknown", "combine"),
    ]
    assert a.findings[0].remedy.startswith("The dispatch is an all-gather and the combine a reduce-scatter")


def test_vllm_default_ep_in_a_cuda_graph_replay(tmp_path):
    # decode replays a CUDA graph: no vllm::moe_forward range on the host. The all-gather right before
    # routing is the dispatch and the reduce-scatter right after the experts the combine; the data-parallel
    # all-gather in front of the LM head (a GEMM without a family between it and the experts) is neither
    ag = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    rs = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    prog = [
        ("k", "void at::native::rms_norm_kernel<float>(x)", 3),
        ("k", ag, 20),
        ("k", ag, 5),  # the router logits, a second gather right after the tokens'
        ("k", "void vllm::moe::topkGatingSoftmax<4, 64, 4, 16>(float const*)", 5),
        ("k", "void vllm::moe::moe_align_block_size_kernel<int>(int const*)", 3),
        ("k", "fused_moe_kernel", 40),
        ("k", "void vllm::moe::moe_sum_kernel<c10::BFloat16, 2>(c10::BFloat16*)", 6),
        ("k", rs, 18),
        ("k", "void at::native::rms_norm_kernel<float>(x)", 3),
        ("k", ag, 9),
        ("k", "nvjet_sm90_tst_128x64_64x8_1x1_v_bz_TNT", 7),
    ]
    a = _analyze(tmp_path, prog)
    assert [(s, b, c) for _, s, b, c in _stages(a)] == [
        ("dispatch", 25_000, 25_000),
        ("route", 5_000, 0),
        ("permute", 3_000, 0),
        ("expert", 40_000, 0),
        ("unpermute", 6_000, 0),
        ("combine", 18_000, 18_000),
    ]
    assert a.calls.sort("arrival_ns")["direction"].to_list() == ["dispatch", "dispatch", "combine", None]


_CAR = "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*)"
_NCCL_AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
_ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)"


def _tp_layer(moe: list[Item], after: list[Item]) -> list[Item]:
    """An attention block (its o_proj all-reduce), then the MoE layer and what follows it."""
    return [
        ("op", "vllm::unified_attention_with_output", [("k", "flash_fwd_kernel", 30)]),
        ("k", "nvjet_sm90_tst_128x64_64x8_1x1_v_bz_TNT", 8),  # o_proj
        ("op", "vllm::all_reduce", [("k", _CAR, 12)]),  # the attention's all-reduce: no MoE stage
        ("k", "void vllm::fused_add_rms_norm_kernel<c10::BFloat16>(x)", 3),
        *moe,
        *after,
    ]


_VLLM_MOE: list[Item] = [
    (
        "op",
        "vllm::moe_forward",
        [
            ("k", "nvjet_sm90_tst_128x64_64x8_1x1_v_bz_TNT", 7),
            ("k", "void vllm::moe::topkGatingSoftmax<4, 64, 4, 16>(float const*)", 5),
            ("k", "fused_moe_kernel", 40),
            ("k", "void vllm::moe::moe_sum_kernel<c10::BFloat16, 2>(c10::BFloat16*)", 6),
        ],
    )
]


def test_vllm_tp_moe_output_all_reduce_is_the_combine(tmp_path):
    # tensor parallelism, or --enable-expert-parallel without data parallelism: every rank holds every
    # token and DefaultMoERunner.forward all-reduces the vllm::moe_forward output
    # (vllm/model_executor/layers/fused_moe/runner/default_moe_runner.py, _maybe_reduce_output)
    a = _analyze(tmp_path, _tp_layer(_VLLM_MOE, [("op", "vllm::all_reduce", [("k", _CAR, 20)])]))
    assert _stages(a)[1:] == [
        (0, "route", 5_000, 0),
        (0, "expert", 40_000, 0),
        (0, "unpermute", 6_000, 0),
        (0, "combine", 20_000, 20_000),
    ]
    # the combine call takes its stage as direction; the attention's all-reduce keeps none
    assert a.calls.sort("arrival_ns").select("collective", "direction", "layer").rows() == [
        ("allreduce", None, None),
        ("allreduce", "combine", 0),
    ]
    top = a.findings[0]
    assert top.kind == "exposed_comm"
    assert top.remedy == (
        "The combine is an all-reduce of all tokens (TP, or EP with no all-to-all "
        "backend). Fuse it with the next RMSNorm (vLLM "
        "-cc.pass_config.fuse_allreduce_rms=True, SGLang --enable-flashinfer-allreduce-fusion), or run "
        "attention data-parallel with a DeepEP all-to-all (vLLM --data-parallel-size "
        "--enable-expert-parallel --all2all-backend deepep_low_latency; SGLang --enable-dp-attention "
        "--moe-a2a-backend deepep)."
    )
    # with the barrier-wait sentence it still fits the report's display limit
    assert (
        len(top.remedy)
        + len(" Most of this exposed time is barrier wait for a late rank: fix the straggler / imbalance first.")
        <= 512
    )


# SGLang DeepseekV2MoE.forward_normal (python/sglang/srt/models/deepseek_v2.py): the experts, then the
# routed-scaling multiply and the shared-expert add (PyTorch pointwise kernels)
_SGLANG_MOE: list[Item] = [
    (
        "op",
        "sglang::inplace_fused_experts",
        [
            ("k", "void moe_fused_gate_kernel<float>(x)", 5),
            ("k", "fused_moe_kernel", 40),
            ("k", "void moe_sum_reduce_kernel<c10::BFloat16>(x)", 6),
        ],
    ),
    ("k", "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float> >(int)", 2),
    ("k", _ADD, 2),
]


def test_sglang_moe_all_reduce_after_scaling_and_shared_add(tmp_path):
    # then the all-reduce (a bare NCCL kernel here, as PyNccl launches it: a call of group nccl:allreduce)
    a = _analyze(tmp_path, _tp_layer(_SGLANG_MOE, [("k", _NCCL_AR, 20)]))
    assert _stages(a)[1:] == [
        (0, "route", 5_000, 0),
        (0, "expert", 40_000, 0),
        (0, "unpermute", 6_000, 0),  # moe_sum_reduce_kernel (sgl-kernel)
        (0, "combine", 20_000, 20_000),  # the pointwise kernels in between do not break it
    ]
    assert a.calls.sort("arrival_ns")["direction"].to_list() == [None, "combine"]


def test_sglang_dp_attention_reduce_scatter_after_scaling_and_shared_add(tmp_path):
    # SGLang with data-parallel attention and use_reduce_scatter: forward_normal skips its all-reduce
    # and the layer communicator reduce-scatters the output after the routed-scaling multiply and the
    # shared-expert add (python/sglang/srt/layers/communicator.py, dp_reduce_scatter_tensor)
    rs = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    a = _analyze(tmp_path, [*_SGLANG_MOE, ("k", rs, 20)])
    assert _stages(a)[-1] == (0, "combine", 20_000, 20_000)
    assert a.calls["direction"].to_list() == ["combine"]


def test_moe_all_reduce_in_a_cuda_graph_replay(tmp_path):
    # no host ranges: the all-reduce right after the unpermute kernel is the combine; the one after the
    # o_proj GEMM (and the dense MLP's, after its down-projection GEMM) is none
    prog: list[Item] = [
        ("k", "flash_fwd_kernel", 30),
        ("k", "nvjet_sm90_tst_128x64_64x8_1x1_v_bz_TNT", 8),
        ("k", _CAR, 12),
        ("k", "void vllm::fused_add_rms_norm_kernel<c10::BFloat16>(x)", 3),
        ("k", "void vllm::moe::topkGatingSoftmax<4, 64, 4, 16>(float const*)", 5),
        ("k", "fused_moe_kernel", 40),
        ("k", "void vllm::moe::moe_sum_kernel<c10::BFloat16, 2>(c10::BFloat16*)", 6),
        ("k", _CAR, 20),
        ("k", "void vllm::fused_add_rms_norm_kernel<c10::BFloat16>(x)", 3),
        ("k", "nvjet_sm90_tst_128x64_64x8_1x1_v_bz_TNT", 9),
        ("k", _CAR, 11),
    ]
    a = _analyze(tmp_path, prog)
    assert [(s, b, c) for _, s, b, c in _stages(a)] == [
        ("route", 5_000, 0),
        ("expert", 40_000, 0),
        ("unpermute", 6_000, 0),
        ("combine", 20_000, 20_000),
    ]
    assert a.calls.sort("arrival_ns")["direction"].to_list() == [None, "combine", None]


def test_a_kernel_without_family_breaks_the_all_reduce_adjacency(tmp_path):
    # a norm (no family, not pointwise) between the MoE layer and the all-reduce: no combine
    after: list[Item] = [("k", "void vllm::fused_add_rms_norm_kernel<c10::BFloat16>(x)", 3), ("k", _CAR, 20)]
    a = _analyze(tmp_path, _tp_layer(_VLLM_MOE, after))
    assert "combine" not in [s for _, s, _, _ in _stages(a)]
    assert a.calls["direction"].to_list() == [None, None]


def test_gradient_all_reduce_on_its_own_stream_is_no_combine(tmp_path):
    # data-parallel training: a gradient bucket's all-reduce runs on NCCL's stream (22) right after an
    # expert kernel's backward on the compute stream: no MoE combine, and the remedy is DDP's
    prog: list[Item] = [
        ("op", "autograd::engine::evaluate_function: MmBackward0", [("k", "void moe_sum_reduce_kernel<float>(x)", 6)]),
        ("k", "void cutlass::Kernel<cutlass::gemm::kernel::GemmGrouped<X>>(Params)", 40),
        ("k", _NCCL_AR, 30, 22),
        ("k", "void cutlass::Kernel<cutlass::gemm::kernel::GemmGrouped<X>>(Params)", 40),
        ("k", _NCCL_AR, 30, 22),
    ]
    a = _analyze(tmp_path, prog)
    assert "combine" not in [s for _, s, _, _ in _stages(a)]
    assert a.calls["direction"].to_list() == [None, None]


def test_all_reduce_after_a_dense_mlp_is_no_combine(tmp_path):
    # a model without MoE layers (or a dense layer of one): no all-reduce becomes a combine, no EP remedy
    prog: list[Item] = [
        ("k", "nvjet_sm90_tst_128x64_64x8_1x1_v_bz_TNT", 8),
        ("k", "void vllm::act_and_mul_kernel<c10::BFloat16>(c10::BFloat16*)", 4),
        ("k", "nvjet_sm90_tst_128x64_64x8_1x1_v_bz_TNT", 8),
        ("k", _ADD, 2),
        ("k", _CAR, 20),
    ]
    a = _analyze(tmp_path, prog)
    assert _stages(a) == []
    assert a.calls["direction"].to_list() == [None]
    assert all("all-to-all" not in f.remedy for f in a.findings)


_BACKWARD: dict[str, list[Item]] = {
    "inference": [],
    # a Kineto trace: autograd's backward ops
    "autograd": [("op", "autograd::engine::evaluate_function: MmBackward0", [("k", "nvjet_sm90_tst_bwd", 8)])],
    # an Nsight trace without NVTX: only the fused optimizer's kernel says it is training
    "optimizer_kernel": [
        (
            "k",
            "void at::native::multi_tensor_apply_kernel<at::native::TensorListMetadata<4>, FusedAdamMathFunctor>(x)",
            5,
        )
    ],
}


@pytest.mark.parametrize("case", list(_BACKWARD))
def test_exposed_all_reduce_remedy_of_inference_and_training(tmp_path, case):
    # no backward pass: tensor-parallel activation all-reduces, not DDP gradient buckets
    training = case != "inference"
    prog: list[Item] = [
        ("k", "flash_fwd_kernel", 30),
        ("k", "nvjet_sm90_tst_128x64_64x8_1x1_v_bz_TNT", 8),
        ("k", _CAR, 40),
        ("k", "nvjet_sm90_tst_128x64_64x8_1x1_v_bz_TNT", 8),
        ("k", _CAR, 40),
        *_BACKWARD[case],
    ]
    (top,) = [f for f in _analyze(tmp_path, prog).findings if f.kind == "exposed_comm"]
    assert top.remedy == (
        "Overlap the collectives with compute: launch gradient all-reduces as buckets become ready (DDP/FSDP bucket "
        "size, bucket_cap_mb), prefetch all-gathers, and keep the comm stream free of host syncs."
        if training
        else "No backward pass: these are tensor-parallel activation collectives. Overlap them with the GEMMs next to "
        "them (async TP: vLLM -cc.pass_config.fuse_gemm_comms=True with sequence parallelism), fuse each "
        "all-reduce with the next RMSNorm (vLLM -cc.pass_config.fuse_allreduce_rms=True, SGLang "
        "--enable-flashinfer-allreduce-fusion), keep the custom all-reduce on, or use fewer tensor-parallel ranks."
    )


def test_sglang_deepep_cuda_graph_decode(tmp_path):
    # CUDA-graph decode: no host range around the MoE; DeepEP normal mode (layer 0) and low-latency mode
    # (layer 1). Layers come from the order of MoE blocks (route opens a block).
    def layer(ll: bool) -> list[Item]:
        ns = "internode_ll" if ll else "intranode"
        pre_d = "clean_low_latency_buffer" if ll else "notify_dispatch"
        pre_c = "clean_low_latency_buffer" if ll else "cached_notify_combine"
        return [
            ("k", "void moe_fused_gate_kernel<float, 8, 256>(void*)", 4),
            ("k", "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*)", 3),
            ("k", f"void deep_ep::{ns}::{pre_d}<8>(int*)", 2),
            ("k", f"void deep_ep::{ns}::dispatch<8, 768>(void*)", 25),
            ("k", "fused_moe_kernel", 50),
            ("k", f"void deep_ep::{ns}::{pre_c}<8>(int*)", 2),
            ("k", f"void deep_ep::{ns}::combine<__nv_bfloat16, 8, 768>(void*)", 20),
        ]

    a = _analyze(tmp_path, layer(False) + layer(True))
    assert _stages(a) == [
        (0, "route", 4_000, 0),
        (0, "permute", 3_000, 0),  # the layout kernel is local compute (permute), not communication
        (0, "dispatch", 27_000, 27_000),  # notify_dispatch belongs to the dispatch that follows it
        (0, "expert", 50_000, 0),
        (0, "combine", 22_000, 22_000),
        (1, "route", 4_000, 0),
        (1, "permute", 3_000, 0),
        (1, "dispatch", 27_000, 27_000),
        (1, "expert", 50_000, 0),
        (1, "combine", 22_000, 22_000),
    ]
    rank0 = [c for c in _calls(a) if c[0] == 0]
    assert rank0 == [
        (0, "all_to_allv", "deepep", "dispatch", 2),
        (0, "all_to_allv", "deepep", "combine", 2),
        (0, "all_to_allv", "deepep", "dispatch", 2),
        (0, "all_to_allv", "deepep", "combine", 2),
    ]
    assert a.calls.filter(pl.col("complete") & (pl.col("n_ranks") == 2)).height == 4


def test_tensorrt_llm_flashinfer_trtllm_gen_and_cutlass(tmp_path):
    prog = [
        (
            "op",
            "trtllm::fused_moe",
            [
                ("k", "void moe::dev::routing::routingDeepSeek::routingMainKernel<KernelParams>(KernelParams)", 4),
                ("k", "void tensorrt_llm::kernels::moe_alltoall::moeA2ADispatchKernel<8>(Params)", 20),
                ("k", "void moe::dev::permute::permuteKernel<KernelParams>(KernelParams)", 3),
                ("k", "bmm_E4m3_E4m3E4m3_Fp32_t128x8x128u2_s6_et64x8_m64x8x32_cga1x1x1_16dp256b_TN_schedS_sm100a", 30),
                ("k", "void moe::dev::activation::activationKernel<KernelParams>(KernelParams)", 3),
                (
                    "k",
                    "bmm_Bfloat16_E4m3E4m3_Fp32_t128x8x128u2_s6_et64x8_m64x8x32_cga1x1x1_16dp256b_TN_schedS_sm100a",
                    25,
                ),
                ("k", "void moe::dev::finalize::finalizeKernel<KernelParams>(KernelParams)", 5),
                ("k", "void tensorrt_llm::kernels::moe_alltoall::moeA2ACombineKernel<8>(Params)", 18),
            ],
        ),
        (
            "op",
            "trtllm::fused_moe",
            [
                ("k", "void tensorrt_llm::kernels::cutlass_kernels::expandInputRowsKernel<X>(X)", 3),
                ("k", "void cutlass::Kernel<cutlass::gemm::kernel::MoeFCGemm<X>>(Params)", 40),
                ("k", "void tensorrt_llm::kernels::cutlass_kernels::finalizeMoeRoutingKernel<X>(X)", 4),
            ],
        ),
        ("k", "void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<X>(X)", 9),
    ]
    a = _analyze(tmp_path, prog)
    assert _stages(a) == [
        (0, "route", 4_000, 0),
        (0, "dispatch", 20_000, 20_000),
        (0, "permute", 3_000, 0),
        (0, "expert", 58_000, 0),  # bmm + activation + bmm: one group
        (0, "unpermute", 5_000, 0),
        (0, "combine", 18_000, 18_000),
        (1, "permute", 3_000, 0),
        (1, "expert", 40_000, 0),
        (1, "unpermute", 4_000, 0),
        # the tensor-parallel layer's output all-reduce (fused with the next RMSNorm) is its combine
        (1, "combine", 9_000, 9_000),
    ]
    assert [c[1:] for c in _calls(a) if c[0] == 0] == [
        ("all_to_allv", "trtllm_moe_a2a", "dispatch", 1),
        ("all_to_allv", "trtllm_moe_a2a", "combine", 1),
        ("allreduce", "custom_allreduce", None, 1),
    ]
    # the analysis gives that call the direction of its stage
    assert a.calls.sort("arrival_ns")["direction"].to_list() == ["dispatch", "combine", "combine"]


def test_megatron_core_transformer_engine_ranges(tmp_path):
    # Megatron-Core token dispatcher / MoELayer ranges with TransformerEngine kernels; the expert GEMMs
    # run in TE's GroupedLinear; DotProductAttention holds a grouped GEMM that must stay attention
    m = "megatron.core.transformer.moe"
    prog = [
        (
            "op",
            "DotProductAttention forward",
            [("k", "void cutlass::device_kernel<GemmUniversal<GroupProblemShape<X>>>(P)", 12)],
        ),
        (
            "op",
            f"{m}.moe_layer.MoELayer.router_and_preprocess",
            [("k", "void transformer_engine::fused_topk_with_score_function_forward_kernel<float>(X)", 4)],
        ),
        (
            "op",
            f"{m}.token_dispatcher.MoEAlltoAllTokenDispatcher.dispatch_preprocess",
            [("k", "_row_id_map_pass_1_kernel", 2), ("k", "_permute_kernel", 3)],
        ),
        (
            "op",
            f"{m}.token_dispatcher.MoEAlltoAllTokenDispatcher.token_dispatch",
            [("op", "c10d::alltoall_base_", [("k", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 30)])],
        ),
        (
            "op",
            "GroupedLinear forward",
            [("k", "void cutlass::device_kernel<GemmUniversal<GroupProblemShape<X>>>(P)", 45)],
        ),
        ("op", f"{m}.token_dispatcher.MoEAlltoAllTokenDispatcher.combine_postprocess", [("k", "_unpermute_kernel", 3)]),
    ]
    a = _analyze(tmp_path, prog)
    assert [(s, b, c) for _, s, b, c in _stages(a)] == [
        ("attn", 12_000, 0),
        ("route", 4_000, 0),
        ("permute", 5_000, 0),
        ("dispatch", 30_000, 30_000),  # the c10d all-to-all inside the dispatcher range is no stage of its own
        ("expert", 45_000, 0),
        ("unpermute", 3_000, 0),
    ]
    assert set(a.stages["method"].unique()) == {"preset:megatron", "preset:transformer_engine"}


def test_megatron_core_moe_layer_frames(tmp_path):
    # Kineto records no NVTX; with --pytorch-profiler-collect-callstack (with_stack=True) the MoELayer
    # methods are Python frames (megatron/core/transformer/moe/moe_layer.py), read by path and method
    f = "/workspace/Megatron-LM/megatron/core/transformer/moe/moe_layer.py({}): {}"
    prog = [
        (
            "op",
            f.format(607, "router_and_preprocess"),
            [("k", "void transformer_engine::fused_topk_with_score_function_forward_kernel<float>(X)", 4)],
        ),
        (
            "op",
            f.format(496, "dispatch"),
            [("op", "c10d::alltoall_base_", [("k", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 30)])],
        ),
        (
            "op",
            f.format(536, "routed_experts_compute"),
            [("k", "void cutlass::device_kernel<GemmUniversal<GroupProblemShape<X>>>(P)", 45)],
        ),
        ("op", f.format(573, "combine"), [("op", "c10d::alltoall_base_", [("k", "ncclDevKernel_SendRecv(x)", 25)])]),
        # a frame of another file with the same method name is no stage
        ("op", "/workspace/app/router.py(12): dispatch", [("k", "void at::native::elementwise_kernel<128>(x)", 3)]),
    ]
    a = _analyze(tmp_path, prog)
    assert [(s, b, c) for _, s, b, c in _stages(a)] == [
        ("route", 4_000, 0),
        ("dispatch", 30_000, 30_000),
        ("expert", 45_000, 0),
        ("combine", 25_000, 25_000),
    ]
    assert set(a.stages["method"].unique()) == {"preset:megatron_frames"}


def test_aiter_ck_mori(tmp_path):
    prog = [
        ("k", "void aiter::moeTopK<256, 8>(float const*)", 4),
        ("k", "void ck_tile::kentry<256, 1, ck_tile::MoeSortingKernel<Problem>>(Kargs)", 3),
        (
            "k",
            "void mori::moe::EpDispatchIntraNodeKernel<hip_bfloat16>(mori::moe::EpDispatchCombineArgs<hip_bfloat16>)",
            22,
        ),
        ("k", "fmoe_bf16_blockscaleFp8_g1u1_vs_silu_1tg_32x256", 40),
        ("k", "EpCombineIntraNodeKernel_bf16_p2p", 19),
    ]
    a = _analyze(tmp_path, prog)
    assert _stages(a) == [
        (0, "route", 4_000, 0),
        (0, "permute", 3_000, 0),
        (0, "dispatch", 22_000, 22_000),
        (0, "expert", 40_000, 0),
        (0, "combine", 19_000, 19_000),
    ]
    assert [c[1:] for c in _calls(a) if c[0] == 0] == [
        ("all_to_allv", "mori", "dispatch", 1),
        ("all_to_allv", "mori", "combine", 1),
    ]


def test_pplx_kernels_and_torch_symmetric_memory(tmp_path):
    prog = [
        ("op", "aten::topk", [("k", "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(X)", 4)]),
        ("k", "void (anonymous namespace)::dispatchKernel<4u, true, true>(int*)", 21),
        ("k", "void cutlass::Kernel<cutlass::gemm::kernel::GemmGrouped<X>>(Params)", 33),
        ("k", "void combineKernel<__nv_bfloat16, __nv_bfloat16, 4ul, true, true>(__nv_bfloat16*)", 17),
        (
            "op",
            "symm_mem::two_shot_all_reduce_",
            [("k", "void (anonymous namespace)::two_shot_all_reduce_kernel_inplace<c10::BFloat16, 16, 2>(X)", 8)],
        ),
    ]
    a = _analyze(tmp_path, prog)
    assert _stages(a) == [
        (0, "route", 4_000, 0),
        (0, "dispatch", 21_000, 21_000),
        (0, "expert", 33_000, 0),
        (0, "combine", 17_000, 17_000),
    ]
    assert [c[1:] for c in _calls(a) if c[0] == 0] == [
        ("all_to_allv", "pplx", "dispatch", 1),
        ("all_to_allv", "pplx", "combine", 1),
        ("allreduce", "torch_symm_mem", None, 1),  # the type comes from the launching op
    ]
    assert a.steps["comm_ns"].to_list() == [46_000, 46_000]


def test_plain_pytorch_moe_layer_in_a_user_range(tmp_path):
    # an MoE layer of plain PyTorch ops inside a user's range named by a --stages container preset:
    # softmax + top-k + sort route; the index_select before the expert GEMMs feeds them (expert work), the
    # scatter after them unpermutes
    f = tmp_path / "p.toml"
    f.write_text("[[preset]]\nname = 'mine'\nkind = 'container'\nstage = 'moe'\npattern = '^MyMoE$'\n")
    prog = [
        ("k", "void (anonymous namespace)::softmax_warp_forward<float, float, float, 6, false>(X)", 9),  # attention
        (
            "op",
            "MyMoE",
            [
                ("k", "ampere_bf16_s16816gemm_bf16_64x64_ldg8_f2f_tn", 5),
                ("k", "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, float, float, 6, false>(X)", 2),
                ("k", "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(X)", 3),
                (
                    "k",
                    "void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long, at::native::LTOp<float>>(X)",
                    2,
                ),
                ("k", "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, 3>(X)", 4),
                ("k", "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn", 20),
                ("k", "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn", 20),
                ("k", "void at::native::_scatter_gather_elementwise_kernel<128, 4, X>(int, X)", 6),
            ],
        ),
    ]
    for r in range(2):
        _trace(tmp_path / f"rank{r}.json", r, 2, prog)
    a = ep_trace.load([tmp_path], config=AnalysisConfig(stage_presets=f))
    assert _stages(a) == [
        (0, "route", 7_000, 0),  # the softmax outside any MoE range and without a top-k next to it is no stage
        (0, "expert", 44_000, 0),
        (0, "unpermute", 6_000, 0),
    ]
    assert a.tables.collectives.height == 0


@pytest.mark.parametrize(
    "name, family",
    [
        ("ncclDevKernel_AllReduce_Sum_bf16_NVLS(ncclDevKernelArgsStorage<4096ul>)", "nccl"),
        ("ncclKernel_AllReduce_COLLNET_DIRECT_LL_Sum_float(ncclWorkElem)", "nccl"),
        ("ncclDevKernel_AllGather_NVLS_TREE_SIMPLE(ncclDevKernelArgsStorage<4096ul>)", "nccl"),
        ("void mscclpp::collective::allreduceAllPairs<__nv_bfloat16>(X)", "msccl"),
        ("nvshmemi_transfer_rma_kernel", "nvshmem"),
        ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*)", None),
        ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(X)", "torch_symm_mem"),
        ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*)", "custom_allreduce"),
        ("void aiter::cross_device_reduce_1stage<__hip_bfloat16, 8>(aiter::RankData*)", "custom_allreduce"),
        ("mori_shmem_barrier_all_block", "mori"),
        ("void tensorrt_llm::kernels::moe_alltoall::moeA2ASanitizeExpertIdsKernel(int*)", None),
    ],
)
def test_comm_families(name, family):
    from ep_trace.comm_classifier import comm_family

    assert comm_family(name) == family
