"""The communication-kernel classifier: exact families for real and documented kernel names."""

from __future__ import annotations

import polars as pl
import pytest

from ep_trace.comm_classifier import COMM_KERNEL_PATTERNS, comm_family, comm_family_expr, is_comm_expr

CASES = [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "nccl"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "nccl"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)", "nccl"),
    ("ncclDevKernel_SendRecv", "nccl"),
    ("ncclDevKernel_AllGather_RING_LL", "nccl"),
    ("ncclDevKernel_Generic_1", "nccl"),
    ("ncclAllReduceRingLLKernel_sum_f32(CollectiveArgs)", "nccl"),
    ("ncclDevKernelDebug_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "rccl"),
    ("mscclKernel_Sum_float_LL(int, int, void*)", "msccl"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)", "deepep"),
    ("void deep_ep::internode_ll::combine<false, 7168>(void*)", "deepep"),
    ("deep_ep::intranode::notify_dispatch", "deepep"),
    # DeepSeek's internal DeepEP build (deepseek-ai/profile-data train.json): its layout kernel is compute
    ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*, float*)", "deepep"),
    ("void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*)", "deepep"),
    ("void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*)", None),
    ("void pplx::(anonymous namespace)::dispatchKernel<unsigned int>(int)", "pplx"),
    ("nvshmemi_transfer_rma_kernel", "nvshmem"),
    ("void nvshmemx_barrier_all_block_kernel()", "nvshmem"),
    ("void tensorrt_llm::kernels::moeA2ADispatchKernel<256>(void*)", "trtllm_moe_a2a"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(void*)", "custom_allreduce"),
    ("cross_device_reduce_2stage", "custom_allreduce"),
    # compute kernels, including ones whose template arguments mention comm libraries
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)", None),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", None),
    ("void foo<deep_ep::Config>(int)", None),
    ("add_one", None),
    ("my_ncclKernel_lookalike", None),
    ("saxpy", None),
]


@pytest.mark.parametrize(("name", "family"), CASES)
def test_scalar_family(name: str, family: str | None) -> None:
    assert comm_family(name) == family


def test_expr_matches_scalar_and_is_comm() -> None:
    df = pl.DataFrame({"name": [n for n, _ in CASES] + [None]})
    out = df.select(comm_family_expr(pl.col("name")).alias("f"), is_comm_expr(pl.col("name")).alias("c"))
    assert out["f"].to_list() == [f for _, f in CASES] + [None]
    assert out["c"].to_list() == [f is not None for _, f in CASES] + [False]
    assert out["c"].sum() == 20


def test_pattern_table_shape() -> None:
    families = [f for f, _ in COMM_KERNEL_PATTERNS]
    assert len(set(families)) == 10
    assert families.index("rccl") < families.index("nccl")


def test_memo_gives_the_same_families_when_warm_and_when_emptied(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-process memo of classified names (``comm_classifier._MEMO``): a warm call, a call that
    empties it past its cap, and a cold call agree name for name, nulls and order kept."""
    import ep_trace.comm_classifier as cc

    names = pl.Series(
        "name",
        ["ncclDevKernel_AllReduce_Sum_f32_RING_LL", None, "void at::native::vectorized_elementwise_kernel<4>"] * 3
        + ["ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"],
    )
    monkeypatch.setattr(cc, "_MEMO", {})
    cold = cc._classify(names)
    assert cold.name == "name" and cold.to_list() == (["nccl", None, None] * 3) + ["nccl"]
    assert set(cc._MEMO) == {n for n in names.to_list() if n is not None}
    assert cc._classify(names).equals(cold)  # warm: every name from the memo
    monkeypatch.setattr(cc, "_MEMO_CAP", 2)
    assert cc._classify(names.reverse()).equals(cold.reverse())  # new names past the cap: emptied first
    assert cc._classify(pl.Series("name", ["x" * 10], dtype=pl.Utf8)).to_list() == [None]
    assert len(cc._MEMO) == 1
