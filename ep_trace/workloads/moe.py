"""A real expert-parallel MoE layer over torch.distributed, and its single-process dense reference.

Data path per layer (every stage tagged with :func:`ep_trace.stage`, splits recorded to the sidecar):

    route      router logits -> top-k experts + softmax weights; per-expert counts (record_routing)
    permute    sort the T*k assignments by expert = destination-contiguous send buffer
    dispatch   count exchange (all_to_all_single of per-expert counts) + token all_to_allv
    expert     grouped GEMMs of the local experts (+ injected straggler delay)
    combine    all_to_allv back to the source ranks
    unpermute  scatter back to (token, slot) order + weighted sum over the top-k slots

Experts are placed contiguously by default: with W ranks in the EP group and L = E / W, group-local
rank j owns experts ``j*L .. j*L+L-1``, so sorting assignments by expert id makes the send buffer
contiguous per destination. Any other placement, replicas included, is a :class:`SlotMap`
(:mod:`ep_trace.workloads.expert_slots`): assignments are sorted by *physical slot* instead, the
replica of each chosen by the rule of :mod:`ep_trace.expert_placement`. With ``chunks > 1`` dispatch / expert / combine are pipelined over chunks with async
all-to-alls, so the transfer of chunk c+1 (on gloo's worker thread) runs under the GEMMs of chunk c;
chunk c's ranges and a2a records carry micro-batch c, the count exchange a dispatch range without one.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ep_trace.capture.concrete import collective_inputs
from ep_trace.capture.routing import record_a2a, reserve_a2a_call
from ep_trace.capture.stages import stage
from ep_trace.expert_placement import contiguous_placement
from ep_trace.workloads.autograd import a2a, bwd_region, delayed_record
from ep_trace.workloads.expert_slots import SlotMap, slot_map
from ep_trace.workloads.links import LinkDelay

__all__ = [
    "MoEWeights",
    "EpDebug",
    "make_layer_weights",
    "local_experts",
    "held_experts",
    "route",
    "ep_moe_forward",
    "dense_moe_forward",
    "dense_slot_outputs",
]


@dataclass(frozen=True)
class MoEWeights:
    """Weights of one MoE layer: router ``[H, E]`` and the experts held (``w1 [n, H, F]``, ``w2 [n, F, H]``).

    The held experts are ``expert_ids`` in slot order, or ``first_expert .. first_expert+n-1`` when
    ``expert_ids`` is empty (a contiguous block).
    """

    router: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    first_expert: int = 0
    expert_ids: tuple[int, ...] = ()

    @property
    def num_local(self) -> int:
        """Number of experts held."""
        return int(self.w1.shape[0])

    @property
    def global_ids(self) -> tuple[int, ...]:
        """Global expert id of each local slot."""
        return self.expert_ids or tuple(range(self.first_expert, self.first_expert + self.num_local))


@dataclass(frozen=True)
class EpDebug:
    """Per-rank evidence for the EP invariants (only with ``debug=True``).

    ``recv_tags[i]`` = ``(src_global_rank << 32) + token*k + slot`` of received row i (rows in
    source-then-expert order); ``recv_experts[i]`` its global expert; ``slot_out [T, k, H]`` the expert
    output that came back for each (token, slot) before weighting.
    """

    send_splits: list[int]
    recv_splits: list[int]
    recv_tags: torch.Tensor
    recv_experts: torch.Tensor
    slot_out: torch.Tensor


def make_layer_weights(hidden: int, ffn: int, experts: int, *, seed: int, layer: int) -> MoEWeights:
    """All weights of one layer, deterministic from ``(seed, layer)`` (every rank builds the same)."""
    g = torch.Generator().manual_seed(seed * 100_003 + layer)
    router = torch.randn(hidden, experts, generator=g) / hidden**0.5
    w1 = torch.randn(experts, hidden, ffn, generator=g) / hidden**0.5
    w2 = torch.randn(experts, ffn, hidden, generator=g) / ffn**0.5
    return MoEWeights(router, w1, w2, 0)


def local_experts(w: MoEWeights, first: int, count: int) -> MoEWeights:
    """The slice of experts ``first .. first+count-1`` (contiguous copies: real per-rank storage)."""
    return MoEWeights(
        w.router, w.w1[first : first + count].contiguous(), w.w2[first : first + count].contiguous(), first
    )


def held_experts(w: MoEWeights, experts: tuple[int, ...]) -> MoEWeights:
    """The experts ``experts`` (global ids, in this order) of all-expert weights ``w``, as one rank holds them."""
    idx = torch.tensor(experts, dtype=torch.int64)
    return MoEWeights(w.router, w.w1.index_select(0, idx), w.w2.index_select(0, idx), 0, tuple(experts))


def route(
    x: torch.Tensor, router: torch.Tensor, top_k: int, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing: ``(topk_ids [T, k] int64, topk_w [T, k])``.

    ``bias`` ([T, E], optional) shifts only the *selection* (as in aux-loss-free load balancing);
    the gate weights are the softmax of the unbiased router logits of the chosen experts.
    """
    logits = x @ router
    sel = logits if bias is None else logits + bias
    ids = sel.topk(top_k, dim=-1).indices
    weights = torch.softmax(logits.gather(1, ids), dim=-1)
    return ids, weights


def _expert_mlp(rows: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.gelu(rows @ w1) @ w2


def _grouped_experts(rows: torch.Tensor, local_eid: torch.Tensor, w: MoEWeights) -> torch.Tensor:
    """Run each row through its local expert; rows grouped by expert with one GEMM pair per expert."""
    if rows.shape[0] == 0:
        # a rank that received no rows (it holds no expert, or its experts got no tokens) still
        # returns a tensor on the autograd graph: the backward's transposed all-to-alls are collectives
        # every rank must join, and an output without grad_fn would skip them here and hang the others
        return rows.clone()
    out = torch.empty_like(rows)
    order = torch.argsort(local_eid, stable=True)
    counts = torch.bincount(local_eid, minlength=w.num_local).tolist()
    start = 0
    for e, n in enumerate(counts):
        if n:
            idx = order[start : start + n]
            out[idx] = _expert_mlp(rows.index_select(0, idx), w.w1[e], w.w2[e])
            start += n
    return out


def _straggle(ms: float) -> None:
    """Delay this rank by ``ms`` milliseconds inside its expert stage.

    A sleep, not a busy loop: the demo runs W ranks on a few shared cores, and a busy straggler would
    slow the other ranks too (they share its cores), blurring which rank is late. The delay shows in
    the trace as a longer ``ep:expert`` range and as wait of the other ranks in the next all-to-all.
    """
    if ms > 0:
        time.sleep(ms / 1000.0)


def _chunk_bounds(n: int, chunks: int) -> list[int]:
    return [(n * c) // chunks for c in range(chunks + 1)]


def _chunk_splits(sizes: list[int], chunks: int) -> list[list[int]]:
    """Per chunk, the rows of each peer's segment it takes (``_chunk_bounds`` of every segment)."""
    bounds = [_chunk_bounds(s, chunks) for s in sizes]
    return [[b[c + 1] - b[c] for b in bounds] for c in range(chunks)]


def _chunk_offsets(splits: list[list[int]]) -> list[int]:
    """Start row of each chunk of a chunk-major buffer, then its total rows (``splits``: :func:`_chunk_splits`)."""
    return [0, *itertools.accumulate(sum(c) for c in splits)]


def _chunk_major(peer_rows: torch.Tensor, chunks: int) -> torch.Tensor:
    """Permutation of a peer-major buffer (``peer_rows[j]`` rows of peer j, in order) into chunk-major order.

    Chunk c takes rows ``_chunk_bounds(n_j)[c] .. [c+1]`` of peer j's segment; in the returned order
    the rows of chunk c (peer 0's part, then peer 1's ...) are contiguous, so each chunk's send
    buffer is a slice of one buffer, not a gather, and its combine lands in a slice of one output, not
    a scatter: what a production pipeline does (the extra copies of a gather per chunk are no part of
    what pipelining costs). Row i of a segment of n rows is in chunk ``ceil((i + 1) k / n) - 1`` (the
    c with ``floor(n c / k) <= i < floor(n (c + 1) / k)``). Device ops only: no host sync.
    """
    n = peer_rows.to(torch.int64)
    peer = torch.repeat_interleave(torch.arange(n.numel(), device=n.device), n)
    start = torch.cumsum(n, 0) - n
    i = torch.arange(peer.numel(), device=n.device) - start[peer]
    chunk = ((i + 1) * chunks - 1) // n[peer]
    return torch.argsort(chunk * n.numel() + peer, stable=True)


def _a2a(
    out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any, async_op: bool
) -> Any:
    with collective_inputs():  # the split lists stay in the trace; no other op records its arguments
        return dist.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=async_op)


def ep_moe_forward(
    x: torch.Tensor,
    w: MoEWeights,
    topk_ids: torch.Tensor,
    topk_w: torch.Tensor,
    *,
    num_experts: int,
    layer: int = 0,
    group: Any = None,
    chunks: int = 1,
    straggle_ms: float = 0.0,
    link: LinkDelay | None = None,
    slots: SlotMap | None = None,
    debug: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, EpDebug]:
    """Expert-parallel forward of one MoE layer on this rank (route already done).

    Args:
        x: ``[T, H]`` tokens of this rank.
        w: This rank's experts, in its slot order of ``slots`` (contiguous default: ``w.first_expert``
            must be ``group_rank * E / W``).
        topk_ids: ``[T, k]`` global expert ids.
        topk_w: ``[T, k]`` gate weights.
        num_experts: E (a multiple of the group size without ``slots``).
        layer: Layer index (stage names, sidecar).
        group: Process group (``None``: the default group).
        chunks: Pipeline chunks for dispatch / expert / combine (1: no pipelining).
        straggle_ms: Delay (sleep) inside the expert stage, ms per layer (split over chunks).
        link: Delays before every all-to-all (count exchange, dispatch, combine):
            :class:`ep_trace.workloads.links.LinkDelay`; needs ``chunks=1`` (in the pipelined path a
            host sleep would also stall the GEMMs it should overlap).
        slots: The placement's physical slots seen from this rank (:func:`ep_trace.workloads.expert_slots.slot_map`,
            group-local ranks); ``None``: contiguous blocks of E / W experts, no replicas.
        debug: Also return :class:`EpDebug` (costs one extra all-to-all of tags, not recorded).

    Autograd: with ``chunks=1`` the layer is differentiable (tokens, gate weights, expert weights);
    its backward runs the transposed all-to-alls and tags every stage with ``phase="bwd"``.

    Returns:
        ``[T, H]`` output in the original token order, and the debug record when ``debug``.
    """
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    W, me = len(ranks), dist.get_rank(group)
    if slots is None:
        slots = slot_map(contiguous_placement(num_experts, W), me, device=x.device)
    T, H = x.shape
    k = topk_ids.shape[1]
    grad = torch.is_grad_enabled() and (x.requires_grad or topk_w.requires_grad or w.w1.requires_grad)
    if grad and chunks > 1:
        raise ValueError("ep_moe_forward: the chunked pipeline is forward-only; use chunks=1 with autograd")
    if link is not None and link.active and chunks > 1:
        raise ValueError("ep_moe_forward: link delays need chunks=1")
    if slots.world_size != W or slots.slots[me] != w.num_local:
        raise ValueError(f"ep_moe_forward: slots for {slots.world_size} ranks / {w.num_local} local experts mismatch")
    n_me = slots.slots[me]
    p_in, p_out = bwd_region("permute", layer)
    with stage("permute", layer):
        flat = slots.assign(topk_ids.reshape(-1))  # physical slot of each assignment
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=slots.num_slots)
        dest_rows = slots.rows_per_rank(counts)
        # pipelined: chunk-major send buffer, so that each chunk's rows are one contiguous slice
        send_order = order if chunks <= 1 else order[_chunk_major(dest_rows, chunks)]
        send_x = p_out(p_in(x).index_select(0, send_order // k))
    with stage("dispatch", layer):
        recv_counts = counts.new_empty(n_me * W)
        count_send, count_recv = list(slots.slots), [n_me] * W
        t0, slept, cross = delayed_record(link, count_send, count_recv, counts.element_size())
        _a2a(recv_counts, counts, count_recv, count_send, group, False)
        record_a2a(
            "count",
            count_send,
            count_recv,
            layer=layer,
            row_bytes=counts.element_size(),
            group_ranks=ranks,
            start_ns=t0,
            end_ns=time.time_ns(),
            link_delay_ns=slept,
            cross_node_delay_ns=cross,
        )
        rc = recv_counts.view(W, n_me)
        # The split lists must be host ints for all_to_all_single: on GPU this .tolist() is the D2H
        # sync every all_to_allv-based EP layer has between the count exchange and token dispatch.
        send_splits = dest_rows.tolist()
        recv_rows = rc.sum(1)
        recv_splits = recv_rows.tolist()
        local_eid = torch.repeat_interleave(torch.arange(n_me, device=x.device).repeat(W), rc.reshape(-1))
        if chunks <= 1:  # one dispatch range per layer: count exchange + token all_to_allv
            recv_x = a2a(
                send_x, recv_splits, send_splits, group=group, ranks=ranks, layer=layer, direction="dispatch",
                link=link,
            )  # fmt: skip
    if chunks <= 1:
        e_in, e_out = bwd_region("expert", layer)
        with stage("expert", layer):
            out = e_out(_grouped_experts(e_in(recv_x), local_eid, w))
            _straggle(straggle_ms)
        with stage("combine", layer):
            back = a2a(
                out, send_splits, recv_splits, group=group, ranks=ranks, layer=layer, direction="combine",
                link=link,
            )  # fmt: skip
    else:
        back = _pipelined(
            send_x, local_eid, w, send_splits, recv_splits, recv_rows, ranks, group, layer, chunks, straggle_ms
        )
    u_in, u_out = bwd_region("unpermute", layer)
    with stage("unpermute", layer):
        back = u_in(back)
        slots_out = torch.empty_like(back)
        slots_out[send_order] = back
        y = u_out((slots_out.view(T, k, H) * topk_w.unsqueeze(-1).to(x.dtype)).sum(1))
    if not debug:
        return y
    src = dist.get_global_rank(group, me) if group is not None else me
    send_tags = ((src << 32) + torch.arange(T * k, device=x.device))[order]
    recv_tags = torch.empty(sum(recv_splits), dtype=torch.int64, device=x.device)
    _a2a(recv_tags, send_tags, recv_splits, send_splits, group, False)
    held = torch.tensor(w.global_ids, dtype=torch.int64, device=x.device)
    dbg = EpDebug(send_splits, recv_splits, recv_tags, held[local_eid], slots_out.view(T, k, H))
    return y, dbg


def _pipelined(
    send_x: torch.Tensor,
    local_eid: torch.Tensor,
    w: MoEWeights,
    send_splits: list[int],
    recv_splits: list[int],
    recv_rows: torch.Tensor,
    ranks: list[int],
    group: Any,
    layer: int,
    chunks: int,
    straggle_ms: float,
) -> torch.Tensor:
    """Chunked dispatch -> expert -> combine: chunk c+1's dispatch is in flight during chunk c's GEMMs.

    ``send_x`` is chunk-major (:func:`_chunk_major`); the result is too (the rows of ``send_x``, back).
    ``local_eid`` is peer-major as received; ``recv_rows`` the rows received from each peer (tensor).
    """
    H = send_x.shape[1]
    row_bytes = H * send_x.element_size()
    s_split, r_split = _chunk_splits(send_splits, chunks), _chunk_splits(recv_splits, chunks)
    s_off, r_off = _chunk_offsets(s_split), _chunk_offsets(r_split)
    eid = local_eid.index_select(0, _chunk_major(recv_rows, chunks))  # chunk-major, as the chunks arrive
    recv = send_x.new_empty(r_off[-1], H)
    back = send_x.new_empty(s_off[-1], H)

    def launch_dispatch(c: int) -> tuple[Any, int, int | None]:
        with stage("dispatch", layer, c):
            call, t0 = reserve_a2a_call(), time.time_ns()
            src, dst = send_x[s_off[c] : s_off[c + 1]], recv[r_off[c] : r_off[c + 1]]
            return _a2a(dst, src, r_split[c], s_split[c], group, True), t0, call

    pending = launch_dispatch(0)
    combines = []
    for c in range(chunks):
        work, t0, call = pending
        with stage("dispatch", layer, c):
            work.wait()
            record_a2a(
                "dispatch",
                s_split[c],
                r_split[c],
                layer=layer,
                microbatch=c,
                row_bytes=row_bytes,
                group_ranks=ranks,
                start_ns=t0,
                end_ns=time.time_ns(),
                call=call,
            )
        if c + 1 < chunks:
            pending = launch_dispatch(c + 1)
        with stage("expert", layer, c):
            out_c = _grouped_experts(recv[r_off[c] : r_off[c + 1]], eid[r_off[c] : r_off[c + 1]], w)
            _straggle(straggle_ms / chunks)
        with stage("combine", layer, c):
            call, t1 = reserve_a2a_call(), time.time_ns()
            dst = back[s_off[c] : s_off[c + 1]]
            combines.append((c, _a2a(dst, out_c, s_split[c], r_split[c], group, True), t1, call))
    for c, work, t1, call in combines:
        with stage("combine", layer, c):
            work.wait()
            record_a2a(
                "combine",
                r_split[c],
                s_split[c],
                layer=layer,
                microbatch=c,
                row_bytes=row_bytes,
                group_ranks=ranks,
                start_ns=t1,
                end_ns=time.time_ns(),
                call=call,
            )
    return back


def dense_slot_outputs(x: torch.Tensor, w: MoEWeights, topk_ids: torch.Tensor) -> torch.Tensor:
    """Single-process reference: ``[T, k, H]`` output of expert ``topk_ids[t, s]`` on token t."""
    T, k = topk_ids.shape
    out = torch.zeros(T, k, x.shape[1], dtype=x.dtype, device=x.device)
    for e, expert in enumerate(w.global_ids):
        t_idx, s_idx = (topk_ids == expert).nonzero(as_tuple=True)
        if len(t_idx):
            out[t_idx, s_idx] = _expert_mlp(x[t_idx], w.w1[e], w.w2[e])
    return out


def dense_moe_forward(x: torch.Tensor, w: MoEWeights, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
    """Single-process dense MoE with all experts: the reference the EP forward must equal."""
    return (dense_slot_outputs(x, w, topk_ids) * topk_w.unsqueeze(-1).to(x.dtype)).sum(1)
