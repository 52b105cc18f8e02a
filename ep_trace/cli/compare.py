"""`ep-trace compare A B`: two runs side by side, per stage, per rank and per finding."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from ep_trace.cli.app import app, console, err_console

if TYPE_CHECKING:
    from ep_trace.analysis.run_compare import Comparison
    from ep_trace.analysis.run_digest import RunDigest

__all__ = ["compare_cmd", "load_run"]


@app.command("compare")
def compare_cmd(
    a: Path = typer.Argument(
        ..., help="Run A (the baseline): a trace directory or a summary JSON from 'ep-trace analyze --json'."
    ),
    b: Path = typer.Argument(..., help="Run B: a trace directory or a summary JSON."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Write the comparison as an HTML page here."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the comparison as JSON here."),
    fmt: str = typer.Option("auto", "--format", help="Input format of trace directories: auto, kineto or nsys."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Skip unreadable ranks instead of stopping."),
    rank_map: Optional[list[str]] = typer.Option(
        None,
        "--rank-map",
        help="Rank of a file: R=PATH, pid:PID=R (nsys file with several processes) or a file of such lines; repeatable. Beats every rank found in the files.",
    ),
    fail_on_regression: bool = typer.Option(
        False,
        "--fail-on-regression",
        help="CI gate: exit 3 when B (NEW) is worse than A (BASE) beyond both the runs' noise and --threshold on a gated metric.",
    ),
    threshold: Optional[float] = typer.Option(
        None,
        "--threshold",
        metavar="PCT",
        help="Gate threshold, percent of each metric's reference (its BASE value; the BASE step for exposed_comm, barrier_wait, finding:*); default 5.",
    ),
    history: Optional[list[Path]] = typer.Option(
        None,
        "--history",
        metavar="RUN",
        help="An earlier run of BASE's configuration (saved summary or trace directory, e.g. one of main's last runs); repeatable, at least 2. Each metric's noise is then at least its run-to-run spread over BASE and these.",
    ),
    gate: Optional[list[str]] = typer.Option(
        None,
        "--gate",
        metavar="METRIC",
        help="Gated metrics, repeatable or comma-separated: step_time, stages, stage:NAME, exposed_comm, barrier_wait, I_e, I_r, findings, finding:KIND, all (default).",
    ),
) -> None:
    """Compare two runs: what got better or worse per stage, per rank and per finding.

    The step-time change is explained by the per-stage deltas (B − A; negative = B is faster).
    With --fail-on-regression (docs/ci.md) one line per gated metric follows, and the exit code is 3
    when B is worse than A beyond the runs' own noise and the threshold on any of them, 0 otherwise.

    Examples:

      ep-trace compare baseline_traces/ chunked_traces/ -o diff.html

      ep-trace compare main.json pr.json --json diff.json

      ep-trace compare main.json pr_traces/ --fail-on-regression --threshold 5 --gate step_time,stages

      ep-trace compare main.json pr.json --fail-on-regression --history main-1.json --history main-2.json
    """
    from ep_trace.analysis.regression_gate import (
        DEFAULT_THRESHOLD_PCT,
        check_history,
        check_threshold,
        evaluate,
        history_noise,
        parse_gates,
    )
    from ep_trace.cli.analyze import check_format
    from ep_trace.cli.output_guard import Output, check_outputs
    from ep_trace.cli.outputs import write_atomic, write_json
    from ep_trace.errors import RegressionFound
    from ep_trace.reports.compare import compare_runs, comparison_to_dict, render_compare_html
    from ep_trace.reports.gate import gate_lines, gate_verdict

    gates = parse_gates(gate)
    pct = DEFAULT_THRESHOLD_PCT if threshold is None else check_threshold(threshold)
    if history:
        check_history(len(history))
    check_format(fmt)
    check_outputs(
        [a, b, *(history or [])],
        Output("-o", out) if out is not None else None,
        Output("--json", json_out) if json_out is not None else None,
    )
    on_error = "skip" if keep_going else "raise"
    from ep_trace.cli.rank_map import parse_rank_map

    rmap = parse_rank_map(rank_map)
    cmp = compare_runs(load_run(a, fmt, on_error, rmap), load_run(b, fmt, on_error, rmap))
    run_noise = history_noise(cmp.a, [load_run(h, fmt, on_error, rmap) for h in history]) if history else None
    verdict = evaluate(cmp, pct, gates, run_noise)
    _print_comparison(cmp)
    shown = fail_on_regression or bool(gate) or threshold is not None
    if shown:
        for line in gate_lines(verdict):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    if out is not None:
        write_atomic(out, render_compare_html(cmp, verdict).encode("utf-8"))
        console.print(f"comparison: {out}", markup=False, highlight=False, soft_wrap=True)
    if json_out is not None:
        write_json(comparison_to_dict(cmp, verdict), json_out)
        console.print(f"json: {json_out}", markup=False, highlight=False, soft_wrap=True)
    if fail_on_regression and not verdict.passed:
        found = RegressionFound(verdict.failed, gate_verdict(verdict))
        err_console.print(f"regression: {found.verdict}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(found.exit_code)
    if shown:
        console.print(gate_verdict(verdict), markup=False, highlight=False, soft_wrap=True)


def _print_comparison(cmp: Comparison) -> None:
    """The headline, the per-stage table and the findings that moved."""
    from rich.table import Table
    from rich.text import Text

    from ep_trace.cli.safe_text import printable
    from ep_trace.reports.compare import headline
    from ep_trace.reports.units import fmt_ns

    console.print(headline(cmp), markup=False, highlight=False, soft_wrap=True)
    if cmp.stages.height:
        t = Table(title="per stage (window per step, mean over ranks)", title_justify="left", show_edge=False)
        for c in ("stage", "A", "B", "Δ", "change"):
            t.add_column(c, justify="left" if c in ("stage", "change") else "right")
        for r in cmp.stages.iter_rows(named=True):
            t.add_row(
                Text(printable(r["stage"])),  # a saved summary's text: never rich markup, no control characters
                fmt_ns(r["a_window_ns"]),
                fmt_ns(r["b_window_ns"]),
                fmt_ns(r["delta_ns"], signed=True),
                r["change"],
            )
        console.print(t)
    for r in cmp.findings.filter(cmp.findings["status"] != "same").iter_rows(named=True):
        console.print(
            f"finding {printable(r['kind'])}: {r['status']} ({fmt_ns(r['a_saving_ns'])} → {fmt_ns(r['b_saving_ns'])} per step)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def load_run(
    path: Path, fmt: str = "auto", on_error: str = "raise", rank_map: dict[object, int] | None = None
) -> RunDigest:
    """A run from a trace directory / file (:func:`ep_trace.load`) or from a saved ``*.json`` summary.

    Raises:
        BadInputError: unreadable JSON or not an ep-trace summary (naming the file).
    """
    import orjson

    from ep_trace import load
    from ep_trace.analysis.run_digest import digest_analysis, digest_summary
    from ep_trace.errors import BadInputError

    if path.is_file() and path.suffix == ".json":
        try:
            data = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError as exc:
            raise BadInputError(
                f"{path}: not valid JSON ({exc}); pass a summary written by 'ep-trace analyze --json' or a trace directory"
            ) from None
        return digest_summary(data, str(path))
    return digest_analysis(load(path, format=fmt, on_error=on_error, rank_map=rank_map), str(path))  # type: ignore[arg-type]
