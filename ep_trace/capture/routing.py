"""Record routing decisions and all-to-all splits into the sidecar of the active Tracer.

Kineto cannot give these numbers exactly: gloo records no collective metadata, and NCCL's
``record_param_comms`` truncates split lists beyond 30 ranks. Both functions are no-ops (one list
check) when no :class:`ep_trace.Tracer` is active, so instrumented code can call them always.

Host syncs: ``record_routing`` turns per-expert counts into a Python list. Pass ``expert_counts``
when your code already holds them on the host (the all-to-all split sizes need them anyway);
otherwise a GPU ``topk_ids`` tensor is reduced with ``bincount`` and copied to the host (a D2H sync).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ep_trace.capture.sidecar import active_writer
from ep_trace.errors import ConfigError

__all__ = ["record_routing", "record_a2a", "reserve_a2a_call", "A2A_DIRECTIONS"]

#: Values of the ``direction`` field of ``a2a`` records.
A2A_DIRECTIONS: tuple[str, ...] = ("count", "dispatch", "combine")


def _as_int_list(x: Any, what: str) -> list[int]:
    if hasattr(x, "tolist"):  # torch.Tensor / numpy array, without importing either
        x = x.tolist()
    try:
        out = [int(v) for v in x]
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what}: expected a list of integers, got {x!r}") from exc
    if any(v < 0 for v in out):
        raise ConfigError(f"{what}: negative entry in {out}")
    return out


def _normalise_placement(placement: Sequence[Any] | None, num_experts: int) -> list[list[int]] | None:
    """``placement[e]`` as a list of ranks; accepts ``[rank_of_e, ...]`` or ``[[ranks], ...]``."""
    if placement is None:
        return None
    if hasattr(placement, "tolist"):
        placement = placement.tolist()
    out = [[int(r)] if isinstance(r, int) else [int(x) for x in r] for r in placement]
    if len(out) != num_experts:
        raise ConfigError(f"placement: has {len(out)} entries for {num_experts} experts; give one per expert")
    return out


def record_routing(
    layer: int,
    topk_ids: Any,
    num_experts: int,
    placement: Sequence[Any] | None = None,
    *,
    microbatch: int = 0,
    expert_counts: Any = None,
    hidden_size: int | None = None,
    dtype: Any = None,
    group_ranks: Sequence[int] | None = None,
    dropped: int = 0,
    padded: int = 0,
) -> None:
    """Record one routing decision (per step, layer, micro-batch) of this rank.

    Args:
        layer: MoE layer index.
        topk_ids: ``[tokens, top_k]`` integer tensor of chosen global expert ids.
        num_experts: Number of routed experts E.
        placement: Expert -> rank map: ``placement[e]`` is a rank or a list of ranks (replicas). The
            first one goes to the meta with ``redundant_experts`` (the copies beyond one per expert);
            when a layer's placement differs from the one in force for it, a ``placement`` record
            (step, layer, placement, redundant_experts) marks the change (docs/sidecar.md).
        microbatch: Micro-batch index (0 when not micro-batched).
        expert_counts: Optional precomputed assignments per expert (length E) to avoid a bincount.
        hidden_size: Hidden size of the dispatched rows (meta).
        dtype: Dispatched activation dtype (``torch.bfloat16`` or ``"bfloat16"``; meta).
        group_ranks: Global ranks of the EP group in group-local order (meta).
        dropped: Assignments the router dropped (capacity overflow): chosen in ``topk_ids`` but not
            dispatched, so not in ``expert_counts`` (pass the counts of what was dispatched).
        padded: Padding assignments in ``expert_counts`` that no token made (capacity / alignment
            padding). The sidecar's check: ``sum(expert_counts) = tokens x top_k - dropped + padded``.

    Raises:
        ConfigError: inconsistent shapes (counts not of length E, placement not one entry per expert),
            negative ``dropped`` / ``padded``, or counts that break the sum above.
    """
    w = active_writer()
    if w is None:
        return
    shape = tuple(topk_ids.shape)
    tokens, top_k = (shape[0], shape[1]) if len(shape) == 2 else (shape[0], 1)
    if expert_counts is None:
        import torch  # capture layer; only reached when a Tracer is active

        expert_counts = torch.bincount(topk_ids.reshape(-1).to(torch.int64), minlength=num_experts)
    counts = _as_int_list(expert_counts, "expert_counts")
    if len(counts) != num_experts:
        raise ConfigError(f"expert_counts: length {len(counts)} != num_experts {num_experts}")
    _check_conservation(counts, int(tokens), int(top_k), int(dropped), int(padded))
    where = _normalise_placement(placement, num_experts)
    first = where is not None and w.meta.get("placement") is None
    w.update_meta(
        num_experts=int(num_experts),
        top_k=int(top_k),
        placement=where if first else None,
        # copies beyond one per expert, declared beside the placement (docs/sidecar.md)
        redundant_experts=_redundant(where, num_experts) if first else None,
        hidden_size=None if hidden_size is None else int(hidden_size),
        dtype=None if dtype is None else str(dtype).removeprefix("torch."),
        ep_group_ranks=None if group_ranks is None else [int(r) for r in group_ranks],
    )
    if where is not None and where != w.placements.get(int(layer), w.meta.get("placement")):
        # a layer's placement changed (an EPLB rearrangement, ep-trace demo --alt-placement): meta keeps
        # the first placement, this record the new one of this layer from this step on
        w.placements[int(layer)] = where
        w.write(
            "placement",
            step=w.step,
            layer=int(layer),
            placement=where,
            redundant_experts=_redundant(where, num_experts),
        )
    w.write(
        "routing",
        step=w.step,
        layer=int(layer),
        microbatch=int(microbatch),
        expert_counts=counts,
        tokens=int(tokens),
        top_k=int(top_k),
        **({"dropped": int(dropped)} if dropped else {}),
        **({"padded": int(padded)} if padded else {}),
    )


def _check_conservation(counts: list[int], tokens: int, top_k: int, dropped: int, padded: int) -> None:
    """Refuse at capture what the analysis would refuse at ingest (parsers/sidecar_checks.py)."""
    if dropped < 0 or padded < 0:
        raise ConfigError(f"dropped / padded: must be >= 0, got {dropped} / {padded}")
    want = tokens * top_k - dropped + padded
    if sum(counts) != want:
        raise ConfigError(
            f"expert_counts: sum to {sum(counts)}, not tokens x top_k - dropped + padded = {tokens} x {top_k} - "
            f"{dropped} + {padded} = {want}; pass the counts of the assignments dispatched, with the drops / padding"
        )


def _redundant(placement: list[list[int]] | None, num_experts: int) -> int | None:
    """Copies beyond one per expert of ``placement[e]`` lists (None without a placement)."""
    return None if placement is None else sum(len(r) for r in placement) - int(num_experts)


def reserve_a2a_call() -> int | None:
    """Take the next all-to-all ordinal of this step now (for async calls recorded after ``wait()``).

    The ``call`` field must follow *issue* order, which is the order of the ``c10d::alltoall_base_``
    ops in the trace; async calls complete (and get recorded) in another order. ``None`` when no
    Tracer is active.
    """
    w = active_writer()
    return None if w is None else w.next_a2a_call()


def record_a2a(
    direction: str,
    send_splits: Any,
    recv_splits: Any,
    *,
    layer: int,
    row_bytes: int,
    start_ns: int,
    end_ns: int,
    microbatch: int = 0,
    group_ranks: Sequence[int] | None = None,
    call: int | None = None,
    phase: str = "fwd",
    link_delay_ns: int | None = None,
    cross_node_delay_ns: int | None = None,
) -> None:
    """Record one all-to-all(v) call of this rank with its full split lists.

    Args:
        direction: ``"count"`` (split exchange), ``"dispatch"`` or ``"combine"``.
        send_splits: Rows sent to each group-local peer.
        recv_splits: Rows received from each group-local peer.
        layer: MoE layer index.
        row_bytes: Bytes per row (hidden x element size for tokens; element size for counts).
        start_ns: ``time.time_ns()`` just before the call.
        end_ns: ``time.time_ns()`` when the call completed (after ``wait()`` for async calls).
        microbatch: Micro-batch index.
        group_ranks: Global ranks of the group in group-local order (default: the EP group of meta).
        call: Ordinal from :func:`reserve_a2a_call` taken when an async call was *issued*; default:
            the next ordinal now (right for synchronous calls recorded right after they return).
        phase: ``"fwd"``, or ``"bwd"`` for the transposed all-to-all of the backward pass.
        link_delay_ns: The injected link delay this call really waited (``ep-trace demo
            --link-latency-ms``, ``--cross-node-*``), when there is one: the known answer a sweep's α is
            checked against.
        cross_node_delay_ns: The delay the demo's emulated cross-node link asked for this call
            (``ep-trace demo --nodes``; 0 when the call moved nothing across nodes): the known answer
            of a link-class fit.

    Raises:
        ConfigError: unknown direction, or split lists whose length differs from the group size.
    """
    w = active_writer()
    if w is None:
        return
    if direction not in A2A_DIRECTIONS:
        raise ConfigError(f"direction: unknown all-to-all direction {direction!r}; use one of {A2A_DIRECTIONS}")
    if phase not in ("fwd", "bwd"):
        raise ConfigError(f"phase: unknown phase {phase!r}; use 'fwd' or 'bwd'")
    send = _as_int_list(send_splits, "send_splits")
    recv = _as_int_list(recv_splits, "recv_splits")
    ranks = [int(r) for r in group_ranks] if group_ranks is not None else list(w.meta.get("ep_group_ranks") or [])
    if len(send) != len(ranks) or len(recv) != len(ranks):
        raise ConfigError(
            f"send_splits/recv_splits: lengths {len(send)}/{len(recv)} differ from the group size {len(ranks)}; "
            "pass group_ranks of the process group used"
        )
    w.write(
        "a2a",
        step=w.step,
        layer=int(layer),
        microbatch=int(microbatch),
        direction=direction,
        phase=phase,
        call=w.next_a2a_call() if call is None else int(call),
        send_splits=send,
        recv_splits=recv,
        row_bytes=int(row_bytes),
        group_ranks=ranks,
        start_ns=int(start_ns),
        end_ns=int(end_ns),
        **({} if link_delay_ns is None else {"link_delay_ns": int(link_delay_ns)}),
        **({} if cross_node_delay_ns is None else {"cross_node_delay_ns": int(cross_node_delay_ns)}),
    )
