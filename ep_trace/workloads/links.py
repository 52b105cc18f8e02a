"""Injected link delays of the reference workload: a fixed per-call latency and emulated cross-node links.

The demo's ranks run on one machine (gloo on loopback), so every pair of ranks is "same node".
Two knobs make some all-to-all traffic cost what a network hop would, as host-side sleeps right
before each all-to-all call (count exchange, dispatch, combine; forward and backward), inside the
call's stage range:

* ``--link-latency-ms MS``: every call waits MS, whatever it moves (a stand-in for one hop whose
  size is known: the α a sweep should recover, docs/sweep.md).
* ``--nodes N`` with ``--cross-node-latency-ms A`` / ``--cross-node-gbps G``: ranks are grouped into
  N emulated nodes (contiguous blocks of ranks); only traffic between ranks on different nodes pays.

The cross-node model is one full-duplex NIC per rank. The messages of one all-to-all to different
peers are in flight together, so a call pays the latency A once, not once per peer, and only when it
moves bytes across nodes (NCCL's all_to_allv skips zero-size sends: ``pytorch/pytorch``,
``torch/csrc/cuda/nccl.cpp``, ``all2all_single_unequal_split``). Then the rank's NIC serialises its
cross-node bytes at G Gbit/s, sending and receiving at the same time, so the larger direction counts:

    delay_r = A + max(bytes sent to other nodes, bytes received from other nodes) / G

(0 when the call moves nothing across nodes; G = 0 means unlimited bandwidth). Not modelled: ranks of
one node sharing a NIC, switch congestion, and a receive that waits for a slow peer's NIC (each rank
pays only its own NIC's time; a rank whose delay is longer arrives later, and its peers' wait for it
shows as barrier wait, as it would behind a busier NIC). gloo has no hook inside a transfer, so the
trace shows the delay as host time of the dispatch / combine range before the ``c10d::alltoall_base_``
op; the sidecar's ``a2a`` records carry it (``link_delay_ns``: slept, ``cross_node_delay_ns``: asked).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LinkDelay", "node_blocks", "injected_cross_node_ns"]


def injected_cross_node_ns(run_dir: Path) -> dict[int, float]:
    """The cross-node delay a demo run asked for, per step, ns (the known answer of a node A/B run).

    Per all-to-all call the largest ``cross_node_delay_ns`` over the ranks' sidecars (the call ends after
    its latest rank), summed over the step's calls. Steps without such a record are absent.
    """
    per_call: dict[tuple[int, int], float] = {}
    for f in Path(run_dir).glob("rank*.ep.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") == "a2a" and "cross_node_delay_ns" in rec:
                key = (rec["step"], rec["call"])
                per_call[key] = max(per_call.get(key, 0.0), float(rec["cross_node_delay_ns"]))
    step: dict[int, float] = {}
    for (s, _), v in per_call.items():
        step[s] = step.get(s, 0.0) + v
    return step


def node_blocks(ranks: int, nodes: int) -> tuple[int, ...]:
    """Node of each rank: contiguous blocks of ``ranks // nodes`` ranks (``nodes`` divides ``ranks``)."""
    per = ranks // nodes
    return tuple(r // per for r in range(ranks))


@dataclass(frozen=True)
class LinkDelay:
    """The delays one rank adds before each of its all-to-all calls.

    Attributes:
        me: This rank (group-local).
        node_of: Node of each group-local rank.
        latency_ms: Fixed delay of every call (``--link-latency-ms``).
        cross_latency_ms: A, per call with cross-node bytes (``--cross-node-latency-ms``).
        cross_gbps: G, Gbit/s of the rank's NIC (``--cross-node-gbps``; 0 = unlimited).
    """

    me: int
    node_of: tuple[int, ...]
    latency_ms: float = 0.0
    cross_latency_ms: float = 0.0
    cross_gbps: float = 0.0

    @property
    def active(self) -> bool:
        """Whether any call can be delayed."""
        return self.latency_ms > 0 or self.emulates_nodes

    @property
    def emulates_nodes(self) -> bool:
        """Whether cross-node traffic pays (several nodes and a latency or a bandwidth set)."""
        return len(set(self.node_of)) > 1 and (self.cross_latency_ms > 0 or self.cross_gbps > 0)

    def cross_node_ns(self, send_rows: Sequence[int], recv_rows: Sequence[int], row_bytes: int) -> int:
        """The modelled cross-node delay of one call, ns (0 when it moves nothing across nodes)."""
        mine = self.node_of[self.me]
        out = sum(n for j, n in enumerate(send_rows) if self.node_of[j] != mine) * row_bytes
        inc = sum(n for j, n in enumerate(recv_rows) if self.node_of[j] != mine) * row_bytes
        if not out and not inc:
            return 0
        wire = max(out, inc) * 8 / (self.cross_gbps * 1e9) if self.cross_gbps > 0 else 0.0
        return round(self.cross_latency_ms * 1e6 + wire * 1e9)

    def wait(self, send_rows: Sequence[int], recv_rows: Sequence[int], row_bytes: int) -> tuple[int | None, int | None]:
        """Sleep this call's delay.

        Returns:
            ``(ns really slept or None when nothing was, cross-node ns asked or None without emulated
            nodes)``. The sleep really waited is longer than asked on a loaded machine (the OS wakes
            the thread when a core is free), hence both figures in the sidecar.
        """
        cross = self.cross_node_ns(send_rows, recv_rows, row_bytes) if self.emulates_nodes else None
        total = self.latency_ms * 1e6 + (cross or 0)
        if total <= 0:
            return None, cross
        t0 = time.perf_counter_ns()
        time.sleep(total / 1e9)
        return time.perf_counter_ns() - t0, cross
