"""The seed scenario of issue 41, end to end (docs/placement.md, "The seed scenario").

Two emulated nodes with a fixed delay per all-to-all that moves bytes between them (``ep-trace demo --nodes
2 --cross-node-latency-ms L``), and routing that sends every token to the other node's experts (``--skew
affinity:W/2:1``). Four steps, each a command a user runs:

1. **Sweep** one knob (``ep-trace demo --sweep tokens=...``): the step changes little with the tokens, and
   ``ep-trace sweep`` calls the layer ``fixed_latency_bound``.
2. **Analyze** the operating point (the largest tokens) with ``--propose-placement``: the verdict names the
   ``node_local`` placement (finding ``cross_node_traffic``) with its simulated saving.
3. **Rerun** with the proposal: one demo run whose even steps keep the contiguous placement (A) and whose
   odd steps run the proposal (``--alt-placement FILE.node_local.json``, B). Measured = median over the
   neighbouring (A, B) step pairs of A - B (95 % bootstrap interval); predicted = the ``node_local``
   what-if of each A step analysed alone (median, min..max).
4. **Known answer**: the cross-node delay the demo asked for per step under A and under B (sidecars'
   ``cross_node_delay_ns``, per call the largest over the ranks, summed over the step's calls): what the
   proposal removes by construction.

Run (quiet machine; 4 ranks on 2 cores take ~10-20 s per demo run, ~2-4 min in all at the defaults)::

    python benchmarks/placement_seed.py [--ranks 4] [--latency-ms 5] [--tokens 16,32,64,128] \\
        [--steps 6] [--ab-steps 8] [--work DIR]

Prints each step's figures and, last, the Markdown block docs/placement.md's placeholders take.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl
from whatif_validate import _injected_cross_node, _paired_median_ci, _predicted, _step_pairs

import ep_trace
from ep_trace.analysis.config import AnalysisConfig


def _cli(*args: str) -> str:
    """``ep-trace ARGS`` in a fresh interpreter (as a user runs it); its stdout."""
    cmd = [sys.executable, "-c", "import sys; from ep_trace.cli import main; sys.exit(main())", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"ep-trace {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return p.stdout


def _scenario(a: argparse.Namespace) -> list[str]:
    return [
        "--ranks", str(a.ranks), "--nodes", "2", "--cross-node-latency-ms", str(a.latency_ms),
        "--skew", f"affinity:{a.ranks // 2}:1", "--seed", "0",
    ]  # fmt: skip


def sweep(a: argparse.Namespace, work: Path) -> dict[str, object]:
    """Step 1: the tokens sweep; its runs' step times, the verdict and its comm fits."""
    out = work / "sweep"
    _cli("demo", "--out", str(out), *_scenario(a), "--steps", str(a.steps), "--sweep", f"tokens={a.tokens}")
    s = json.loads((out / "sweep.json").read_text())
    runs = [(r["label"], r["x"], r["figures"]["step_time_ns"]) for r in s["runs"]]
    v = s.get("verdict") or {}
    ev = v.get("evidence") or {}
    return {"runs": runs, "kind": v.get("kind"), "title": v.get("title"), "evidence": ev, "notes": s.get("notes")}


def analyze_op(run_dir: Path, work: Path) -> dict[str, object]:
    """Step 2: the operating point analysed with --propose-placement; the verdict's first finding, the
    node_local what-if and the proposal file."""
    prop = work / "proposal.json"
    summ = work / "operating_point.json"
    _cli(
        "analyze",
        str(run_dir),
        "-o",
        str(work / "operating_point.html"),
        "--json",
        str(summ),
        "--propose-placement",
        str(prop),
    )
    s = json.loads(summ.read_text())
    nl = next((r for r in s["whatif"] if r["scenario"] == "node_local"), None)
    first = s["findings"][0] if s["findings"] else None
    return {
        "first_finding": (first["kind"], first["title"]) if first else None,
        "node_local": nl,
        "step_ns": (s.get("overall") or {}).get("step_time_mean_ns"),
        "file": prop.with_name("proposal.node_local.json"),
        "invariants": {r["check"]: r["status"] for r in s["ep_invariants"]},
    }


def rerun(a: argparse.Namespace, tokens: int, file: Path, work: Path) -> dict[str, object]:
    """Steps 3 and 4: the in-run A/B with the proposal on odd steps; measured, predicted, injected."""
    d = work / "ab"
    n = 2 * a.ab_steps + 2
    _cli(
        "demo", "--out", str(d), *_scenario(a), "--tokens", str(tokens), "--steps", str(n), "--alt-placement", str(file)
    )
    an = ep_trace.load([d], config=AnalysisConfig(steps=(2, n - 1)))
    pairs = _step_pairs(an.steps.group_by("step").agg(pl.col("step_time_ns").mean()))
    diffs = [x - y for x, y in pairs]
    lo, hi = _paired_median_ci(diffs)
    pred = [
        _predicted(ep_trace.load([d], config=AnalysisConfig(steps=(s, s))), "node_local") or 0.0
        for s in range(2, n - 1, 2)
    ]
    inj = _injected_cross_node(d)  # (A, B) per step pair from step 2
    return {
        "A_ms": statistics.median(x for x, _ in pairs) / 1e6,
        "B_ms": statistics.median(y for _, y in pairs) / 1e6,
        "measured_ms": statistics.median(diffs) / 1e6,
        "ci_ms": (lo / 1e6, hi / 1e6),
        "predicted_ms": statistics.median(pred) / 1e6,
        "predicted_range_ms": (min(pred) / 1e6, max(pred) / 1e6),
        "injected_A_ms": statistics.median(a for a, _ in inj) / 1e6,
        "injected_B_ms": statistics.median(b for _, b in inj) / 1e6,
        "known_ms": statistics.median(a - b for a, b in inj) / 1e6,
        "pairs": len(pairs),
        "invariants": {r["check"]: r["status"] for r in an.ep_invariants.iter_rows(named=True)},
    }


def _print_sweep(sw: dict[str, object]) -> None:
    print("## 1. sweep (ep-trace demo --sweep tokens=...)")
    runs = sw["runs"]
    assert isinstance(runs, list)
    for label, x, t in runs:
        print(f"  {label}: tokens {x:g}, step {t / 1e6:.1f} ms")
    t0, t1 = runs[0][2], runs[-1][2]
    print(f"  step x{t1 / t0:.2f} for tokens x{runs[-1][1] / runs[0][1]:.0f}")
    print(f"  verdict: {sw['kind']}: {sw['title']}")
    ev = sw["evidence"]
    assert isinstance(ev, dict)
    shares = ev.get("shares") or {}
    print("  shares of an MoE layer: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items() if v is not None))
    for stage, f in (ev.get("comm_fits") or {}).items():
        print(
            f"  {stage}: alpha {f['alpha_ns'] / 1e6:.2f} ms per call ({f['alpha_per_a2a_ns'] / 1e6:.2f} per all-to-all)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--latency-ms", type=float, default=5.0)
    ap.add_argument("--tokens", default="16,32,64,128", help="the sweep's values (the largest: operating point)")
    ap.add_argument("--steps", type=int, default=6, help="steps of each sweep run")
    ap.add_argument("--ab-steps", type=int, default=8, help="A/B step pairs of the rerun")
    ap.add_argument("--work", type=Path, default=None, help="work here and keep the runs (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        print(f"scenario: ep-trace demo {' '.join(_scenario(args))}")
        sw = sweep(args, work)
        _print_sweep(sw)
        runs = sw["runs"]
        assert isinstance(runs, list)
        op_label, op_tokens, _ = runs[-1]
        op = analyze_op(work / "sweep" / op_label, work)
        nl = op["node_local"]
        assert isinstance(nl, dict) or nl is None
        print("## 2. analyze the operating point with --propose-placement")
        print(f"  EP invariants: {op['invariants']}")
        print(f"  first finding: {op['first_finding']}")
        if nl:
            print(
                f"  node_local: predicted step {nl['predicted_step_ns'] / 1e6:.1f} ms, saving {nl['saving_ns'] / 1e6:.1f} ms"
            )
        file = op["file"]
        assert isinstance(file, Path)
        print(f"  proposal: {file.name} = {json.loads(file.read_text())['ranks']}")
        r = rerun(args, int(op_tokens), file, work)
        print("## 3-4. rerun: even steps contiguous (A), odd steps the proposal (B)")
        print(f"  EP invariants: {r['invariants']}")
        print(f"  A {r['A_ms']:.1f} ms, B {r['B_ms']:.1f} ms ({r['pairs']} step pairs)")
        ci, pr = r["ci_ms"], r["predicted_range_ms"]
        assert isinstance(ci, tuple) and isinstance(pr, tuple)
        print(f"  measured saving {r['measured_ms']:.1f} ms (95% CI {ci[0]:.1f}..{ci[1]:.1f})")
        print(f"  predicted saving {r['predicted_ms']:.1f} ms ({pr[0]:.1f}..{pr[1]:.1f} over the A steps)")
        print(
            f"  injected cross-node delay per step: A {r['injected_A_ms']:.1f} ms, B {r['injected_B_ms']:.1f} ms "
            f"(known saving {r['known_ms']:.1f} ms)"
        )
        err = (
            100.0 * abs(r["predicted_ms"] - r["measured_ms"]) / abs(r["measured_ms"])
            if r["measured_ms"]
            else float("nan")
        )
        print()
        print("docs/placement.md figures:")
        print(
            f"| sweep | step {runs[0][2] / 1e6:.1f} -> {runs[-1][2] / 1e6:.1f} ms for tokens {runs[0][1]:g} -> {op_tokens:g}; verdict {sw['kind']} |"
        )
        if nl:
            print(
                f"| analyze | first finding {op['first_finding'][0] if op['first_finding'] else None}; node_local saves {nl['saving_ns'] / 1e6:.1f} ms of {nl['predicted_step_ns'] / 1e6 + nl['saving_ns'] / 1e6:.1f} ms |"
            )
        print(
            f"| rerun | measured {r['measured_ms']:.1f} ms (95% CI {ci[0]:.1f}..{ci[1]:.1f}), predicted {r['predicted_ms']:.1f} ms, error {err:.1f} %, injected delay A {r['injected_A_ms']:.1f} / B {r['injected_B_ms']:.1f} ms |"
        )


if __name__ == "__main__":
    main()
