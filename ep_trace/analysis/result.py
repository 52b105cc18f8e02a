"""The result of an analysis: frozen polars frames plus ranked findings.

This is the contract between ``ep_trace.analysis`` and the present layer (``ep_trace.reports``,
the CLI): reports read these frames and :meth:`Analysis.summary`, never the trace formats. All
times are int64 ns; ``*_ns`` columns are durations unless named ``start_ns`` / ``end_ns``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import polars as pl

from ep_trace.analysis.config import AnalysisConfig
from ep_trace.analysis.placement_plan import PlacementProposal
from ep_trace.schema import LoadIssue, TraceTables

__all__ = ["Finding", "Withheld", "Analysis", "FRAME_DOCS"]

FindingKind = Literal[
    "exposed_comm",
    "straggler_wait",
    "routing_imbalance",
    "host_stall",
    "host_bound",
    "small_message_latency",
    "bandwidth_bound",
    "pack_unpack_overhead",
    "split_inconsistency",
    "missing_collective",
    "expert_placement",
    "cross_node_traffic",
]

#: Columns of every frame of :class:`Analysis` (documentation; the analysis fills them exactly).
FRAME_DOCS: dict[str, dict[str, str]] = {
    "rank_summary": {
        "rank": "global rank",
        "host": "host name",
        "step_time_ns": "P50 over steps of the step length",
        "step_time_max_ns": "max over steps",
        "comm_ns": "mean per step |C| (union of comm intervals)",
        "compute_ns": "mean per step |K|",
        "exposed_comm_ns": "mean per step |C \\ K|",
        "exposed_comm_p50_ns": "P50 over steps of |C \\ K|",
        "exposed_comm_p95_ns": "P95 over steps of |C \\ K|",
        "step_time_p95_ns": "P95 over steps",
        "step_time_p99_ns": "P99 over steps",
        "barrier_wait_p95_ns": "P95 over steps of the per-step wait",
        "n_steps": "steps analysed",
        "mode": "'gpu' (kernels) or 'cpu' (compute thread + gloo workers)",
        "overlap_efficiency": "|C ∩ K| / |C| over all analysed steps (NaN when no comm)",
        "barrier_wait_ns": "mean per step of |union of the wait spans [s_r, s_r + wait_r)| over matched calls",
        "transfer_ns": "mean per step sum of transfer_r over matched calls",
        "wait_uncertainty_ns": "clock uncertainty of the rank's wait figures (host residual)",
    },
    "steps": {
        "rank": "",
        "step": "",
        "start_ns": "step window: the host range widened to the end of the device work it launched",
        "end_ns": "",
        "step_time_ns": "end_ns - start_ns",
        "comm_ns": "|C|",
        "compute_ns": "|K|",
        "overlapped_ns": "|C ∩ K|",
        "exposed_comm_ns": "|C \\ K|",
        "barrier_wait_ns": "|union of the wait spans of the step's valid calls| (time spent waiting)",
        "transfer_ns": "",
        "host_start_ns": "host range of the step's marker (ProfilerStep, iteration, user range)",
        "host_end_ns": "",
        "phase": "serving iteration phase: prefill / decode / mixed / idle (null where the trace does not say)",
    },
    "stages": {
        "(canonical stages table)": "see ep_trace.schema STAGES, plus comm_ns, overlapped_ns, exposed_comm_ns, and tier "
        "('range' | 'family' | 'module' | 'cpu_op' | 'token': the detection tier that made the row, docs/metrics.md)",
    },
    "calls": {
        "match_id": "id of a matched collective instance",
        "collective": "",
        "key": "'seq' | 'comms_id' | 'ordinal' (how it was matched)",
        "step": "",
        "layer": "",
        "direction": "",
        "n_ranks": "ranks that took part",
        "last_rank": "the last arriver (straggler of this call)",
        "arrival_ns": "a = max_r s_r",
        "arrival_skew_ns": "max s - min s",
        "end_skew_ns": "max e - min e",
        "transfer_ns": "min_r transfer_r (wait-free transfer time)",
        "bytes_max": "max over ranks of max(sent, received) bytes",
        "link_class": "'intra_host' | 'inter_host' | 'unknown'",
        "logical_bytes": "sum over ranks of bytes sent (self-copies included)",
        "cross_rank_bytes": "sum over ranks of bytes sent to other ranks",
        "lateness_ns": "a - second-latest arrival",
        "expected_ranks": "group size (else world size)",
        "pg_name": "process group: the trace's name, else 'ranks:0,1' (its ranks), else '<default>' (the world)",
        "complete": "all ranks of the group are in the trace set",
        "causal": "no rank ends before a - clock tolerance",
        "valid": "complete and causal and n_ranks > 1: used in every wait figure",
        "bandwidth_gbps": "bytes_max / transfer_ns",
    },
    "call_ranks": {
        "match_id": "",
        "rank": "",
        "start_ns": "s_r",
        "end_ns": "e_r",
        "arrival_ns": "a_r: last start among the rank and the peers it exchanges rows with (all ranks when splits are unknown)",
        "waited_for": "the rank that arrived at a_r",
        "wait_ns": "a_r - s_r",
        "transfer_ns": "e_r - max(s_r, a_r)",
        "bytes_sent": "",
        "bytes_recv": "",
        "cross_rank_bytes_sent": "",
        "step": "",
        "uncertainty_ns": "clock residual of the rank's host: the uncertainty of wait_ns",
    },
    "wait_matrix": {
        "pg_name": "process group of the calls (waits are charged only between ranks of one group)",
        "waiter": "rank i",
        "waited_for": "rank j (the last arriver), a member of the group",
        "wait_ns": "total over the group's calls",
    },
    "group_stragglers": {
        "pg_name": "process group",
        "ranks": "its ranks in the matched calls",
        "matched_calls": "valid matched calls of the group",
        "wait_ns": "total wait of its ranks in its calls",
        "straggler": "the member the others waited for most (null: nobody waited)",
        "times_last": "the group's calls where the straggler arrived last",
        "induced_wait_ns": "the others' wait on it in the group's calls",
    },
    "stragglers": {
        "rank": "",
        "times_last": "calls where the rank arrived last",
        "induced_wait_ns": "wait of the others on it",
        "lateness_ns": "sum over its last arrivals of (its arrival - the second-last arrival)",
        "lateness_p50_ns": "P50 over steps of the per-step lateness (the ranking key)",
        "total_wait_ns": "its own wait on others",
    },
    "expert_load": {"step": "", "layer": "", "expert": "", "count": "n_e summed over source ranks"},
    "rank_load": {
        "step": "",
        "layer": "",
        "microbatch": "micro-batch / pipelined chunk",
        "call": "all-to-all ordinal when the layer is unknown, else 0",
        "rank": "",
        "recv_rows": "L_r",
        "send_rows": "",
    },
    "imbalance": {
        "step": "",
        "layer": "",
        "I_e": "max_e n_e / mean_e n_e",
        "I_r": "max_r L_r / mean_r L_r (receive side)",
        "I_r_send": "send side",
        "local_ratio": "trace(C)/sum(C)",
        "cross_node_ratio": "rows between hosts / sum(C)",
        "microbatch": "",
        "call": "",
        "n_e_max": "max_e n_e",
        "n_e_mean": "mean_e n_e",
        "L_max": "max_r L_r",
        "L_mean": "mean_r L_r",
    },
    "count_matrix": {"(canonical routing_matrix table)": ""},
    "split_violations": {
        "step": "",
        "call": "",
        "src": "",
        "dst": "",
        "sent": "rank src's send split to dst",
        "received": "rank dst's receive split from src",
    },
    "alpha_beta": {
        "link_class": "",
        "alpha_us": "",
        "beta_gbps": "",
        "r2": "",
        "n": "calls in the fit",
        "median_bytes": "median bytes_max of the class",
        "verdict": "'latency_bound' | 'bandwidth_bound' | 'insufficient_data'",
    },
    "host_stalls": {
        "rank": "",
        "step": "",
        "layer": "",
        "stage": "",
        "name": "blocking call",
        "start_ns": "",
        "end_ns": "",
        "stall_ns": "device idle while the host waits",
    },
    "clock": {
        "host": "",
        "offset_ns": "added to the host's times",
        "n_calls": "matched calls used",
        "aligned": "offset estimated from >= 8 matched calls (False: the recorded clock is kept)",
        "residual_ns": "spread after alignment (uncertainty of wait figures)",
    },
    "misaligned": {
        "pg_name": "process group (or Comms Id)",
        "step": "",
        "calls_per_rank": "'rank:count,...' or 'rank:collective,...'",
        "reason": "",
    },
    "intervals": {
        "rank": "",
        "step": "",
        "track": "'stage' | 'comm' | 'compute' | 'wait' | 'transfer' | 'exposed_comm'",
        "name": "",
        "start_ns": "",
        "end_ns": "",
    },
    "exposed_comm": {
        "rank": "",
        "step": "",
        "start_ns": "aligned clock",
        "end_ns": "aligned clock (every step: comm of the step not covered by its compute; lengths sum to steps.exposed_comm_ns)",
    },
    "replay": {
        "rank": "",
        "step": "",
        "measured_ns": "measured step length (ProfilerStep range)",
        "replayed_ns": "step length replayed from the dependency graph with the measured durations",
        "error_pct": "|replayed - measured| / measured, % (the model's error; max over ranks = replay.error_pct)",
    },
    "critical_path": {
        "step": "",
        "seq": "order of the segment along the path (0 = first in time)",
        "rank": "rank whose work or wait the segment is",
        "start_ns": "aligned clock",
        "end_ns": "aligned clock (segments tile the critical rank's step window)",
        "cause": "'compute' | 'copy' (device memcpy / memset) | 'transfer' | 'barrier_wait' | 'host_stall' | 'launch_gap' | 'queued' (device idle with its next work already launched) | 'unexplained'",
        "stage": "stage of the segment (null when outside every stage range)",
        "name": "collective / stage / reason",
    },
    "whatif": {
        "scenario": "'no_straggler' | 'balanced_routing' | 'full_overlap' | 'fp8_dispatch' | 'no_host_stalls' | 'no_launch_gaps' | 'fused_permute' | 'chunked_pipeline' (best k in chunks) | 'all' | 'placement' | 'node_local' (not part of 'all')",
        "chunks": "k of chunked_pipeline (null elsewhere)",
        "predicted_step_ns": "replayed baseline step length (median over steps of the mean over ranks) - saving_ns",
        "saving_ns": "median over steps of (replayed baseline step - re-simulated step), each the mean over ranks",
        "ranks": "ranks whose work the edit changes",
        "kept_work_ns": "the device work the edit keeps (min over steps of the mean over ranks of |K| less the "
        "stages it edits, the edited ranks' left out): predicted_step_ns may not be shorter (invariants)",
    },
    "topology": {
        "rank": "",
        "node": "node name (host, launcher node 'node<i>', or the --topology name)",
        "node_id": "dense node index, in order of each node's first rank",
        "source": "'override' (--topology) | 'launcher' (GROUP_RANK, SLURM_NODEID, LOCAL_WORLD_SIZE) | 'host' | 'assumed'",
    },
    "link_costs": {
        "link_class": "'same_rank' | 'same_node' | 'cross_node'",
        "alpha_us": "fixed cost of a call whose farthest peer is of this class, µs",
        "beta_gbps": "bandwidth of the class, GB/s",
        "alpha_source": "'fitted' (from the trace's all-to-alls) | 'default' (AnalysisConfig.link_defaults)",
        "beta_source": "'fitted' | 'default'",
        "r2": "r² of the joint fit over the (call, rank) transfers whose farthest class this is",
        "n": "(call, rank) transfers whose farthest class this is",
    },
    "link_bytes": {
        "layer": "",
        "direction": "'dispatch' | 'combine'",
        "link_class": "",
        "rows": "rows over pairs of this class, mean per step",
        "bytes": "rows x bytes per row, mean per step",
    },
    "ep_invariants": {
        "check": "'assignment_conservation' | 'ownership' | 'split_consistency'",
        "status": "'ok' | 'violated' | 'not_checked'",
        "checked": "units checked (routing decisions and dispatches; pairs; split pairs)",
        "violations": "units that break the invariant",
        "detail": "one line: what was compared, and the first violation",
    },
    "placement": {
        "scenario": "'current' (the recorded placement, or the contiguous default) | 'placement' | 'node_local'",
        "rank": "",
        "node": "",
        "experts": "expert ids the rank holds",
        "load": "rows routed to the rank, mean per step (summed over layers)",
        "cross_node_rows": "rows the rank sends to other nodes in dispatch, mean per step",
        "cross_node_bytes": "those rows x bytes per row",
        "recorded": "the current placement was recorded (False: the contiguous default was assumed)",
    },
    "breakdown": {
        "rank": "",
        "step": "",
        "compute_ns": "|K \\ C| in the step window: compute alone",
        "overlapped_comm_ns": "|C ∩ K|: communication hidden under compute",
        "exposed_comm_ns": "|C \\ (K ∪ W)|: transfer nothing hides (W = barrier-wait spans)",
        "barrier_wait_ns": "|W \\ K|: waiting inside a collective for the last peer",
        "copy_ns": "|M \\ (C ∪ K ∪ W)|: device memcpy / memset alone (M = copy activity)",
        "host_stall_ns": "|H \\ (C ∪ K ∪ W ∪ M)|: device idle while the host blocks (H = blocking host calls)",
        "idle_ns": "the rest of the step: nothing measured runs",
        "step_time_ns": "step window length = the sum of the six parts",
    },
    "top_kernels": {
        "rank": "",
        "name": "kernel (CPU ranks: compute op / comm range)",
        "stage": "EP stage holding most of its time (launch inside the stage's host range), None = outside stages",
        "total_ns": "total duration inside analysed steps",
        "count": "instances",
    },
    "op_stalls": {
        "rank": "CPU rank",
        "stage": "'permute' | 'unpermute'",
        "busy_ns": "sum of the stage's top-level op calls inside analysed steps",
        "stall_ns": "sum over stalled calls of (duration - the op's usual time): calls >= max(10 x usual, 1 ms), usual = min over ranks of the op's median in the stage",
        "stall_calls": "stalled calls",
        "top_op": "op name with the largest stall sum (null when none)",
    },
    "stage_coverage": {
        "rank": "",
        "step": "",
        "moe_ns": "|MoE time|: device work that got an MoE stage or lies in an MoE window (docs/metrics.md)",
        "covered_ns": "|the part of it that got a stage|",
        "unassigned_ns": "moe_ns - covered_ns",
        "share": "covered_ns / moe_ns",
        "range_ns": "time the range tier added (ep-trace / user / framework ranges)",
        "family_ns": "time the kernel families added over the ranges",
        "module_ns": "time the nn.Module frames added",
        "cpu_op_ns": "time the CPU ops added",
        "token_ns": "time the name tokens added (the five tiers add up to covered_ns)",
    },
    "unassigned_kernels": {
        "name": "kernel (or CPU op window piece) inside an MoE window that got no stage",
        "total_ns": "total over every rank and analysed step",
        "count": "instances",
        "guess": "stage of its nearest attributed neighbour in the window (the --stages snippet's stage)",
    },
    "top_ops": {
        "rank": "",
        "name": "CPU op",
        "stage": "as top_kernels (op start inside the stage's host range)",
        "total_ns": "inclusive duration (children included) inside analysed steps",
        "count": "instances",
    },
}


@dataclass(frozen=True)
class Finding:
    """One ranked finding of the bottleneck verdict.

    Attributes:
        kind: What kind of bottleneck.
        severity: ``'high' | 'medium' | 'low'``.
        title: One sentence a user reads first.
        est_saving_ns: Estimated step time saved per step by the remedy, ns.
        evidence: The numbers behind it (JSON-ready).
        remedy: What to do, in the domain's terms.
        ranks: Ranks concerned.
        layers: Layers concerned.
    """

    kind: str
    severity: str
    title: str
    est_saving_ns: int
    evidence: dict[str, Any]
    remedy: str
    ranks: tuple[int, ...] = ()
    layers: tuple[int, ...] = ()


@dataclass(frozen=True)
class Withheld:
    """A finding or a figure the analysis withheld because it breaks a physical invariant
    (:mod:`ep_trace.analysis.invariants`): never published, replaced by :meth:`line`.

    Attributes:
        what: ``'finding' | 'whatif' | 'rank_figures' | 'breakdown' | 'stage' | 'replay'``.
        name: The finding's kind, the what-if's scenario, the withheld columns or the stage.
        ranks: Ranks concerned (empty: the run as a whole).
        invariant: Name of the broken invariant (``invariants.INVARIANTS``).
        reason: Why, with the figures: ``'rank 0, step 1: compute 124 ms > step 112 ms'``.
    """

    what: str
    name: str
    ranks: tuple[int, ...]
    invariant: str
    reason: str

    def line(self) -> str:
        """One line for the terminal and the report."""
        on = f" (rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))})" if self.ranks else ""
        return f"withheld {self.what.replace('_', ' ')} {self.name}{on}: breaks {self.invariant}: {self.reason}"


@dataclass(frozen=True)
class Analysis:
    """Everything the analysis computed. Frames follow :data:`FRAME_DOCS`."""

    config: AnalysisConfig
    tables: TraceTables
    rank_summary: pl.DataFrame
    steps: pl.DataFrame
    stages: pl.DataFrame
    calls: pl.DataFrame
    call_ranks: pl.DataFrame
    wait_matrix: pl.DataFrame
    stragglers: pl.DataFrame
    expert_load: pl.DataFrame
    rank_load: pl.DataFrame
    imbalance: pl.DataFrame
    count_matrix: pl.DataFrame
    split_violations: pl.DataFrame
    alpha_beta: pl.DataFrame
    host_stalls: pl.DataFrame
    clock: pl.DataFrame
    intervals: pl.DataFrame
    findings: tuple[Finding, ...]
    detection_method: str
    hta_overlap: pl.DataFrame | None = None
    load_report: tuple[LoadIssue, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: (process group, step) sets whose collectives could not be matched safely (see FRAME_DOCS).
    misaligned: pl.DataFrame | None = None
    #: Exposed-comm intervals of every step (``intervals`` holds the representative step only).
    exposed_comm: pl.DataFrame | None = None
    #: Replay of every (rank, step) from the dependency graph (:mod:`ep_trace.analysis.replay`).
    replay: pl.DataFrame | None = None
    #: Critical path of every step (:mod:`ep_trace.analysis.critical_path`).
    critical_path: pl.DataFrame | None = None
    #: Simulated what-if edits of the graph (:mod:`ep_trace.analysis.whatif`); absent rows = not applicable.
    whatif: pl.DataFrame | None = None
    #: Per (rank, step) time breakdown whose parts sum to the step (see FRAME_DOCS, docs/metrics.md).
    breakdown: pl.DataFrame | None = None
    #: Top device kernels per rank by total time, with their stage.
    top_kernels: pl.DataFrame | None = None
    #: Top CPU ops per rank by inclusive time, with their stage.
    top_ops: pl.DataFrame | None = None
    #: Stalled op calls of CPU ranks' permute / unpermute stages (:mod:`ep_trace.analysis.op_stalls`).
    op_stalls: pl.DataFrame | None = None
    #: Per process group: its ranks, calls, wait and straggler (:func:`ep_trace.analysis.rank_tables.group_stragglers`).
    group_stragglers: pl.DataFrame | None = None
    #: Findings and figures withheld for breaking an invariant (:mod:`ep_trace.analysis.invariants`).
    withheld: tuple[Withheld, ...] = ()
    #: Each rank's node and how it was found (:mod:`ep_trace.analysis.topology`).
    topology: pl.DataFrame | None = None
    #: α–β per link class, fitted from the trace's transfers or the defaults (:mod:`ep_trace.analysis.link_cost`).
    link_costs: pl.DataFrame | None = None
    #: Each layer's dispatch / combine rows and bytes per link class, mean per step.
    link_bytes: pl.DataFrame | None = None
    #: The EP invariants the routing counts make checkable (:mod:`ep_trace.analysis.ep_invariants`).
    ep_invariants: pl.DataFrame | None = None
    #: Per rank: experts, load and cross-node traffic under the recorded placement and each proposal.
    placement: pl.DataFrame | None = None
    #: The proposed placements as data (``ep-trace analyze --propose-placement`` writes them).
    placement_proposals: tuple[PlacementProposal, ...] = ()
    #: Per (rank, step) MoE time covered by stages, by tier (:mod:`ep_trace.analysis.stage_coverage`).
    stage_coverage: pl.DataFrame | None = None
    #: Kernels inside MoE windows that got no stage, by name (largest first).
    unassigned_kernels: pl.DataFrame | None = None

    def summary(self) -> dict[str, Any]:
        """A JSON-ready dict (documented, versioned: ``schema_version``). See docs/summary.md."""
        from ep_trace.analysis.summary import build_summary

        return build_summary(self)
