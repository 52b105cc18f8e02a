"""Fuzz worker: reads ``{"case": path, "parquet": bool}`` lines on stdin, runs ep-trace on each
under a memory cap and answers one JSON line per case: ``{"outcome": ..., "detail": ...}``.

Outcomes: ``ok`` (exit 0, numbers sane), ``nothing`` (exit 1, NothingToAnalyzeError), ``error``
(exit 2, an EpTraceError on one line), ``insane`` (exit 0 with a number that breaks an invariant),
``crash`` (any other exception: the contract is broken), ``memory`` (MemoryError under the cap).
The parent (tests/robustness/fuzz.py) kills the worker on a timeout (``hang``) and restarts it.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import traceback
from typing import Any

#: Address-space cap of the worker: the issue's contract is <= 4 GB for inputs under 100 MB.
MEM_CAP = 4 << 30


def insane(summary: dict[str, Any]) -> str | None:
    """The first broken invariant of a summary, or None."""
    bad: list[str] = []

    def walk(o: Any, path: str) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{path}.{k}")
        elif isinstance(o, list):
            for i, v in enumerate(o):
                walk(v, f"{path}[{i}]")
        elif isinstance(o, float) and not math.isfinite(o):
            bad.append(f"{path}={o}")
        elif isinstance(o, (int, float)) and not isinstance(o, bool):
            leaf = path.rsplit(".", 1)[-1]
            signed = any(w in leaf for w in ("offset", "delta", "lateness", "skew"))
            # a what-if row may lengthen the step (docs/summary.md: chunking ranks whose transfers
            # cannot hide); a finding's saving may not
            signed = signed or (path.startswith(".whatif[") and leaf == "saving_ns")
            if leaf.endswith("_ns") and not signed and o < 0:
                bad.append(f"{path}={o} < 0")
            if "overlap" in leaf and not leaf.endswith("_ns") and not 0 <= o <= 1:  # a ratio, not a time
                bad.append(f"{path}={o} not in [0, 1]")

    walk(summary, "")
    rows = list(summary.get("ranks") or [])
    overall = summary.get("overall") or {}
    breakdown = list(summary.get("breakdown") or [])
    for b in breakdown:  # the parts of a step add up to it (means rounded to 1 ns each)
        parts = [
            b.get(k)
            for k in (
                "compute_ns",
                "overlapped_comm_ns",
                "exposed_comm_ns",
                "barrier_wait_ns",
                "copy_ns",
                "host_stall_ns",
                "idle_ns",
            )
        ]
        st = b.get("step_time_ns")
        if all(isinstance(x, int) for x in parts) and isinstance(st, int) and abs(sum(parts) - st) > 7:
            bad.append(f"breakdown of rank {b.get('rank')}: parts sum to {sum(parts)}, step is {st}")
    for r in rows + [overall] + breakdown:
        st = r.get("step_time_ns")
        for key in ("barrier_wait_ns", "exposed_comm_ns"):
            v = r.get(key)
            if isinstance(st, (int, float)) and isinstance(v, (int, float)) and v > st * 1.0001 + 1000:
                bad.append(f"{key}={v} > step_time_ns={st} (rank {r.get('rank')})")
    # the invariants the analysis' last pass enforces, on the published summary (ep_trace.analysis.invariants)
    from ep_trace.analysis.invariants import summary_violations

    bad += summary_violations(summary)
    return bad[0] if bad else None


def run_case(case: str, parquet: bool, keep_going: bool = False) -> dict[str, Any]:
    import ep_trace
    from ep_trace.errors import EpTraceError, NothingToAnalyzeError

    try:
        if parquet:
            from ep_trace.analysis import AnalysisConfig, analyze
            from ep_trace.parsers.parquet_io import read_parquet

            analysis = analyze(read_parquet(f"{case}/tables"), AnalysisConfig())
        else:
            analysis = ep_trace.load(case, on_error="skip" if keep_going else "raise")
        summary = analysis.summary()
        from ep_trace.analysis.invariants import violations

        left = violations(analysis)  # what the invariants pass left: nothing, or it published a broken figure
        why = insane(summary) or (f"{left['invariant'][0]}: {left['reason'][0]}" if left.height else None)
        return {"outcome": "insane", "detail": why} if why else {"outcome": "ok", "detail": ""}
    except NothingToAnalyzeError as exc:
        return {"outcome": "nothing", "detail": str(exc)[:300]}
    except EpTraceError as exc:
        one_line = "\n" not in str(exc)
        return {"outcome": "error" if one_line else "crash", "detail": str(exc)[:300]}
    except MemoryError:
        return {"outcome": "memory", "detail": "MemoryError"}
    except Exception as exc:  # noqa: BLE001 - the contract forbids any other exception
        tb = traceback.extract_tb(exc.__traceback__)[-1]
        return {"outcome": "crash", "detail": f"{type(exc).__name__}: {str(exc)[:200]} @ {tb.filename}:{tb.lineno}"}


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEM_CAP, MEM_CAP))
    import ep_trace  # noqa: F401 - warm the imports before the first case

    for line in sys.stdin:
        req = json.loads(line)
        res = run_case(req["case"], req.get("parquet", False), req.get("keep_going", False))
        sys.stdout.write(json.dumps(res) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
