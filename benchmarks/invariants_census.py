"""Invariant violations per input, before and after the invariants pass (ep_trace.analysis.invariants).

For every real trace of ``../shared/external/`` (each trace set: a rank directory, or one file where a
folder holds several unrelated traces), every sample trace (``sample_traces/``), the committed test
traces of ``tests/data/ep2_gloo`` and any extra path given: the analysis without its last pass
("before": the figures and findings as they would be published), the same analysis with it ("after"),
and the count of broken invariants of each: rows of ``invariants.violations`` plus findings withheld,
and the lines of ``invariants.summary_violations`` on the published summary.

Not a timing: one analysis per input (about 2 minutes for all of them on 2 cores)::

    python benchmarks/invariants_census.py [EXTRA_TRACE_DIR ...]

Prints one line per input (``before`` / ``after``: invariant -> count) and the totals; "after" must be 0.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import ep_trace
from ep_trace.analysis import engine, invariants
from ep_trace.errors import NothingToAnalyzeError

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


def census(path: Path) -> tuple[Counter[str], Counter[str]] | None:
    """``(before, after)``: broken invariants by name (None: nothing to analyse)."""
    real = engine.invariants
    engine.invariants = SimpleNamespace(enforce=lambda a: a)  # type: ignore[assignment]
    try:
        raw = ep_trace.load([path])
    except NothingToAnalyzeError:
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
    tot_b: Counter[str] = Counter()
    tot_a: Counter[str] = Counter()
    n_bad = 0
    sets = inputs(sys.argv[1:])
    for p in sets:
        r = census(p)
        name = str(p.relative_to(ROOT.parent)) if p.is_relative_to(ROOT.parent) else str(p)
        if r is None:
            print(f"{name}: nothing to analyse")
            continue
        b, a = r
        n_bad += bool(b)
        tot_b += b
        tot_a += a
        print(f"{name}: before {dict(b) or 0}, after {dict(a) or 0}")
    print(f"{len(sets)} inputs, {n_bad} with a broken invariant before; before {dict(tot_b)}, after {dict(tot_a) or 0}")


if __name__ == "__main__":
    main()
