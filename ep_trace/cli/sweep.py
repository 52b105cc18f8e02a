"""`ep-trace sweep RUN...`: several runs of one job that differ in one knob, explained by one curve."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from ep_trace.cli.app import app, console
from ep_trace.errors import BadInputError, ConfigError

if TYPE_CHECKING:
    from ep_trace.analysis.sweep import SweepResult, SweepRun

__all__ = ["sweep_cmd", "parse_labels", "load_sweep_run", "run_sweep", "print_sweep"]

_LABEL_KNOBS = ("tokens", "top_k", "hidden", "ep_size", "dtype", "chunks", "experts", "moe_layers")


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_labels(items: Sequence[str], runs: Sequence[Path]) -> dict[Path, dict[str, Any]]:
    """``RUN=knob:value`` options -> ``{run path: {knob: value}}``; RUN is a path as given or its name.

    Raises:
        ConfigError: naming ``--label`` for a bad form, an unknown knob or a RUN that is not among the runs.
    """
    out: dict[Path, dict[str, Any]] = {}
    for item in items:
        run, sep, rest = item.partition("=")
        knob, sep2, value = rest.partition(":")
        knob = knob.strip().replace("-", "_")
        if not sep or not sep2 or not run or not value:
            raise ConfigError(f"--label: expected RUN=KNOB:VALUE (e.g. runs/a=tokens:512), got {item!r}")
        if knob not in _LABEL_KNOBS:
            raise ConfigError(f"--label: unknown knob {knob!r} in {item!r}; use one of {', '.join(_LABEL_KNOBS)}")
        hits = [p for p in runs if str(p) == run or p.name == run or str(p).rstrip("/") == run.rstrip("/")]
        if not hits:
            raise ConfigError(f"--label: {run!r} is not one of the runs given ({', '.join(str(p) for p in runs)})")
        for p in hits:
            out.setdefault(p, {})[knob] = _value(value)
    return out


def load_sweep_run(
    path: Path, fmt: str = "auto", on_error: str = "raise", label: str | None = None
) -> tuple[SweepRun, dict[str, Any] | None]:
    """One run of a sweep from a trace directory (its run record included) or a saved summary JSON.

    Raises:
        BadInputError: unreadable JSON or not an ep-trace summary (naming the file).
    """
    import orjson

    from ep_trace import load
    from ep_trace.analysis.run_record import run_record
    from ep_trace.analysis.sweep import sweep_run, sweep_run_from_summary

    name = label or path.name or str(path)
    if path.is_file() and path.suffix == ".json":
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise BadInputError(
                f"{path}: not valid JSON ({exc}); pass a summary written by 'ep-trace analyze --json' or a trace directory"
            ) from None
        return sweep_run_from_summary(data, name), None
    from ep_trace.parsers.sidecar import read_workload

    analysis = load(path, format=fmt, on_error=on_error)  # type: ignore[arg-type]
    workload = read_workload(path)
    record = run_record(analysis, name, [str(path)], workload)
    return sweep_run(analysis, name, workload, record), record


def run_sweep(
    paths: Sequence[Path],
    labels: dict[Path, dict[str, Any]] | None = None,
    by: str | None = None,
    fmt: str = "auto",
    on_error: str = "raise",
    progress: Callable[[str, int, int], None] | None = None,
) -> SweepResult:
    """Load every run, apply the ``--label`` knob values, and analyse the sweep (no files written)."""
    from ep_trace.analysis.sweep import analyze_sweep, with_knobs

    names = [p.name or str(p) for p in paths]
    # two runs called "tokens_128" in different parents: label them by their full path instead
    use_full = len(set(names)) != len(names)
    runs = []
    for i, p in enumerate(paths):
        if progress is not None:
            progress("runs", i, len(paths))
        run, _ = load_sweep_run(p, fmt, on_error, str(p) if use_full else None)
        if labels and p in labels:
            run = with_knobs(run, labels[p])
        runs.append(run)
    if progress is not None:
        progress("runs", len(paths), len(paths))
    return analyze_sweep(runs, by=by)


def print_sweep(result: SweepResult) -> None:
    """The sweep's verdict and main fits on the terminal."""
    from rich.table import Table
    from rich.text import Text

    from ep_trace.cli.outputs import display_safe
    from ep_trace.reports.units import fmt_ns

    result = display_safe(result)  # run labels and knob values come from paths and summaries
    v = result.verdict
    if v is None:
        why = next((n for n in result.notes if n.startswith("no verdict")), "no verdict")
        console.print(why, markup=False, highlight=False, soft_wrap=True)
    else:
        console.print(f"verdict: {v.kind}: {v.title}", markup=False, highlight=False, soft_wrap=True)
        console.print(f"remedy: {v.remedy}", markup=False, highlight=False, soft_wrap=True)
    t = Table(title=f"fits T = α + β·x (all layers), x = {result.knob} or bytes", title_justify="left")
    for c in ("stage", "x", "α per call", "α per a2a", "β", "r²", "n"):
        t.add_column(c, justify="left" if c in ("stage", "x") else "right")
    for r in result.fits.filter(result.fits["layer"].is_null()).iter_rows(named=True):
        t.add_row(
            Text(r["stage"]),
            Text(r["x"]),
            fmt_ns(r["alpha_ns"]),
            fmt_ns(r["alpha_per_a2a_ns"]) if r["alpha_per_a2a_ns"] is not None else "–",
            f"{r['beta_ns_per_unit']:.4g}",
            "–" if r["r2"] is None else f"{r['r2']:.3f}",
            str(r["n"]),
        )
    console.print(t)
    thr = result.throughput
    if thr.get("monotonic") is False:
        console.print(
            f"throughput is non-monotonic in {result.knob}: peak at {thr.get('peak_label')}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def write_sweep_outputs(
    result: SweepResult, out: Path | None, json_out: Path | None, records: Path | None, sources: Sequence[str] = ()
) -> None:
    """Write the sweep page, sweep.json and one YAML run record per trace run (only the CLI writes files)."""
    from ep_trace.analysis.sweep import sweep_dict
    from ep_trace.cli import printable
    from ep_trace.cli.outputs import write_atomic, write_json, write_yaml
    from ep_trace.reports.sweep import render_sweep

    if out is not None:
        page = render_sweep(result, title=f"ep-trace sweep over {result.knob}", sources=sources)
        write_atomic(out, page.encode("utf-8"))
        console.print(f"sweep report: {printable(str(out))}", markup=False, highlight=False, soft_wrap=True)
    if json_out is not None:
        write_json(sweep_dict(result), json_out)
        console.print(f"sweep json: {printable(str(json_out))}", markup=False, highlight=False, soft_wrap=True)
    if records is not None:
        for rec in result.records:
            if rec is not None:
                safe = "".join(c if c.isalnum() or c in "-_.=" else "_" for c in str(rec["run"]["label"]))
                write_yaml(rec, records / f"{safe}.yaml")
        console.print(f"run records: {printable(str(records))}", markup=False, highlight=False, soft_wrap=True)


@app.command("sweep")
def sweep_cmd(
    runs: list[Path] = typer.Argument(
        ..., help="Runs of one job: trace directories or summary JSONs from 'ep-trace analyze --json'."
    ),
    out: Path = typer.Option(Path("sweep.html"), "-o", "--out", help="HTML sweep report to write."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write sweep.json (docs/sweep.md) here."),
    by: Optional[str] = typer.Option(
        None,
        "--by",
        help="The swept knob: tokens, top_k, hidden, ep_size, dtype or chunks (default: the one that varies).",
    ),
    label: list[str] = typer.Option(
        [], "--label", help="RUN=KNOB:VALUE: a knob value the traces do not give (repeatable)."
    ),
    records: Optional[Path] = typer.Option(
        None, "--records", help="Directory to write one YAML run record per trace run (docs/run_record.md)."
    ),
    fmt: str = typer.Option("auto", "--format", help="Input format of trace directories: auto, kineto or nsys."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Skip unreadable ranks instead of stopping."),
) -> None:
    """Explain a series of runs of one job (tokens, top-k, hidden, EP size, dtype, chunks) with one curve.

    Per stage and layer: T = α + β·x with r² and residuals; throughput; the verdict (fixed-latency,
    bandwidth, expert-compute or imbalance bound) with its evidence and remedy.

    Examples:

      ep-trace sweep sweep/tokens_128 sweep/tokens_512 sweep/tokens_2048 -o sweep.html --json sweep.json

      ep-trace sweep a.json b.json --label a.json=tokens:128 --label b.json=tokens:512
    """
    from ep_trace.cli.analyze import check_format, progress_bar
    from ep_trace.cli.output_guard import Output, check_outputs

    check_format(fmt)
    if records is not None and records.exists() and not records.is_dir():
        raise ConfigError(f"--records {records}: not a directory; pass a directory for the run records")
    check_outputs(  # before the (long) analysis of every run
        runs,
        Output("-o", out),
        Output("--json", json_out) if json_out is not None else None,
        Output("--records", records, directory=True) if records is not None else None,
    )
    if by is not None:
        by = by.replace("-", "_")
    with progress_bar() as progress:
        result = run_sweep(runs, parse_labels(label, runs), by, fmt, "skip" if keep_going else "raise", progress)
    print_sweep(result)
    write_sweep_outputs(result, out, json_out, records, [str(r) for r in runs])
