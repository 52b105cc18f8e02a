"""Present layer: HTML report, comparison, annotated traces and terminal summary from an ``Analysis``.

Renders :class:`ep_trace.analysis.result.Analysis` (never a trace format, never the parsers); the
CLI (``ep_trace.cli.outputs``) writes the files. Entry points:

* :func:`ep_trace.reports.html.render_report` — the self-contained HTML page of an analysis;
* the figures, one plotly figure per function: :mod:`~ep_trace.reports.stage_figures`,
  :mod:`~ep_trace.reports.timeline`, :mod:`~ep_trace.reports.routing_figures`,
  :mod:`~ep_trace.reports.comm_figures`, :mod:`~ep_trace.reports.breakdown_figures`;
* :func:`ep_trace.reports.compare.compare_runs` / :func:`~ep_trace.reports.compare.digest_analysis`;
* :func:`ep_trace.reports.gate.gate_lines` / :func:`~ep_trace.reports.gate.gate_to_dict` — the regression gate
  of ``compare --fail-on-regression`` (:mod:`ep_trace.analysis.regression_gate`), worded;
* :func:`ep_trace.reports.annotate.annotated_traces` — Perfetto traces with analysis tracks (bytes per rank);
* :func:`ep_trace.reports.terminal.summary_renderables` — the rich terminal summary;
* :func:`ep_trace.reports.hta_section.hta_section` — ``--with-hta``.
"""

from __future__ import annotations
