"""Autograd pieces of the reference EP layer: a recorded all-to-all and backward stage ranges.

``dist.all_to_all_single`` is not differentiable. :func:`a2a` wraps it in an autograd Function whose
backward runs the transposed all-to-all (send and receive splits swapped) inside
``stage(<stage>, layer, phase="bwd")`` and records it to the sidecar with ``"phase": "bwd"``.

Backward ranges of compute stages: autograd runs a region's backward nodes between the backward of
its output and the backward of its input, so :func:`bwd_region` puts identity nodes on both ends
that open and close ``stage(..., phase="bwd")`` (the engine executes CPU backward on the calling
thread in reverse creation order, so the range brackets exactly the region's nodes).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ep_trace.capture.concrete import collective_inputs
from ep_trace.capture.routing import record_a2a
from ep_trace.capture.stages import stage

if TYPE_CHECKING:
    from ep_trace.workloads.links import LinkDelay

__all__ = ["a2a", "bwd_region", "BwdRange", "delayed_record"]


def a2a(
    inp: torch.Tensor,
    out_splits: list[int],
    in_splits: list[int],
    *,
    group: Any,
    ranks: list[int],
    layer: int,
    direction: str,
    link: LinkDelay | None = None,
) -> torch.Tensor:
    """Synchronous ``all_to_all_single`` of rows, differentiable, recorded in both directions.

    Args:
        inp: ``[sum(in_splits), H]`` rows in destination order.
        out_splits: Rows received from each group-local peer.
        in_splits: Rows sent to each group-local peer.
        group: Process group (``None``: default).
        ranks: Global ranks of the group, group-local order (sidecar).
        layer: Layer index (sidecar, backward stage range).
        direction: ``dispatch`` or ``combine`` (also the stage name of the backward range).
        link: Delays before the call, forward and backward (:class:`ep_trace.workloads.links.LinkDelay`).
    """
    if torch.is_grad_enabled() and inp.requires_grad:
        return _A2A.apply(inp, out_splits, in_splits, group, ranks, layer, direction, link)
    # No autograd node when no gradient flows: Function.apply records a cpu_op range named after the
    # class around the collective, which trace analysis could mistake for compute.
    return _A2A.forward(_NoCtx(), inp, out_splits, in_splits, group, ranks, layer, direction, link)


def delayed_record(
    link: LinkDelay | None, send_rows: list[int], recv_rows: list[int], row_bytes: int
) -> tuple[int, int | None, int | None]:
    """Sleep ``link``'s delay for one call, then read the clock: ``(start_ns, link_delay_ns, cross_node_delay_ns)``.

    A sleep on the calling thread just before the collective, inside its dispatch / combine range
    (:mod:`ep_trace.workloads.links`): gloo gives no hook inside the transfer, so the trace shows the
    delay as host time of the stage range outside any op (not as collective time); sweep fits read
    stage time, which includes it (docs/sweep.md). The two delays are the ``record_a2a`` fields:
    slept, and the cross-node model's ask (None where there is none).
    """
    slept, cross = link.wait(send_rows, recv_rows, row_bytes) if link is not None else (None, None)
    return time.time_ns(), slept, cross


class _NoCtx:
    """Stand-in for the autograd context when :class:`_A2A` runs without autograd."""

    args: tuple[Any, ...] = ()


def _run(out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> None:
    with collective_inputs():
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)


class _A2A(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        inp: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        group: Any,
        ranks: list[int],
        layer: int,
        direction: str,
        link: LinkDelay | None = None,
    ) -> torch.Tensor:  # noqa: E501
        out = inp.new_empty(sum(out_splits), inp.shape[1])
        rb = inp.shape[1] * inp.element_size()
        t0, slept, cross = delayed_record(link, in_splits, out_splits, rb)
        _run(out, inp.contiguous(), out_splits, in_splits, group)
        record_a2a(
            direction,
            in_splits,
            out_splits,
            layer=layer,
            row_bytes=rb,
            group_ranks=ranks,
            start_ns=t0,
            end_ns=time.time_ns(),
            link_delay_ns=slept,
            cross_node_delay_ns=cross,
        )
        ctx.args = (out_splits, in_splits, group, ranks, layer, direction, rb, link)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        out_splits, in_splits, group, ranks, layer, direction, rb, link = ctx.args
        with stage(direction, layer, phase="bwd"):
            g = grad.new_empty(sum(in_splits), grad.shape[1])
            t0, slept, cross = delayed_record(link, out_splits, in_splits, rb)
            _run(g, grad.contiguous(), in_splits, out_splits, group)
            record_a2a(
                direction,
                out_splits,
                in_splits,
                layer=layer,
                row_bytes=rb,
                group_ranks=ranks,
                start_ns=t0,
                end_ns=time.time_ns(),
                phase="bwd",
                link_delay_ns=slept,
                cross_node_delay_ns=cross,
            )
        return g, None, None, None, None, None, None, None


class BwdRange:
    """Holder of one backward stage range, shared by the two ends of a region."""

    __slots__ = ("name", "layer", "open")

    def __init__(self, name: str, layer: int) -> None:
        self.name, self.layer = name, layer
        self.open: stage | None = None


class _Marker(torch.autograd.Function):
    """Identity in the forward pass; subclasses act on the range in the backward pass."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, rng: BwdRange) -> torch.Tensor:
        ctx.rng = rng
        return t.view_as(t)


class _Open(_Marker):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        rng = ctx.rng
        if rng.open is None:
            rng.open = stage(rng.name, rng.layer, phase="bwd").__enter__()
        return g, None


class _Close(_Marker):
    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        rng = ctx.rng
        if rng.open is not None:
            rng.open.__exit__(None, None, None)
            rng.open = None
        return g, None


def bwd_region(name: str, layer: int) -> tuple[Any, Any]:
    """``(enter, leave)`` markers of a region whose backward gets ``stage(name, layer, phase="bwd")``.

    Use ``x = enter(x)`` on the region's input and ``y = leave(y)`` on its output; both are identity
    in the forward pass. Tensors that do not require grad pass through untouched.
    """
    rng = BwdRange(name, layer)

    def enter(t: torch.Tensor) -> torch.Tensor:
        return _Close.apply(t, rng) if t.requires_grad else t

    def leave(t: torch.Tensor) -> torch.Tensor:
        return _Open.apply(t, rng) if t.requires_grad else t

    return enter, leave
