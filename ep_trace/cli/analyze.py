"""`ep-trace analyze`: ingest + analyze + HTML report, with a progress bar and a terminal summary."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Optional, cast

import typer

from ep_trace.cli.app import app, console, err_console
from ep_trace.errors import ConfigError

if TYPE_CHECKING:
    from ep_trace.analysis import Analysis
    from ep_trace.analysis.config import TopologySpec

__all__ = [
    "analyze_cmd",
    "parse_steps",
    "check_format",
    "events_home",
    "progress_bar",
    "write_run_record",
    "engine_executor",
]


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """``'2:5'`` -> ``(2, 5)``, ``'3'`` -> ``(3, 3)``, ``None`` -> ``None``.

    Raises:
        ConfigError: naming ``--steps`` when the text is not ``FIRST:LAST`` with 0 <= FIRST <= LAST.
    """
    if text is None:
        return None
    parts = text.split(":")
    try:
        if len(parts) == 1:
            first = last = int(parts[0])
        elif len(parts) == 2:
            first, last = int(parts[0]), int(parts[1])
        else:
            raise ValueError(text)
    except ValueError:
        raise ConfigError(f"--steps: expected FIRST:LAST or N (e.g. 2:5), got {text!r}") from None
    if first < 0 or last < first:
        raise ConfigError(f"--steps: need 0 <= FIRST <= LAST, got {text!r}")
    return first, last


def check_format(fmt: str) -> Literal["auto", "kineto", "nsys"]:
    """Validate ``--format`` of the analysis commands (the formats a user exports: no ``cupti``)."""
    from ep_trace.parsers.dispatch import check_format as check

    return cast(Literal["auto", "kineto", "nsys"], check(fmt, ("auto", "kineto", "nsys")))


def events_home(scratch: contextlib.ExitStack, cache: bool) -> bool | Path:
    """Where a command keeps the parsed events: the ingest cache (``True``), or with ``--no-cache`` a
    scratch directory that ``scratch`` removes when the command ends. Either way the events go to
    disk as they are parsed and are read back a block of ranks at a time (bounded memory at any
    number of ranks, docs/scale.md)."""
    return True if cache else Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="ep-trace-")))


@contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Callable[[str, int, int], None] | None]:
    """A rich progress display on stderr fed by ``progress(stage, done, total)`` callbacks."""
    if not enabled or not err_console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description:<12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=max(total, 1))
            bar.update(tasks[stage], completed=done, total=max(total, 1))

        yield update


@contextmanager
def engine_executor(engine: str, jobs: int, address: str | None) -> Iterator[Executor | None]:
    """The executor of ``--engine`` / ``--jobs`` / ``--address`` (None: local), shut down on exit.

    Raises:
        ConfigError: naming the option (``--jobs`` < 1, unknown engine, Ray not installed).
    """
    from ep_trace.parsers.engines import make_executor

    if jobs < 1:
        raise ConfigError(f"--jobs: must be >= 1, got {jobs}")
    executor = make_executor(engine, jobs, address)
    try:
        yield executor
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


@app.command("analyze")
def analyze_cmd(
    dirs: list[Path] = typer.Argument(
        ...,
        help="Trace directories (or files) of one job: Kineto rank*.pt.trace.json.gz and/or Nsight *.sqlite, with optional rank*.ep.jsonl sidecars.",
    ),
    out: Path = typer.Option(Path("report.html"), "-o", "--out", help="HTML report to write."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the JSON summary (docs/summary.md) here."),
    fmt: str = typer.Option("auto", "--format", help="Input format: auto, kineto or nsys."),
    steps: Optional[str] = typer.Option(
        None,
        "--steps",
        help="Analyze only steps FIRST:LAST (inclusive), e.g. 2:5; 0 = the whole trace where a user range would be the step.",
    ),
    stages: Optional[Path] = typer.Option(
        None,
        "--stages",
        help="TOML file of extra stage names: [[preset]] host ranges and [[kernel]] kernel rows (added to the built-in table).",
    ),
    keep_going: bool = typer.Option(
        False, "--keep-going", help="Skip unreadable ranks (named in the report) instead of stopping."
    ),
    hta_compatible: bool = typer.Option(
        False, "--hta-compatible", help="Also compute overlap exactly as HolisticTraceAnalysis does."
    ),
    with_hta: bool = typer.Option(
        False, "--with-hta", help="Add HTA's temporal and idle-time breakdowns (needs: pip install 'ep-trace\\[hta]')."
    ),
    rank_map: Optional[list[str]] = typer.Option(
        None,
        "--rank-map",
        help="Rank of a file: R=PATH, pid:PID=R (nsys file with several processes) or a file of such lines; repeatable. Beats every rank found in the files.",
    ),
    jobs: int = typer.Option(
        1,
        "-j",
        "--jobs",
        help="Cores to use: worker processes at most for reading rank files (fewer when the files are too small to repay one), and polars threads.",
    ),
    engine: str = typer.Option("local", "--engine", help="Where rank files are decoded: local or ray (docs/scale.md)."),
    address: Optional[str] = typer.Option(
        None, "--address", help="Ray cluster address for --engine ray (default: RAY_ADDRESS or a new local Ray)."
    ),
    cache: bool = typer.Option(
        True,
        "--cache/--no-cache",
        help="Reuse the parsed tables of an unchanged trace directory ($EP_TRACE_CACHE_DIR or ~/.cache/ep-trace); --no-cache always parses (into a scratch directory removed on exit) and keeps no cache.",
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No terminal summary."),
    record: Optional[Path] = typer.Option(
        None, "--record", help="Also write the run record (docs/run_record.md) as YAML here."
    ),
    topology: Optional[str] = typer.Option(
        None,
        "--topology",
        help="Which ranks share a node when the traces do not say: ranks-per-node=N, or a file with one node per line ('node0: 0-7'; docs/placement.md).",
    ),
    propose_placement: Optional[Path] = typer.Option(
        None,
        "--propose-placement",
        help="Also write the proposed expert placement here as JSON (ep-trace demo --placement takes it), with each proposal and an SGLang --init-expert-location file beside it.",
    ),
    routing: Optional[list[Path]] = typer.Option(
        None,
        "--routing",
        help="A framework's routing dump (Megatron-Core router_trace_rank*.jsonl, SGLang expert_distribution_recorder_*.pt, a vLLM EPLB state .pt) or a directory of them, for traces without ep-trace sidecars; repeatable.",
    ),
    replica_budget: int = typer.Option(
        1, "--replica-budget", help="Extra expert replicas each rank may hold in the placement proposals."
    ),
) -> None:
    """Analyze EP MoE traces and write a self-contained HTML report.

    Examples:

      ep-trace analyze demo_traces -o report.html --json summary.json

      ep-trace analyze node0/ node1/ --steps 2:5 --keep-going

      ep-trace analyze run.sqlite --format nsys -o nsys_report.html

      ep-trace analyze nsys_job/ --rank-map 0=nsys_job/report_a_3000.sqlite --rank-map 1=nsys_job/report_b_3010.sqlite

      ep-trace analyze tables/   (an ep-trace ingest output directory: no parsing)

      ep-trace analyze big_job/ --jobs 8   or   --engine ray --address auto
    """
    from ep_trace.parsers.polars_threads import configure_threads

    configure_threads(jobs)  # before anything loads polars: --jobs N is N cores (parsers/polars_threads.py)
    from ep_trace.analysis.config import AnalysisConfig
    from ep_trace.cli import printable
    from ep_trace.cli.output_guard import Output, check_outputs
    from ep_trace.cli.outputs import build_report, for_display, placement_paths
    from ep_trace.cli.rank_map import parse_rank_map
    from ep_trace.reports.terminal import summary_renderables

    if stages is not None and not stages.is_file():
        raise ConfigError(f"--stages: {stages}: no such file; pass a TOML file of stage-name patterns")
    if replica_budget < 0:
        raise ConfigError(f"--replica-budget: must be >= 0, got {replica_budget}")
    config = AnalysisConfig(
        steps=parse_steps(steps),
        stage_presets=stages,
        hta_compatible=hta_compatible,
        topology=parse_topology(topology),
        replica_budget=replica_budget,
    )
    fmt = check_format(fmt)
    check_outputs(
        [*dirs, *([stages] if stages is not None else []), *(routing or ())],
        Output("-o", out),
        Output("--json", json_out) if json_out is not None else None,
        Output("--record", record) if record is not None else None,
        *(
            Output("--propose-placement", p)
            for p in (placement_paths(propose_placement).values() if propose_placement is not None else ())
        ),
    )
    with (
        contextlib.ExitStack() as scratch,
        progress_bar() as progress,
        engine_executor(engine, jobs, address) as executor,
    ):
        analysis = build_report(
            dirs,
            out,
            json_path=json_out,
            config=config,
            fmt=fmt,  # type: ignore[arg-type]
            on_error="skip" if keep_going else "raise",
            progress=progress,
            with_hta=with_hta,
            rank_map=parse_rank_map(rank_map),
            jobs=jobs,
            executor=executor,
            cache=events_home(scratch, cache),
            placement_path=propose_placement,
            routing=routing or (),
        )
    if not quiet:
        for r in summary_renderables(for_display(analysis, escape_controls=True)):
            console.print(r)
    console.print(f"report: {printable(str(out))}", markup=False, highlight=False, soft_wrap=True)
    if json_out is not None:
        console.print(f"summary: {printable(str(json_out))}", markup=False, highlight=False, soft_wrap=True)
    if propose_placement is not None:
        console.print(placement_message(analysis, propose_placement), markup=False, highlight=False, soft_wrap=True)
    if record is not None:
        write_run_record(for_display(analysis), dirs, record)
        console.print(f"run record: {printable(str(record))}", markup=False, highlight=False, soft_wrap=True)


def parse_topology(value: str | None) -> TopologySpec | None:
    """``--topology``: ``ranks-per-node=N`` or a topology file (read here; parsed by the analysis)."""
    from ep_trace.analysis.config import TopologySpec

    if value is None:
        return None
    path = Path(value)
    text = None
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--topology {value}: cannot read the file ({exc}); pass a UTF-8 text file") from None
    return TopologySpec.parse(value, text)


def placement_message(analysis: Analysis, path: Path) -> str:
    """What ``--propose-placement`` wrote: the chosen proposal, its simulated effect, and how to run it."""
    from ep_trace.cli import printable
    from ep_trace.cli.outputs import placement_paths
    from ep_trace.reports.placement_files import best_proposal, sglang_redundant
    from ep_trace.reports.units import fmt_ns

    best = best_proposal(analysis.placement_proposals, analysis.whatif)
    assert best is not None  # write_placement refused otherwise
    row = analysis.whatif.filter(analysis.whatif["scenario"] == best.scenario) if analysis.whatif is not None else None
    effect = ""
    if row is not None and row.height:
        sav = int(row["saving_ns"][0])
        effect = (
            f", predicted step {fmt_ns(int(row['predicted_step_ns'][0]))} ({fmt_ns(sav)} saved per step)"
            if sav > 0
            else ", predicted not to shorten the step"
        )
    sg = placement_paths(path)["sglang"]
    return (
        f"placement: {printable(str(path))} ({best.scenario}{effect}); run it with ep-trace demo --placement, or SGLang "
        f"--init-expert-location {printable(str(sg))} --ep-num-redundant-experts {sglang_redundant(best)}"
    )


def write_run_record(analysis: Analysis, dirs: list[Path], path: Path) -> None:
    """Write the run record of ``analysis`` (workload knobs from the first directory's sidecar)."""
    from ep_trace.analysis.run_record import run_record
    from ep_trace.cli.outputs import write_yaml
    from ep_trace.parsers.sidecar import read_workload

    workload = next((w for w in (read_workload(d) for d in dirs) if w is not None), None)
    label = ", ".join(d.name or str(d) for d in dirs)
    write_yaml(run_record(analysis, label, [str(d) for d in dirs], workload), path)
