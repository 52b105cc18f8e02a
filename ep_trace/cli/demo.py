"""``ep-trace demo`` (run the reference EP MoE workload under the Tracer) and ``ep-trace version``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from ep_trace.cli.app import app, console, err_console

if TYPE_CHECKING:
    from ep_trace.workloads.demo import DemoConfig

_LABELS = {"start": "starting ranks", "step": "traced steps", "write": "writing traces"}


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", help="Trace directory to write.")] = Path("demo_traces"),
    ranks: Annotated[int, typer.Option("--ranks", help="EP world size (processes).")] = 4,
    experts: Annotated[
        int, typer.Option("--experts", help="Routed experts (without --placement a multiple of --ranks).")
    ] = 8,
    top_k: Annotated[int, typer.Option("--top-k", help="Experts per token.")] = 2,
    hidden: Annotated[int, typer.Option("--hidden", help="Hidden size.")] = 256,
    tokens: Annotated[int, typer.Option("--tokens", help="Tokens per rank per step.")] = 512,
    layers: Annotated[int, typer.Option("--layers", help="MoE layers per step.")] = 2,
    steps: Annotated[int, typer.Option("--steps", help="Traced steps.")] = 8,
    skew: Annotated[
        str,
        typer.Option(
            "--skew",
            help="Routing workload: uniform | zipf:EXP | hot:EXPERT:SHARE | hotset:E1,E2,...:SHARE (those experts "
            "share SHARE of all assignments) | hotrank:RANK:SHARE (every expert of RANK) | spread:N:SHARE (N hot "
            "experts spread over the ids) | rotate:N:SHARE (N hot experts moving every step) | cold-rank:RANK "
            "(RANK's experts get no tokens) | affinity:OFFSET:SHARE (rank r's tokens prefer rank r+OFFSET's experts) "
            "| burst:EVERY:SPEC (SPEC on every EVERY-th step, uniform between). Docs: docs/capture.md.",
        ),
    ] = "uniform",
    straggler: Annotated[
        Optional[str],
        typer.Option("--straggler", help="RANK:MS: that rank is MS ms late in each of its expert stages."),
    ] = None,  # noqa: UP045 - typer needs Optional on 3.10
    chunks: Annotated[int, typer.Option("--chunks", help="Pipelined dispatch/GEMM/combine chunks.")] = 1,
    alt_chunks: Annotated[
        int,
        typer.Option(
            "--alt-chunks", help="Odd steps run this many chunks instead (an A/B of pipelining in one run; 0 = off)."
        ),
    ] = 0,
    alt_skew: Annotated[
        Optional[str],
        typer.Option("--alt-skew", help="Odd steps route with this skew instead (an A/B of routing in one run)."),
    ] = None,  # noqa: UP045 - typer needs Optional on 3.10
    placement: Annotated[
        Optional[Path],
        typer.Option(
            "--placement",
            help='Placement file {"num_experts": E, "ranks": \\[\\[expert ids of rank 0], ...]} (an id on several '
            "ranks is a replica; its tokens go to the replica on the source's node, then split evenly), e.g. what "
            "`ep-trace analyze --propose-placement` writes. Default: contiguous blocks of E/W experts.",
        ),
    ] = None,  # noqa: UP045 - typer needs Optional on 3.10
    alt_placement: Annotated[
        Optional[Path],
        typer.Option(
            "--alt-placement", help="Odd steps run this placement file instead (an A/B of placements in one run)."
        ),
    ] = None,  # noqa: UP045 - typer needs Optional on 3.10
    nodes: Annotated[
        int,
        typer.Option(
            "--nodes",
            help="Emulated nodes: the ranks in N contiguous blocks (N divides --ranks); each rank's host is "
            "node<n> in its trace and sidecar.",
        ),
    ] = 1,
    cross_node_latency_ms: Annotated[
        float,
        typer.Option(
            "--cross-node-latency-ms",
            help="Latency of each all-to-all call that moves bytes between emulated nodes (ms; needs --nodes).",
        ),
    ] = 0.0,
    cross_node_gbps: Annotated[
        float,
        typer.Option(
            "--cross-node-gbps",
            help="Each rank's emulated NIC for cross-node bytes, Gbit/s: a call waits max(sent, received) "
            "cross-node bytes / this (0 = unlimited; needs --nodes).",
        ),
    ] = 0.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of weights, tokens and routing.")] = 0,
    backend: Annotated[str, typer.Option("--backend", help="gloo (CPU) or nccl (one GPU per rank).")] = "gloo",
    backward: Annotated[
        bool, typer.Option("--backward", help="Also run the backward pass (needs --chunks 1).")
    ] = False,
    link_latency_ms: Annotated[
        float,
        typer.Option(
            "--link-latency-ms", help="Fixed delay added to every all-to-all (a stand-in for a cross-node hop)."
        ),
    ] = 0.0,
    with_stack: Annotated[
        bool,
        typer.Option(
            "--with-stack", help="Record Python frames (with_stack=True, vLLM's and SGLang's profiler default)."
        ),
    ] = False,
    pin_cores: Annotated[
        bool,
        typer.Option("--pin-cores", help="Pin rank r to core r mod cores: each rank owns a core as it would a GPU."),
    ] = False,
    allocator: Annotated[
        str,
        typer.Option(
            "--allocator",
            help="Ranks' allocator: auto (jemalloc when installed, else glibc), jemalloc or glibc. jemalloc reuses "
            "freed buffers as a GPU caching allocator does; glibc faults each large op's output in again.",
        ),
    ] = "auto",
    huge_pages: Annotated[
        bool,
        typer.Option(
            "--huge-pages/--no-huge-pages",
            help="With glibc malloc: back its mappings with transparent huge pages (fewer page faults).",
        ),
    ] = True,
    comm_priority: Annotated[
        str,
        typer.Option(
            "--comm-priority",
            help="gloo's transfer threads: auto (real-time priority where permitted), realtime or normal. On "
            "busy shared cores a normal-priority transfer waits behind compute, which a GPU's transfers never do.",
        ),
    ] = "auto",
    sweep: Annotated[
        Optional[list[str]],
        typer.Option(
            "--sweep",
            help="KNOB=V1,V2,...: one run per value into OUT/KNOB_V, plus OUT/sweep.html and sweep.json. Knobs: "
            "tokens, top_k, hidden, chunks, ranks (the fitted x: the first --sweep); skew, straggler, link_latency_ms "
            "may vary alongside (repeat --sweep with as many values).",
        ),
    ] = None,  # noqa: UP045 - typer needs Optional on 3.10
) -> None:
    """Run a real multi-rank EP MoE layer on gloo/CPU under ep_trace.Tracer and write its traces.

    Examples:
      ep-trace demo --out demo_traces
      ep-trace demo --out skewed --skew zipf:1.2 --straggler 2:30
      ep-trace demo --out sweep --sweep tokens=128,512,2048 --link-latency-ms 20
      ep-trace demo --out ab --ranks 2 --experts 4 --skew hot:1:0.45 --alt-placement proposal.json
      ep-trace demo --out nodes --nodes 2 --cross-node-latency-ms 2 --cross-node-gbps 10 --skew affinity:2:0.8
    """

    from ep_trace.workloads.demo import DemoConfig

    cfg = DemoConfig(
        ranks=ranks, experts=experts, top_k=top_k, hidden=hidden, tokens=tokens, layers=layers,
        steps=steps, skew=skew, straggler=straggler, chunks=chunks, alt_chunks=alt_chunks, seed=seed, backend=backend,
        backward=backward, link_latency_ms=link_latency_ms, alt_skew=alt_skew, with_stack=with_stack,
        pin_cores=pin_cores, allocator=allocator, huge_pages=huge_pages, comm_priority=comm_priority,
        placement_file=None if placement is None else str(placement),
        alt_placement_file=None if alt_placement is None else str(alt_placement), nodes=nodes,
        cross_node_latency_ms=cross_node_latency_ms, cross_node_gbps=cross_node_gbps,
    )  # fmt: skip
    if sweep:
        _demo_sweep(cfg, sweep, out)
        return
    trace_dir = _progress_runner(cfg, out)
    _report(trace_dir, cfg)


def _progress_runner(cfg: DemoConfig, out: Path) -> Path:
    """``run_demo`` with a transient progress bar on stderr."""
    from contextlib import ExitStack

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from ep_trace.workloads.demo import run_demo

    with ExitStack() as stack:
        bars: list[Progress] = []
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if not bars:
                bars.append(stack.enter_context(Progress(
                    TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err_console, transient=True,
                )))  # fmt: skip
            if stage not in tasks:
                tasks[stage] = bars[0].add_task(_LABELS.get(stage, stage), total=total)
            bars[0].update(tasks[stage], completed=done, total=total)

        return run_demo(cfg, out, progress=progress)


def _report(trace_dir: Path, cfg: DemoConfig) -> None:
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


#: --sweep knob -> (DemoConfig field, value parser); the first four are sweep knobs (a fit's x).
_SWEEPABLE = {
    "tokens": ("tokens", int),
    "top_k": ("top_k", int),
    "hidden": ("hidden", int),
    "chunks": ("chunks", int),
    "ranks": ("ranks", int),
    "ep_size": ("ranks", int),
    "skew": ("skew", str),
    "straggler": ("straggler", str),
    "link_latency_ms": ("link_latency_ms", float),
}
#: DemoConfig field -> the sweep analysis' knob name.
_AS_KNOB = {"tokens": "tokens", "top_k": "top_k", "hidden": "hidden", "chunks": "chunks", "ranks": "ep_size"}


def parse_sweep(items: list[str]) -> list[tuple[str, list[Any]]]:
    """``['tokens=128,512', 'skew=uniform,hot:0:0.4']`` -> ``[('tokens', [128, 512]), ('skew', [...])]``.

    Raises:
        ConfigError: naming ``--sweep`` for a bad form, an unknown knob, a bad value, lists of different
            lengths, or a first knob that cannot be the fitted x.
    """
    from ep_trace.errors import ConfigError

    out: list[tuple[str, list[Any]]] = []
    for item in items:
        name, sep, vals = item.partition("=")
        key = name.strip().lower().replace("-", "_")
        if not sep or not vals.strip():
            raise ConfigError(f"--sweep: expected KNOB=V1,V2,... (e.g. tokens=128,512,2048), got {item!r}")
        if key not in _SWEEPABLE:
            raise ConfigError(f"--sweep: unknown knob {name!r}; use one of {', '.join(_SWEEPABLE)}")
        field, cast = _SWEEPABLE[key]
        try:
            values = [cast(v.strip()) for v in vals.split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"--sweep: {name}: values must be numbers, got {vals!r}") from None
        if field in [f for f, _ in out]:
            raise ConfigError(f"--sweep: {name} is given twice")
        out.append((field, values))
    if out[0][0] not in _AS_KNOB:
        raise ConfigError(
            f"--sweep: the first knob is the fitted x and must be one of tokens, top_k, hidden, chunks, ranks; "
            f"got {out[0][0]} (vary it alongside, in a second --sweep)"
        )
    lengths = {len(v) for _, v in out}
    if len(lengths) != 1 or min(lengths) < 2:
        raise ConfigError(
            "--sweep: every swept knob needs the same number of values, at least 2 (got "
            + ", ".join(f"{f}: {len(v)}" for f, v in out)
            + ")"
        )
    return out


def _dir_name(pairs: list[tuple[str, Any]]) -> str:
    text = "-".join(f"{f}_{v}" for f, v in pairs)
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


def _demo_sweep(base: DemoConfig, items: list[str], out: Path) -> None:
    """One demo run per swept value into ``out/<knob>_<value>``, each with summary.json + run.yaml, then the sweep."""
    import dataclasses

    from ep_trace import load
    from ep_trace.analysis.run_record import run_record
    from ep_trace.analysis.sweep import analyze_sweep, sweep_run
    from ep_trace.cli.outputs import write_json, write_yaml
    from ep_trace.cli.sweep import print_sweep, write_sweep_outputs
    from ep_trace.workloads.demo import DemoConfig as _Cfg

    spec = parse_sweep(items)
    n = len(spec[0][1])
    configs = []
    for i in range(n):  # validate every configuration before the first (slow) run
        pairs = [(f, vals[i]) for f, vals in spec]
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(_Cfg) if f.init}
        configs.append((pairs, _Cfg(**{**fields, **dict(pairs)})))
    runs = []
    dirs = []
    for pairs, cfg in configs:
        d = _progress_runner(cfg, out / _dir_name(pairs))
        analysis = load(d)
        workload = cfg.workload_meta()
        rec = run_record(analysis, d.name, [str(d)], workload)
        write_json(analysis.summary(), d / "summary.json")
        write_yaml(rec, d / "run.yaml")
        runs.append(sweep_run(analysis, d.name, workload, rec))
        dirs.append(str(d))
        from ep_trace.cli import printable

        console.print(
            f"wrote {printable(str(d))} ({', '.join(f'{f}={v}' for f, v in pairs)})", markup=False, highlight=False
        )
    result = analyze_sweep(runs, by=_AS_KNOB[spec[0][0]])
    print_sweep(result)
    write_sweep_outputs(result, out / "sweep.html", out / "sweep.json", None, dirs)


@app.command()
def version() -> None:
    """Print the ep-trace version."""
    from ep_trace import __version__

    console.print(__version__)
