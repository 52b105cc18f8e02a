"""Reference expert-parallel MoE workload (needs torch for everything but knobs and truth).

- :mod:`~ep_trace.workloads.moe`: the EP MoE layer (route -> permute -> count exchange -> token
  all_to_allv -> grouped expert GEMMs -> combine all_to_allv -> unpermute) and its dense reference.
- :mod:`~ep_trace.workloads.demo`: :func:`~ep_trace.workloads.demo.run_demo` (what ``ep-trace demo``
  runs); its knobs :class:`~ep_trace.workloads.config.DemoConfig` (no torch), its per-step inputs
  (tokens, routing bias) :mod:`~ep_trace.workloads.inputs`.
- :mod:`~ep_trace.workloads.expert_slots`: any placement (replicas included) as physical expert slots.
- :mod:`~ep_trace.workloads.links`: injected link delays, emulated nodes and their cross-node link (no torch).
- :mod:`~ep_trace.workloads.launcher`: torch.multiprocessing spawn + process group on loopback.
- :mod:`~ep_trace.workloads.knobs`: ``--skew`` (routing workloads) / ``--straggler`` parsing (no torch).
- :mod:`~ep_trace.workloads.truth`: routing ground truth of a demo directory from its sidecars (no torch).
"""
