"""Fuzz worker: reads ``{"case": path, "keep_going": bool}`` lines on stdin, runs the case's plan
(``<case>/.case.json``, tests/robustness/campaign.py) under an address-space cap and answers one JSON
line per case: ``{"outcome": ..., "detail": ...}`` (outcomes: tests/robustness/outcomes.py).

The parent (tests/robustness/fuzz.py) kills the worker on a timeout (``hang``), restarts it after a
death (``blowup`` / ``crash``), and checks that no input file changed (``modified``).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import resource
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from outcomes import classify_cli, classify_summary, insane  # noqa: E402

__all__ = ["MEM_CAP", "insane", "run_case"]

#: Address-space cap of the worker: the issue's contract is <= 4 GB for inputs under 100 MB.
MEM_CAP = 4 << 30


def _plan(case: Path) -> dict[str, Any]:
    p = case / ".case.json"
    return json.loads(p.read_text()) if p.is_file() else {"mode": "load", "expect": "any", "input": "."}


def _load(case: Path, plan: dict[str, Any], keep_going: bool, cache: bool | Path = False) -> dict[str, Any]:
    import ep_trace

    if plan.get("parquet"):
        from ep_trace.analysis import AnalysisConfig, analyze
        from ep_trace.parsers.parquet_io import read_parquet

        return analyze(read_parquet(case / "tables"), AnalysisConfig()).summary()
    path = case / plan.get("input", ".")
    return ep_trace.load(path, on_error="skip" if keep_going else "raise", cache=cache).summary()


def _cache_run(case: Path, plan: dict[str, Any], keep_going: bool) -> dict[str, str]:
    """Analyse with a cache, swap the planned files keeping size and mtime, analyse again with the
    cache and once without: the cached answer must be the fresh one."""
    root = case / ".cache"
    _load(case, plan, keep_going, root)
    for e in plan["edits"]:
        f = case / plan.get("input", ".") / e["file"]
        st = f.stat()
        f.write_bytes((case / plan.get("input", ".") / e["data_from"]).read_bytes())
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # cp -p / rsync --times
    cached = _load(case, plan, keep_going, root)
    fresh = _load(case, plan, keep_going, False)
    if json.dumps(cached, sort_keys=True, default=str) != json.dumps(fresh, sort_keys=True, default=str):
        return {"outcome": "wrong", "detail": "the cache returned the analysis of the file before the edit"}
    return classify_summary(fresh, plan.get("expect", "any"))


def _cli_run(case: Path, plan: dict[str, Any], keep_going: bool) -> dict[str, str]:
    from ep_trace.cli import main

    argv = list(plan["argv"])
    if keep_going and argv and argv[0] in ("analyze", "ingest", "annotate", "compare", "sweep") and len(argv) > 1:
        argv.append("--keep-going")
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    logging.root.handlers.clear()  # main() binds its log handler to the stderr of this case
    os.environ["EP_TRACE_CACHE_DIR"] = str(case / ".cache")  # no case reads another's cached tables
    try:
        os.chdir(case)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        os.chdir(cwd)
    return classify_cli(code, out.getvalue(), err.getvalue(), case, plan)


def run_case(case: str, keep_going: bool = False) -> dict[str, Any]:
    """Run one case by its plan; the outcome and a detail (tests/robustness/outcomes.py)."""
    from ep_trace.errors import EpTraceError, NothingToAnalyzeError

    c = Path(case)
    plan = _plan(c)
    try:
        if plan["mode"] == "cli":
            return _cli_run(c, plan, keep_going)
        if plan["mode"] == "cache":
            return _cache_run(c, plan, keep_going)
        return classify_summary(_load(c, plan, keep_going), plan.get("expect", "any"))
    except NothingToAnalyzeError as exc:
        one = len(str(exc).splitlines()) == 1
        return {"outcome": "nothing" if one else "bad_message", "detail": str(exc)[:300]}
    except EpTraceError as exc:
        one = len(str(exc).splitlines()) == 1
        return {"outcome": "error" if one else "bad_message", "detail": str(exc)[:300]}
    except MemoryError:
        return {"outcome": "blowup", "detail": "MemoryError"}
    except Exception as exc:  # noqa: BLE001 - the contract forbids any other exception
        tb = traceback.extract_tb(exc.__traceback__)[-1]
        return {"outcome": "crash", "detail": f"{type(exc).__name__}: {str(exc)[:200]} @ {tb.filename}:{tb.lineno}"}


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEM_CAP, MEM_CAP))
    # the answers go to the parent on a descriptor of their own: whatever a case prints to fd 1 (a C
    # library, a stray print) must not be read as an answer
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    import ep_trace  # noqa: F401 - warm the imports before the first case
    import ep_trace.cli  # noqa: F401

    for line in sys.stdin:
        req = json.loads(line)
        res = run_case(req["case"], req.get("keep_going", False))
        answers.write(json.dumps(res) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
