"""Validate the simulated what-if savings against reality: paired demo runs, with and without the cause.

Pairs (2 ranks, same seed, A has the cause, B does not):

* straggler: A ``--straggler 1:30`` vs B none (512 tokens); predicted = A's ``no_straggler`` saving;
* skew: A ``--skew hot:1:0.45`` vs B ``uniform`` (2048 tokens); predicted = A's ``balanced_routing`` saving;
* chunks: A ``--chunks 1`` vs B ``--chunks 4`` (2048 tokens); predicted = A's ``chunked_pipeline`` saving at k = 4.
* chunks_ab / chunks8_ab: the chunks pair inside ONE run (``--chunks 1 --alt-chunks K``): even steps
  are A (1 chunk), odd steps B (K chunks), so that both sides share the run's thread placement and
  load; predicted = ``chunked_pipeline`` at k = K from each A step analysed alone
  (``AnalysisConfig(steps=(i, i))``: the model sees no chunked step), median over the A steps.
  Steps 0 and 1 are left out (the first pair after profiler start-up). ``--steps`` is per side
  here; each A step is paired with the B step that follows it, and the measured saving is the
  median of those step-to-step differences, pooled over the runs (95 % bootstrap interval over the
  pairs; A / B spreads are the steps' interquartile ranges). Pairing neighbours cancels the load
  drift both sides share: on the kept stop-25 sets it narrows the interval 1.7-2.9x in 6 of 7 sets
  against the difference of the two sides' medians (2048 tokens, k = 4: -7.6..-5.6 against
  -8.4..-3.8 ms).
* skew_ab: the skew pair inside one run (``--skew hot:1:0.45 --alt-skew uniform``, 2048 tokens),
  predicted = ``balanced_routing`` from each skewed step analysed alone.
* readme_skew_ab: the README example's routing inside one run, its straggler on both sides
  (``--skew zipf:1.2 --straggler 2:30 --alt-skew uniform``, 4 ranks, 512 tokens): a what-if that
  predicts a *slower* step (balanced routing moves tokens onto the late rank) checked against reality.
* readme: the README example, 4 ranks ``--skew zipf:1.2 --straggler 2:30`` vs ``--skew zipf:1.2`` (512 tokens);
  predicted = A's ``no_straggler`` saving (4 ranks on 2 cores: outside the 2-rank target).
* placement_ab (and _hotset, _zipf, _uniform): re-placing / replicating experts inside one run. A
  calibration run of the A workload (2 ranks, contiguous placement, e.g. ``--skew hot:1:0.45``) is
  analysed with ``ep-trace analyze --propose-placement FILE``; the pair then runs ``--alt-placement
  FILE.placement.json``: even steps A (the contiguous placement), odd steps B (the proposal);
  predicted = the ``placement`` what-if of each A step analysed alone. ``_uniform`` is the control: a
  placement that cannot help must be predicted as not helping.
* node_local_ab (and _latency, _uniform): 4 ranks on 2 emulated nodes (``--nodes 2``) with a
  cross-node link and source-dependent routing (``--skew affinity:2:0.9``: each node's tokens mostly
  use the other node's experts); B runs the ``node_local`` proposal (``FILE.node_local.json``),
  predicted = the ``node_local`` what-if. ``node_local_ab``: a bandwidth-bound link (``--cross-node-
  latency-ms 1 --cross-node-gbps 1``); ``_latency``: a fixed 4 ms per call that moves anything across
  and every token on the other node (``affinity:2:1``); ``_uniform``: the control. The row gives the
  cross-node delay the demo injected per step on each side (from the sidecars), the known part of the
  measured saving.
  Each row says how many of the analysed A steps proposed exactly the placement B ran.

measured saving = stat(A) - stat(B), stat = median over steps of the mean over ranks of the step
length (the warm-up rule drops an outlier first step). The prediction pairs each A step with its
edited replay (``saving_ns``: median over steps of the per-step saving). In separate-run pairs A and
B are different steps of different runs, so the measured side compares their medians; in-run pairs
compare each A step with its neighbouring B step (below).

CPU contention (2 ranks = 4 busy threads on the 2 shared cores, other engineers' jobs): runs of a
pair are interleaved A, B, A, B ... so that a load change hits both sides alike; each side is
repeated ``--repeats`` times and the medians over repeats are compared; the spread (min..max over
repeats) of each side is printed next to the figure, and a pair whose measured saving is within the
spread of B is marked noisy.

The demo's ranks allocate with jemalloc when it is installed (its default since stop 22; the header
line names the library), and gloo's transfer threads run on SCHED_FIFO where the process may (its
default since stop 25, ``--comm-priority``; the header line says which); ``--demo-args '--allocator
glibc'`` runs them on glibc malloc (on huge pages unless ``--no-huge-pages``), ``--demo-args
'--pin-cores'`` gives each rank its own core (its gloo threads share it).

Run: ``python benchmarks/whatif_validate.py [--repeats 5] [--steps 8] [--pairs straggler,skew,chunks]``
(each demo run takes 5-15 s). Prints one Markdown table row per pair. The placement pairs:
``--pairs placement_ab,placement_ab_hotset,placement_ab_zipf,placement_ab_uniform,node_local_ab,node_local_ab_latency,node_local_ab_uniform``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

import ep_trace
from ep_trace.analysis.config import AnalysisConfig

#: name -> (A args, B args, what-if, k, tokens, ranks). The straggler pair runs a small compute load
#: (512 tokens) so that the injected sleep, not CPU contention, dominates the difference. ``readme`` is
#: the README's example (4 ranks on the 2 cores: oversubscribed, outside the 2-rank target).
PAIRS = {
    "straggler": (["--straggler", "1:30"], [], "no_straggler", None, 512, 2),
    "skew": (["--skew", "hot:1:0.45"], [], "balanced_routing", None, 2048, 2),
    "chunks": (["--chunks", "1"], ["--chunks", "4"], "chunked_pipeline", 4, 2048, 2),
    "chunks8": (["--chunks", "1"], ["--chunks", "8"], "chunked_pipeline", 8, 2048, 2),
    # the chunk penalty is per op, not per token: with a quarter of the tokens it is a larger share
    # of a shorter, less noisy step
    "chunks_small": (["--chunks", "1"], ["--chunks", "4"], "chunked_pipeline", 4, 512, 2),
    "chunks8_small": (["--chunks", "1"], ["--chunks", "8"], "chunked_pipeline", 8, 512, 2),
    "readme": (["--skew", "zipf:1.2", "--straggler", "2:30"], ["--skew", "zipf:1.2"], "no_straggler", None, 512, 4),
}


def _demo(out: Path, extra: list[str], steps: int, tokens: int, ranks: int = 2) -> None:
    cmd = [
        sys.executable,
        "-c",
        "from ep_trace.cli import main; main()",
        "demo",
        "--out",
        str(out),
        "--ranks",
        str(ranks),
        "--steps",
        str(steps),
    ]
    cmd += ["--tokens", str(tokens), "--seed", "0", *extra]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)


def _stat(a: ep_trace.Analysis) -> float:
    per = a.steps.group_by("step").agg(pl.col("step_time_ns").mean())
    return float(per["step_time_ns"].median() or 0.0)


def _predicted(a: ep_trace.Analysis, scenario: str) -> float | None:
    w = a.whatif
    if w is None:
        return None
    r = w.filter(pl.col("scenario") == scenario)
    return float(r["saving_ns"][0]) if r.height else None


def run_pair(name: str, repeats: int, steps: int, work: Path, demo_extra: tuple[str, ...] = ()) -> dict[str, object]:
    """Run one pair ``repeats`` times interleaved; medians, spreads, error."""
    a_args, b_args, scenario, k, tokens, ranks = PAIRS[name]
    cfg = AnalysisConfig(whatif_chunks=(k,)) if k else AnalysisConfig()
    sa, sb, pred = [], [], []
    for i in range(repeats):
        for side, args in (("A", a_args), ("B", b_args)):
            d = work / f"{name}_{side}{i}"
            _demo(d, [*args, *demo_extra], steps, tokens, ranks)
            an = ep_trace.load([d], config=cfg)
            (sa if side == "A" else sb).append(_stat(an))
            if side == "A":
                p = _predicted(an, scenario)
                if p is not None:
                    pred.append(p)
    ma, mb = statistics.median(sa), statistics.median(sb)
    measured = ma - mb
    p = statistics.median(pred) if pred else float("nan")
    err = 100.0 * abs(p - measured) / abs(measured) if measured else float("nan")
    return {
        "pair": name,
        "scenario": scenario + (f" (k={k})" if k else ""),
        "A_ms": ma / 1e6,
        "A_spread_ms": (min(sa) / 1e6, max(sa) / 1e6),
        "B_ms": mb / 1e6,
        "B_spread_ms": (min(sb) / 1e6, max(sb) / 1e6),
        "measured_ms": measured / 1e6,
        "predicted_ms": p / 1e6,
        "predicted_spread_ms": (min(pred) / 1e6, max(pred) / 1e6) if pred else None,
        "error_pct": err,
        "noisy": (max(sb) - min(sb)) > abs(measured),
    }


#: name -> (demo args, what-if, k, tokens): pairs measured inside one run, A on even steps (the
#: cause: 1 chunk, or the skew), B on odd steps (K chunks, or uniform routing).
AB_PAIRS = {
    "chunks_ab": (["--chunks", "1", "--alt-chunks", "4"], "chunked_pipeline", 4, 2048, 2),
    "chunks8_ab": (["--chunks", "1", "--alt-chunks", "8"], "chunked_pipeline", 8, 2048, 2),
    "chunks_ab_small": (["--chunks", "1", "--alt-chunks", "4"], "chunked_pipeline", 4, 512, 2),
    "skew_ab": (["--skew", "hot:1:0.45", "--alt-skew", "uniform"], "balanced_routing", None, 2048, 2),
    # the README example's routing with its straggler kept on both sides: balancing moves tokens
    # onto the late rank, so the model predicts a negative saving; 4 ranks on the 2 cores
    "readme_skew_ab": (
        ["--skew", "zipf:1.2", "--straggler", "2:30", "--alt-skew", "uniform"],
        "balanced_routing",
        None,
        512,
        4,
    ),
}


#: name -> (A demo args, what-if (the proposal's scenario), tokens, ranks): in-run A/B pairs whose B side
#: runs the placement the analysis proposes from a calibration run of A (``--alt-placement``).
PLACEMENT_PAIRS = {
    "placement_ab": (["--skew", "hot:1:0.45"], "placement", 2048, 2),
    "placement_ab_hotset": (["--skew", "hotset:0,1:0.6"], "placement", 2048, 2),  # two hot experts, both on rank 0
    "placement_ab_zipf": (["--skew", "zipf:1.2"], "placement", 2048, 2),
    "placement_ab_uniform": ([], "placement", 2048, 2),  # control: nothing to gain
    # bandwidth-bound link: a node-local B still sends the uniform 10 % across (A's latency stays), but
    # ~1/8 of A's cross-node bytes
    "node_local_ab": (
        ["--nodes", "2", "--cross-node-latency-ms", "1", "--cross-node-gbps", "1", "--skew", "affinity:2:0.9"],
        "node_local",
        512,
        4,
    ),
    # latency-bound link (the seed scenario of issue 41): every token uses the other node's experts, so a
    # node-local B's dispatch and combine move nothing across and skip the latency (the count exchange keeps it)
    "node_local_ab_latency": (
        ["--nodes", "2", "--cross-node-latency-ms", "4", "--skew", "affinity:2:1"],
        "node_local",
        512,
        4,
    ),
    "node_local_ab_uniform": (  # control: without affinity no placement keeps tokens on their node
        ["--nodes", "2", "--cross-node-latency-ms", "1", "--cross-node-gbps", "1"],
        "node_local",
        512,
        4,
    ),
}


def _propose(name: str, steps: int, work: Path, demo_extra: tuple[str, ...], tokens: int) -> tuple[Path, str]:
    """A calibration run of the pair's A side, analysed with ``--propose-placement``: ``(B's placement file, source)``."""
    a_args, scenario, _, ranks = PLACEMENT_PAIRS[name]
    d = work / f"{name}_calibration"
    _demo(d, [*a_args, *demo_extra], steps, tokens, ranks)
    prop = work / f"{name}_proposal.json"
    cmd = [sys.executable, "-c", "import sys; from ep_trace.cli import main; sys.exit(main())", "analyze", str(d)]
    cmd += ["-o", str(d / "report.html"), "--json", str(d / "summary.json"), "--propose-placement", str(prop)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    chosen = prop.with_name(f"{prop.stem}.{scenario}.json")  # ep_trace.cli.outputs.placement_paths
    if p.returncode != 0 or not chosen.exists():
        raise RuntimeError(f"{name}: ep-trace analyze --propose-placement wrote no {chosen.name}: {p.stderr.strip()}")
    rows = json.loads((d / "summary.json").read_text()).get("whatif") or []
    saving = next((r["saving_ns"] for r in rows if r.get("scenario") == scenario), None)
    said = "n/a" if saving is None else f"{saving / 1e6:.1f} ms"
    return chosen, f"proposed (the calibration run predicts {said})"


def _proposal_of(a: ep_trace.Analysis, scenario: str) -> list[list[int]] | None:
    """The experts per rank the analysis proposes for ``scenario``, or None (no proposal / no placement model)."""
    for p in getattr(a, "placement_proposals", ()):  # ep_trace.analysis.placement_plan.PlacementProposal
        if getattr(p, "scenario", None) == scenario:
            return [sorted(int(e) for e in r) for r in p.experts]
    return None


def run_placement_ab(
    name: str,
    repeats: int,
    steps: int,
    work: Path,
    keep: bool = False,
    demo_extra: tuple[str, ...] = (),
    tokens: int = 0,
) -> dict[str, object]:
    """Calibrate (:func:`_propose`), then the in-run A/B of :func:`run_ab_pair` with B on the proposal."""
    a_args, scenario, n_tokens, ranks = PLACEMENT_PAIRS[name]
    n_tokens = tokens or n_tokens
    file, source = _propose(name, steps, work, demo_extra, n_tokens)
    proposed = [sorted(r) for r in json.loads(file.read_text())["ranks"]]
    agree: list[bool] = []
    delays: list[tuple[float, float]] = []
    spec = ([*a_args, "--alt-placement", str(file)], scenario, None, n_tokens, ranks)
    r = run_ab_pair(
        name, repeats, steps, work, keep=keep, demo_extra=demo_extra, spec=spec,
        on_a_step=lambda a1: agree.append(_proposal_of(a1, scenario) == proposed),
        on_run=lambda d: delays.extend(_injected_cross_node(d)),
    )  # fmt: skip
    r["pair"] = f"{r['pair']}; B = {source} {file.name}, proposed again by {sum(agree)}/{len(agree)} A steps"
    if delays:  # the known part of the answer: what the emulated link charged each side
        a_ms, b_ms = (statistics.median(x[i] for x in delays) / 1e6 for i in (0, 1))
        r["pair"] = f"{r['pair']}; injected cross-node delay per step A {a_ms:.1f} ms, B {b_ms:.1f} ms"
    return r


def _injected_cross_node(d: Path) -> list[tuple[float, float]]:
    """``(A, B)`` per neighbouring step pair: the cross-node delay the demo injected per step, ns
    (:func:`ep_trace.workloads.links.injected_cross_node_ns`); steps 0 and 1 left out as in :func:`run_ab_pair`."""
    from ep_trace.workloads.links import injected_cross_node_ns

    step = injected_cross_node_ns(d)
    return [(v, step[t + 1]) for t, v in sorted(step.items()) if t % 2 == 0 and t >= 2 and t + 1 in step]


def _paired_median_ci(d: list[float], n: int = 2000) -> tuple[float, float]:
    """95 % bootstrap interval of the median of paired differences ``d`` (pairs resampled)."""
    rng = np.random.default_rng(0)
    x = np.asarray(d)
    lo, hi = np.percentile(np.median(rng.choice(x, (n, x.size)), axis=1), [2.5, 97.5])
    return float(lo), float(hi)


def _step_pairs(per: pl.DataFrame) -> list[tuple[float, float]]:
    """``(A, B)`` step lengths of each even step and the odd step right after it, ns."""
    s = dict(per.select("step", "step_time_ns").iter_rows())
    return [(float(v), float(s[t + 1])) for t, v in sorted(s.items()) if t % 2 == 0 and t + 1 in s]


def run_ab_pair(
    name: str,
    repeats: int,
    steps: int,
    work: Path,
    predict_steps: int = 10,
    keep: bool = False,
    demo_extra: tuple[str, ...] = (),
    spec: tuple[list[str], str, int | None, int, int] | None = None,
    on_a_step: Callable[[ep_trace.Analysis], None] | None = None,
    on_run: Callable[[Path], None] | None = None,
) -> dict[str, object]:
    """``repeats`` runs of ``2 * steps + 2`` steps, A on even and B on odd steps, steps pooled over runs.

    The step-to-step spread of one side (~±10 ms at 2048 tokens: the ranks' threads on the 2 shared
    cores) is larger than the effect at stake, so the measured saving is the median of the
    differences A(s) - B(s + 1) over every pair of neighbouring steps, with a bootstrap interval
    (the difference of the two sides' medians is printed beside it); the prediction is the median of
    the pair's what-if over ``predict_steps`` A steps per run, each analysed alone. ``spec`` replaces
    ``AB_PAIRS[name]`` (the placement pairs); ``on_a_step`` sees each analysed A step, ``on_run`` each
    run's trace directory before it is removed.
    """
    demo_args, scenario, k, tokens, ranks = spec or AB_PAIRS[name]
    cfg = AnalysisConfig(whatif_chunks=(k,)) if k else AnalysisConfig()
    a_all: list[float] = []
    b_all: list[float] = []
    pred, diffs, pair_d = [], [], []
    for i in range(repeats):
        d = work / f"{name}_{i}"
        _demo(d, [*demo_args, *demo_extra], 2 * steps + 2, tokens, ranks)
        an = ep_trace.load([d], config=AnalysisConfig(steps=(2, 2 * steps + 1)))
        per = an.steps.group_by("step").agg(pl.col("step_time_ns").mean())
        sp = _step_pairs(per)
        a_all += [x for x, _ in sp]
        b_all += [y for _, y in sp]
        pair_d += [x - y for x, y in sp]
        diffs.append(statistics.median(x - y for x, y in sp))
        picks = np.unique(np.linspace(0, steps - 1, min(predict_steps, steps)).round().astype(int))
        for j in picks:
            s = 2 + 2 * int(j)
            a1 = ep_trace.load([d], config=dataclasses.replace(cfg, steps=(s, s)))
            p = _predicted(a1, scenario)
            if p is not None:
                pred.append(p)
            if on_a_step is not None:
                on_a_step(a1)
        if on_run is not None:
            on_run(d)
        if not keep:
            shutil.rmtree(d, ignore_errors=True)
    ma, mb = statistics.median(a_all), statistics.median(b_all)
    measured = statistics.median(pair_d)
    lo, hi = _paired_median_ci(pair_d)
    p = statistics.median(pred) if pred else float("nan")
    err = 100.0 * abs(p - measured) / abs(measured) if measured else float("nan")
    qa, qb = np.percentile(a_all, [25, 75]), np.percentile(b_all, [25, 75])
    return {
        "pair": f"{name} ({tokens} tokens, in-run A/B, {len(pair_d)} step pairs; 95% CI of the "
        f"measured saving {lo / 1e6:.1f}..{hi / 1e6:.1f}; per-run {min(diffs) / 1e6:.1f}..{max(diffs) / 1e6:.1f}; "
        f"difference of the sides' medians {(ma - mb) / 1e6:.1f})",
        "scenario": scenario + (f" (k={k})" if k else ""),
        "A_ms": ma / 1e6,
        "A_spread_ms": (qa[0] / 1e6, qa[1] / 1e6),  # interquartile range of the steps
        "B_ms": mb / 1e6,
        "B_spread_ms": (qb[0] / 1e6, qb[1] / 1e6),
        "measured_ms": measured / 1e6,
        "predicted_ms": p / 1e6,
        "predicted_spread_ms": (min(pred) / 1e6, max(pred) / 1e6) if pred else None,
        "error_pct": err,
        # noisy when the bootstrap interval of the measured saving is wider than the saving
        "noisy": (hi - lo) > abs(measured),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--pairs", default="straggler,skew,chunks")
    ap.add_argument("--work", type=Path, default=None, help="work here (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the in-run pairs' traces under --work")
    ap.add_argument("--tokens", type=int, default=0, help="tokens per rank of the placement pairs (0: the pair's own)")
    ap.add_argument(
        "--demo-args",
        default="",
        help="extra demo options for every run, e.g. '--pin-cores' or '--no-huge-pages' (one string)",
    )
    args = ap.parse_args()
    extra = tuple(args.demo_args.split())
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        from ep_trace.workloads.launcher import find_jemalloc

        lib = find_jemalloc()
        alloc = "glibc (--allocator glibc)" if "glibc" in extra else (str(lib) if lib else "glibc (no jemalloc found)")
        from ep_trace.workloads.comm_priority import realtime_permitted

        prio = "normal" if "normal" in extra or not realtime_permitted() else "realtime"
        print(f"demo ranks' allocator: {alloc}; gloo threads: {prio}; extra demo options: {' '.join(extra) or 'none'}")
        print(
            "A / B spread: min..max over runs (separate-run pairs), interquartile range of the steps (in-run pairs); "
            "predicted: min..max over the analysed A steps or runs"
        )
        print()
        print(
            "| pair | what-if | A ms (spread) | B ms (spread) | measured saving ms | predicted ms (min..max) | error % |"
        )
        print("|---|---|---|---|---|---|---|")
        for name in args.pairs.split(","):
            if name in PLACEMENT_PAIRS:
                r = run_placement_ab(name, args.repeats, args.steps, work, args.keep, extra, args.tokens)
            elif name in AB_PAIRS:
                r = run_ab_pair(name, args.repeats, args.steps, work, keep=args.keep, demo_extra=extra)
            else:
                r = run_pair(name, args.repeats, args.steps, work, demo_extra=extra)
            ps = r["predicted_spread_ms"]
            print(
                f"| {r['pair']} | {r['scenario']} | {r['A_ms']:.1f} ({r['A_spread_ms'][0]:.1f}..{r['A_spread_ms'][1]:.1f}) "
                f"| {r['B_ms']:.1f} ({r['B_spread_ms'][0]:.1f}..{r['B_spread_ms'][1]:.1f}) | {r['measured_ms']:.1f}"
                f"{' (noisy)' if r['noisy'] else ''} | {r['predicted_ms']:.1f}"
                f" ({ps[0]:.1f}..{ps[1]:.1f}) | {r['error_pct']:.1f} |"
                if ps
                else f"| {r['pair']} | {r['scenario']} | - | - | {r['measured_ms']:.1f} | n/a | n/a |",
                flush=True,
            )


if __name__ == "__main__":
    main()
