"""``ep-trace demo`` (run the reference EP MoE workload under the Tracer) and ``ep-trace version``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ep_trace.cli.app import app, console, err_console

_LABELS = {"start": "starting ranks", "step": "traced steps", "write": "writing traces"}


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", help="Trace directory to write.")] = Path("demo_traces"),
    ranks: Annotated[int, typer.Option("--ranks", help="EP world size (processes).")] = 4,
    experts: Annotated[int, typer.Option("--experts", help="Routed experts (a multiple of --ranks).")] = 8,
    top_k: Annotated[int, typer.Option("--top-k", help="Experts per token.")] = 2,
    hidden: Annotated[int, typer.Option("--hidden", help="Hidden size.")] = 256,
    tokens: Annotated[int, typer.Option("--tokens", help="Tokens per rank per step.")] = 512,
    layers: Annotated[int, typer.Option("--layers", help="MoE layers per step.")] = 2,
    steps: Annotated[int, typer.Option("--steps", help="Traced steps.")] = 3,
    skew: Annotated[str, typer.Option("--skew", help="uniform | zipf:EXP | hot:EXPERT:SHARE")] = "uniform",
    straggler: Annotated[
        Optional[str],
        typer.Option("--straggler", help="RANK:MS: that rank is MS ms late in each of its expert stages."),
    ] = None,  # noqa: UP045 - typer needs Optional on 3.10
    chunks: Annotated[int, typer.Option("--chunks", help="Pipelined dispatch/GEMM/combine chunks.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Seed of weights, tokens and routing.")] = 0,
    backend: Annotated[str, typer.Option("--backend", help="gloo (CPU) or nccl (one GPU per rank).")] = "gloo",
    backward: Annotated[
        bool, typer.Option("--backward", help="Also run the backward pass (needs --chunks 1).")
    ] = False,
) -> None:
    """Run a real multi-rank EP MoE layer on gloo/CPU under ep_trace.Tracer and write its traces.

    Examples:
      ep-trace demo --out demo_traces
      ep-trace demo --out skewed --skew zipf:1.2 --straggler 2:30
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from ep_trace.workloads.demo import DemoConfig, run_demo

    cfg = DemoConfig(
        ranks=ranks, experts=experts, top_k=top_k, hidden=hidden, tokens=tokens, layers=layers,
        steps=steps, skew=skew, straggler=straggler, chunks=chunks, seed=seed, backend=backend, backward=backward,
    )  # fmt: skip
    from contextlib import ExitStack

    with ExitStack() as stack:
        bars: list[Progress] = []
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if not bars:  # started on the first report, so that a bad --out prints one clean line
                bars.append(stack.enter_context(Progress(
                    TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err_console, transient=True,
                )))  # fmt: skip
            if stage not in tasks:
                tasks[stage] = bars[0].add_task(_LABELS.get(stage, stage), total=total)
            bars[0].update(tasks[stage], completed=done, total=total)

        trace_dir = run_demo(cfg, out, progress=progress)
    console.print(
        f"wrote {cfg.ranks} ranks x {cfg.steps} steps to {trace_dir}", markup=False, highlight=False, soft_wrap=True
    )
    # The demo ends where a user's own run would: ingest + analyze + report beside the traces.
    from ep_trace.cli.outputs import build_report
    from ep_trace.reports.terminal import summary_renderables

    report, summary = trace_dir / "report.html", trace_dir / "summary.json"
    analysis = build_report(trace_dir, report, json_path=summary)
    for r in summary_renderables(analysis):
        console.print(r)
    console.print(f"report: {report}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"summary: {summary}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def version() -> None:
    """Print the ep-trace version."""
    from ep_trace import __version__

    console.print(__version__)
