"""False-alarm and detection rates of the CI gate (``ep-trace compare --fail-on-regression``) on demo runs.

K rounds; each round runs four demos of one configuration back to back (2 gloo ranks by default, same
seed, so that routing is identical and only timing differs):

* STRAG: ``--straggler RANK:MS`` (an injected sleep in that rank's expert stages),
* BASE, SAME: the configuration itself, twice,
* HOT: ``--skew hot:EXPERT:SHARE`` (one expert takes that share of the assignments).

Pairs judged by the gate (BASE first), each from the runs' saved summaries (schema 3: a saved summary
gates exactly as its trace directory, tests/reports/test_regression_gate.py):

* identical, adjacent: (BASE_k, SAME_k), run one after the other: the false-alarm rate of a gate whose
  two runs share the machine's state;
* identical, other rounds: every pair of identical runs (BASE or SAME) from different rounds, the
  earlier one as BASE: the false-alarm rate when BASE was recorded earlier (CI's main vs a pull request);
* straggler: (BASE_k, STRAG_k) and hot expert: (SAME_k, HOT_k), adjacent: the detection rates.

With ``--history N`` each pair is judged as ``ep-trace compare --history`` would with N earlier runs of
BASE's configuration: the BASE runs of the N rounds before BASE's (wrapping round; never NEW's round).
``--rejudge DIR`` judges the summaries an earlier ``--work DIR`` kept, without running anything.

Prints the configuration, the load average, one Markdown table of rates (pairs where the gate failed)
and one of failures per metric (failed / judged pairs), for benchmarks/README.md.

Run on a quiet machine (each demo run takes 5-15 s plus about 2 s of analysis; K rounds = 4 K runs):
``python benchmarks/gate_false_alarm.py --rounds 10`` (about 10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import orjson

#: Run kinds of a round, in the order they run: each injected run next to the identical run it is judged against.
ORDER = ("strag", "base", "same", "hot")


def _demo(out: Path, args: argparse.Namespace, extra: list[str]) -> None:
    cmd = [sys.executable, "-c", "from ep_trace.cli import main; main()", "demo", "--out", str(out)]
    cmd += ["--ranks", str(args.ranks), "--steps", str(args.steps), "--tokens", str(args.tokens)]
    cmd += ["--layers", str(args.layers), "--seed", "0", *args.demo_args.split(), *extra]
    subprocess.run(cmd, check=True, capture_output=True, timeout=900)


def run_round(k: int, args: argparse.Namespace, work: Path) -> dict[str, Path]:
    """The four runs of round ``k``: ``{kind: saved summary}`` (traces deleted unless ``--keep``)."""
    import ep_trace

    extra = {"strag": ["--straggler", args.straggler], "hot": ["--skew", args.hot], "base": [], "same": []}
    out: dict[str, Path] = {}
    for kind in ORDER:
        d = work / f"r{k}_{kind}"
        _demo(d, args, extra[kind])
        out[kind] = work / f"r{k}_{kind}.json"
        out[kind].write_bytes(orjson.dumps(ep_trace.load([d]).summary()))
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)
    return out


def pairs(rounds: list[dict[str, Path]]) -> dict[str, list[tuple[Path, Path]]]:
    """The judged pairs (BASE, NEW) of each type (module doc)."""
    ident = [(k, r[kind]) for k, r in enumerate(rounds) for kind in ("base", "same")]
    return {
        "identical, adjacent": [(r["base"], r["same"]) for r in rounds],
        "identical, other rounds": [(a, b) for (ka, a), (kb, b) in itertools.combinations(ident, 2) if ka != kb],
        "straggler": [(r["base"], r["strag"]) for r in rounds],
        "hot expert": [(r["same"], r["hot"]) for r in rounds],
    }


@functools.cache
def _digest(path: Path):  # noqa: ANN202 (RunDigest, imported lazily; each summary read once, however many pairs use it)
    from ep_trace.analysis.run_digest import digest_summary

    return digest_summary(orjson.loads(path.read_bytes()), path.name)


def judge(
    base: Path, new: Path, threshold: float, gates: tuple[str, ...], history: list[Path] | None = None
) -> tuple[bool, Counter, Counter]:
    """(gate failed, failures per metric, judged pairs per metric) of one pair (``history``: as --history)."""
    from ep_trace.analysis.regression_gate import evaluate, history_noise
    from ep_trace.analysis.run_compare import compare_runs

    a, b = _digest(base), _digest(new)
    noise = history_noise(a, [_digest(h) for h in history]) if history else None
    g = evaluate(compare_runs(a, b), threshold, gates, noise)
    judged = [r for r in g.lines.iter_rows(named=True) if r["status"] != "n/a"]
    return (
        not g.passed,
        Counter(r["metric"] for r in judged if r["status"] == "fail"),
        Counter(r["metric"] for r in judged),
    )


def history_of(base: Path, new: Path, n: int) -> list[Path]:
    """The BASE runs of the ``n`` rounds before BASE's round (wrapping round), never NEW's round; [] for n = 0."""
    if n <= 0:
        return []
    rounds = sorted({int(p.name[1:].split("_")[0]) for p in base.parent.glob("r*_base.json")})
    ka, kb = (int(p.name[1:].split("_")[0]) for p in (base, new))
    i = rounds.index(ka)
    earlier = [rounds[(i - j) % len(rounds)] for j in range(1, len(rounds))]
    return [base.parent / f"r{k}_base.json" for k in earlier if k != kb][:n]


def report(
    by_type: dict[str, list[tuple[Path, Path]]], threshold: float, gates: tuple[str, ...], history: int = 0
) -> list[str]:
    """The two Markdown tables (rates; failures per metric)."""
    rates = ["| pairs | n | gate failed | rate |", "|---|---|---|---|"]
    fails: dict[str, Counter] = {}
    seen: dict[str, Counter] = {}
    for name, ps in by_type.items():
        failed, fails[name], seen[name] = 0, Counter(), Counter()
        for base, new in ps:
            f, fm, sm = judge(base, new, threshold, gates, history_of(base, new, history))
            failed += f
            fails[name].update(fm)
            seen[name].update(sm)
        rate = f"{100 * failed / len(ps):.0f} %" if ps else "–"
        rates.append(f"| {name} | {len(ps)} | {failed} | {rate} |")
    metrics = sorted(set().union(*seen.values()), key=lambda m: (m.partition(":")[0] != "step_time", ":" in m, m))
    per = ["| metric | " + " | ".join(by_type) + " |", "|---" * (len(by_type) + 1) + "|"]
    for m in metrics:
        per.append(f"| {m} | " + " | ".join(f"{fails[t][m]}/{seen[t][m]}" for t in by_type) + " |")
    return [*rates, "", "failures per metric (failed / judged pairs):", "", *per]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="K rounds of 4 demo runs each")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--straggler", default="1:2", help="RANK:MS of the STRAG runs (per expert stage and layer)")
    ap.add_argument("--hot", default="hot:0:0.3", help="--skew of the HOT runs")
    ap.add_argument("--threshold", type=float, default=5.0, help="the gate's threshold, percent")
    ap.add_argument("--gate", action="append", default=None, help="gated metrics (as compare --gate); default all")
    ap.add_argument("--demo-args", default="", help="extra demo options for every run, one string")
    ap.add_argument("--work", type=Path, default=None, help="keep the saved summaries here (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the trace directories too (under --work)")
    ap.add_argument("--history", type=int, default=0, help="judge with N earlier BASE runs (as compare --history)")
    ap.add_argument(
        "--rejudge", type=Path, default=None, help="judge the summaries kept in this --work dir; run nothing"
    )
    args = ap.parse_args()
    from ep_trace.analysis.regression_gate import parse_gates

    gates = parse_gates(args.gate)
    t0, load0 = time.monotonic(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.rejudge or args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.rejudge:
            n = len(list(work.glob("r*_base.json")))
            rounds = [{kind: work / f"r{k}_{kind}.json" for kind in ORDER} for k in range(n)]
        else:
            rounds = [run_round(k, args, work) for k in range(args.rounds)]
        lines = report(pairs(rounds), args.threshold, gates, args.history)
    print(
        f"gate_false_alarm: {args.rounds} rounds x 4 runs; {args.ranks} ranks, {args.steps} steps, {args.tokens} "
        f"tokens, {args.layers} layers, seed 0{' ' + args.demo_args if args.demo_args else ''}; straggler "
        f"{args.straggler}, {args.hot}; threshold {args.threshold:g} %, gate {','.join(gates)}"
        f"{f', history {args.history} runs' if args.history else ''}{f', rejudged {args.rejudge}' if args.rejudge else ''}; "
        f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; {time.monotonic() - t0:.0f} s"
    )
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
