"""The one collective vocabulary of the Kineto and Nsight parsers (parsers/collective_names.py)."""

from __future__ import annotations

import polars as pl
import pytest

from ep_trace.parsers.collective_names import collective_range_type, collective_range_types, normalise_collective

NAMES = [
    # c10d dispatcher ops
    ("c10d::alltoall_base_", "all_to_all"),
    ("c10d::alltoall_", "all_to_all"),
    ("c10d::allreduce_", "allreduce"),
    ("c10d::_allgather_base_", "allgather"),
    ("c10d::allgather_into_tensor_coalesced_", "allgather"),
    ("c10d::_reduce_scatter_base_", "reduce_scatter"),
    ("c10d::reduce_scatter_tensor_coalesced_", "reduce_scatter"),
    ("c10d::broadcast_", "broadcast"),
    ("c10d::send", "send"),
    ("c10d::recv_", "recv"),
    ("c10d::recv_any_source_", "recv"),
    ("c10d::barrier", "barrier"),
    ("c10d::monitored_barrier_", "barrier"),
    # functional collectives
    ("_c10d_functional::all_to_all_single", "all_to_all"),
    ("_c10d_functional::all_reduce", "allreduce"),
    ("_c10d_functional::all_gather_into_tensor", "allgather"),
    ("_c10d_functional::reduce_scatter_tensor", "reduce_scatter"),
    # ProcessGroup titles
    ("nccl:all_to_all", "all_to_all"),
    ("nccl:_all_gather_base", "allgather"),
    ("nccl:all_reduce", "allreduce"),
    ("nccl:reduce_scatter", "reduce_scatter"),
    ("nccl:send", "send"),
    ("nccl:recv", "recv"),
    ("nccl:barrier", "barrier"),
    ("gloo:all_to_all", "all_to_all"),
    ("gloo:all_gather", "allgather"),
    # NCCL API ranges
    ("ncclAllReduce", "allreduce"),
    ("ncclAllGather", "allgather"),
    ("ncclReduceScatter", "reduce_scatter"),
    ("ncclBroadcast", "broadcast"),
    ("ncclBcast", "broadcast"),
    ("ncclAllToAll", "all_to_all"),
]
# serving engines' custom ops: typed (the launching op of a custom all-reduce kernel), not range markers
ENGINE_OPS = [
    ("vllm::all_reduce", "allreduce"),
    ("sglang::outplace_all_reduce", "allreduce"),
    ("sglang::inplace_all_reduce", "allreduce"),
    ("sglang::reg_all_gather_into_tensor", "allgather"),
    ("trtllm::moe_allreduce", "allreduce"),
    ("trtllm::moe_finalize_allreduce", "allreduce"),
    ("trtllm::allgather", "allgather"),
    ("sglang::inplace_fused_experts", "unknown"),
]
# record_param_comms "Collective name" values (no prefix: normalised, but not range markers)
METADATA = [
    ("all_to_allv", "all_to_allv"),
    ("_reduce_scatter_base", "reduce_scatter"),
    ("allgather_into_tensor_coalesced", "allgather"),
    ("wait", "unknown"),
    ("", "unknown"),
    (None, "unknown"),
]
NOT_MARKERS = [
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclSend",
    "ncclRecv",
    "ncclCommInitRank",
    "_c10d_functional::wait_tensor",
    "aten::mm",
    "all_to_allv",
    "c10d::gather_",
    "nccl:coalesced",
    "ep:dispatch:l0:fwd",
    "",
]


@pytest.mark.parametrize(("name", "want"), NAMES + METADATA + ENGINE_OPS)
def test_normalise_collective(name, want) -> None:
    assert normalise_collective(name) == want


@pytest.mark.parametrize(("name", "want"), NAMES)
def test_range_markers(name, want) -> None:
    assert collective_range_type(name) == want


@pytest.mark.parametrize("name", NOT_MARKERS + [n for n, _ in ENGINE_OPS])
def test_not_range_markers(name) -> None:
    assert collective_range_type(name) is None


def test_column_form_equals_the_scalar_rule() -> None:
    names = pl.Series("name", [n for n, _ in NAMES] + NOT_MARKERS + [None, "nccl:all_to_all"])
    got = collective_range_types(names).to_list()
    assert got == [collective_range_type(n) for n in names.to_list()]
