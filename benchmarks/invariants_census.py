"""Invariant violations per input, before and after the invariants pass (ep_trace.analysis.invariants).

For every real trace of ``../shared/external/`` (each trace set: a rank directory, or one file where a
folder holds several unrelated traces), every sample trace (``sample_traces/``), the committed test
traces of ``tests/data/ep2_gloo`` and any extra path given: the analysis without its last pass
("before": the figures and findings as they would be published), the same analysis with it ("after"),
and the count of broken invariants of each: rows of ``invariants.violations`` plus findings withheld,
and the lines of ``invariants.summary_violations`` on the published summary.

Not a timing: one analysis per input (about 10 s for the 23 real and sample inputs on 2 cores, plus
about 1 s per fuzz case)::

    python benchmarks/invariants_census.py [--fuzz N] [EXTRA_TRACE_DIR ...]

``--fuzz N`` adds N seeded cases of each of the fuzz suite's 23 mutation classes (the CI runs 6).

Prints one line per input (``before`` / ``after``: invariant -> count) and the totals; "after" must be 0.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import ep_trace
from ep_trace.analysis import engine, invariants
from ep_trace.errors import EpTraceError

ROOT = Path(__file__).resolve().parents[1]
EXTERNAL = ROOT.parent / "shared" / "external"


def inputs(extra: list[str]) -> list[Path]:
    """The trace sets: external rank directories, single-trace files of the mixed folders, samples."""
    k, n = EXTERNAL / "kineto", EXTERNAL / "nsys"
    sets = [
        k / "param_dlrm_8rank",
        k / "hta_torchrec_pair",
        k / "hta_nccl_metadata",
        k / "hta_torchrec16_rank0",
        *sorted((k / "edge_cases").glob("*.json.gz")),
        *sorted((k / "hta_trace_diff").glob("*/*.json.gz")),
        *sorted((k / "tracelens_moe_micro").glob("*.json.gz")),
        *sorted(n.glob("*/*.sqlite")),
        *sorted(p for p in (ROOT / "sample_traces").iterdir() if p.is_dir()),
        ROOT / "tests" / "data" / "ep2_gloo",
    ]
    return [p for p in sets if p.exists()] + [Path(x) for x in extra]


def fuzz_cases(n: int, workdir: Path) -> list[Path]:
    """``n`` seeded cases of every mutation class of the fuzz suite (tests/robustness/attacks.py);
    the parquet class's input is its ``tables/`` folder."""
    sys.path.insert(0, str(ROOT / "tests" / "robustness"))
    import attacks

    out = []
    for seed in range(n):
        for cls in attacks.CLASSES:
            try:
                case = attacks.make_case(cls, seed, workdir)
            except Exception:  # noqa: BLE001 - a mutation that does not apply (the fuzz suite skips it too)
                continue
            out.append(case / "tables" if (case / "tables").is_dir() else case)
    return out


def census(path: Path) -> tuple[Counter[str], Counter[str]] | None:
    """``(before, after)``: broken invariants by name (None: nothing to analyse, or an input error)."""
    real = engine.invariants
    engine.invariants = SimpleNamespace(enforce=lambda a: a)  # type: ignore[assignment]
    try:
        raw = ep_trace.load([path], on_error="skip")
    except EpTraceError:  # NothingToAnalyzeError, or a fuzz case refused with its one-line error
        return None
    finally:
        engine.invariants = real
    done = invariants.enforce(raw)
    before: Counter[str] = Counter(invariants.violations(raw)["invariant"].to_list())
    before.update(w.invariant for w in done.withheld if w.what == "finding")
    before.update(line.split(":", 1)[0] for line in invariants.summary_violations(raw.summary()))
    after: Counter[str] = Counter(invariants.violations(done)["invariant"].to_list())
    after.update(line.split(":", 1)[0] for line in invariants.summary_violations(done.summary()))
    return before, after


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="extra trace directories or files")
    ap.add_argument("--fuzz", type=int, default=0, metavar="N", help="also N seeded cases of every fuzz class")
    args = ap.parse_args()
    tot_b: Counter[str] = Counter()
    tot_a: Counter[str] = Counter()
    n_bad = 0
    tmp = tempfile.TemporaryDirectory(prefix="ep-trace-census-")
    sets = inputs(args.paths) + fuzz_cases(args.fuzz, Path(tmp.name))
    for p in sets:
        r = census(p)
        name = str(p.relative_to(ROOT.parent)) if p.is_relative_to(ROOT.parent) else str(p)
        if r is None:
            print(f"{name}: nothing to analyse (or refused with an input error)")
            continue
        b, a = r
        n_bad += bool(b)
        tot_b += b
        tot_a += a
        print(f"{name}: before {dict(b) or 0}, after {dict(a) or 0}")
    print(f"{len(sets)} inputs, {n_bad} with a broken invariant before; before {dict(tot_b)}, after {dict(tot_a) or 0}")


if __name__ == "__main__":
    main()
