"""Fuzz driver: mutated cases (tests/robustness/campaign.py) run by worker processes under a time and
a memory limit; each outcome classified (tests/robustness/outcomes.py) and tabulated per class.

Used by tests/robustness/test_fuzz.py (a few cases) and, for the long campaign::

    python tests/robustness/fuzz.py --cases 10000 --workers 4 --out fuzz_results.json

(or ``pytest --fuzz-long``). Every case's input files are hashed before and after its run: a run that
changes or removes one, or writes a trace-named file into its input directory, is ``modified``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import attacks  # noqa: E402
import campaign  # noqa: E402
from outcomes import ACCEPTABLE, OUTCOMES  # noqa: E402

#: Per-case wall-clock limit (seconds): a hang is a contract violation.
CASE_TIMEOUT_S = 60.0


class Worker:
    """One long-lived worker process (imports paid once), restarted after a hang or a death."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.cache_dir = cache_dir

    def _start(self) -> subprocess.Popen[str]:
        env = dict(os.environ, POLARS_MAX_THREADS="1")
        if self.cache_dir is not None:
            env["EP_TRACE_CACHE_DIR"] = str(self.cache_dir)
        return subprocess.Popen(
            [sys.executable, str(HERE / "fuzz_worker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def run(self, case: Path, keep_going: bool = False, timeout_s: float = CASE_TIMEOUT_S) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"case": str(case), "keep_going": keep_going}) + "\n")
        self.proc.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout_s)
        sel.close()
        if not ready:
            self.kill()
            return {"outcome": "hang", "detail": f"no answer in {timeout_s:.0f} s"}
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.proc = None
            # SIGKILL / SIGABRT under the address-space cap: the allocation failed; SIGSEGV: a crash
            outcome = "blowup" if code in (-9, -6) else "crash"
            return {"outcome": outcome, "detail": f"worker died with code {code}"}
        return dict(json.loads(line))

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


_SKIP = (".case.json", ".cache", ".edit", "out")


def snapshot(case: Path) -> dict[str, str]:
    """sha256 of every input file of the case (not its plan, cache, planned edits or outputs)."""
    out = {}
    for p in case.rglob("*"):
        rel = p.relative_to(case)
        if rel.parts[0] in _SKIP or p.is_symlink() or not p.is_file():
            continue
        out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def touched(case: Path, before: dict[str, str], plan: dict[str, Any]) -> str | None:
    """What the run did to its inputs: a changed or removed file, or a new trace-named file in the
    input directory (read as a rank by the next run); None if nothing."""
    from ep_trace.parsers.dispatch import detect_format

    edited = {str(Path(plan.get("input", ".")) / e["file"]) for e in plan.get("edits", [])}
    after = snapshot(case)
    for rel, h in before.items():
        if rel not in edited and after.get(rel) != h:
            return f"input {rel} {'changed' if rel in after else 'removed'}"
    root = Path(plan.get("input", "."))
    for rel in set(after) - set(before):
        p = Path(rel)
        inside = root == Path(".") or p.is_relative_to(root)
        if (
            inside
            and not any(s.startswith(".") for s in p.parts)
            and detect_format(case / p) in ("kineto", "nsys", "cupti", "sidecar")
        ):
            return f"a trace-named file {rel} written into the input directory"
    return None


def _rm(case: Path) -> None:
    if not case.exists():
        return
    for p in case.rglob("*"):  # FIFOs / loops / dirs made by the filesystem class
        if p.is_symlink() or p.is_fifo():
            p.unlink()
    for p in case.rglob("*"):
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(case, ignore_errors=True)


def run_campaign(
    n_per_class: int,
    workdir: Path,
    classes: list[str] | None = None,
    seed0: int = 0,
    log: Any = None,
    workers: int = 1,
    deadline: float | None = None,
    checkpoint: Path | None = None,
    timeout_s: float = CASE_TIMEOUT_S,
) -> dict[str, Any]:
    """``n_per_class`` seeded cases of every class on ``workers`` worker processes.

    Args:
        classes: The classes (default: the format mutations of tests/robustness/attacks.py; the long
            campaign passes ``campaign.CLASSES``, every class).
        deadline: ``time.time()`` after which no new case starts (the counts say how many ran).
        checkpoint: File the running counts are written to every 100 cases.
        timeout_s: Per-case wall-clock limit.

    Returns:
        ``{"cases", "seconds", "counts": {class: {outcome: n}}, "violations": [...]}``.
    """
    import threading
    from concurrent.futures import ThreadPoolExecutor

    classes = classes or list(attacks.CLASSES)
    counts: dict[str, Counter[str]] = {c: Counter() for c in classes}
    bad: list[dict[str, Any]] = []
    lock = threading.Lock()
    t0 = time.monotonic()
    items = [(cls, seed0 + i) for i in range(n_per_class) for cls in classes]
    done = [0]

    def snapshot_counts() -> dict[str, Any]:
        return {
            "cases": sum(sum(c.values()) for c in counts.values()),
            "seconds": round(time.monotonic() - t0, 1),
            "counts": {c: dict(v) for c, v in counts.items()},
            "violations": list(bad),
        }

    def lane(k: int) -> None:
        worker = Worker(workdir / f"cache-w{k}")
        try:
            for cls, seed in items[k::workers]:
                if deadline is not None and time.time() > deadline:
                    return
                try:
                    case = campaign.make_case(cls, seed, workdir / f"w{k}")
                except Exception as exc:  # noqa: BLE001 - a mutation that does not apply
                    with lock:
                        counts[cls]["skipped"] += 1
                    if log:
                        log(f"{cls}:{seed} mutation failed: {type(exc).__name__}: {exc}")
                    continue
                plan = campaign.read_plan(case)
                before = snapshot(case)
                # odd seeds run with --keep-going (on_error="skip"): it must skip and name, never crash
                res = worker.run(case, keep_going=seed % 2 == 1, timeout_s=timeout_s)
                harm = touched(case, before, plan)
                if harm:
                    res = {"outcome": "modified", "detail": harm}
                _rm(case)
                with lock:
                    counts[cls][res["outcome"]] += 1
                    done[0] += 1
                    if res["outcome"] not in ACCEPTABLE:
                        bad.append({"class": cls, "seed": seed, "variant": plan.get("variant"), **res})
                        if log:
                            log(f"VIOLATION {cls}:{seed} {plan.get('variant', '')} {res}")
                    if checkpoint is not None and done[0] % 100 == 0:
                        checkpoint.write_text(json.dumps(snapshot_counts(), indent=1))
        finally:
            worker.kill()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lane, range(workers)))
    out = snapshot_counts()
    if checkpoint is not None:
        checkpoint.write_text(json.dumps(out, indent=1))
    return out


def table(result: dict[str, Any]) -> str:
    """Markdown table: cases per class x outcome (classes marked * rely on the parser checks of
    issue 40 items 1, 2 and 4: campaign.NEEDS_PARSER_CHECKS)."""
    lines = ["| class | " + " | ".join(OUTCOMES) + " |", "|---" * (len(OUTCOMES) + 1) + "|"]
    for cls, c in result["counts"].items():
        mark = "*" if cls in campaign.NEEDS_PARSER_CHECKS else ""
        lines.append(f"| {cls}{mark} | " + " | ".join(str(c.get(o, 0)) for o in OUTCOMES) + " |")
    total = Counter()
    for c in result["counts"].values():
        total.update(c)
    lines.append("| **all** | " + " | ".join(str(total.get(o, 0)) for o in OUTCOMES) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10_000, help="total cases (split evenly over the classes)")
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=None, help="JSON results (also a checkpoint every 100 cases)")
    ap.add_argument("--workers", type=int, default=1, help="worker processes at once")
    ap.add_argument("--minutes", type=float, default=None, help="stop starting new cases after this long")
    ap.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S, help="seconds per case before 'hang'")
    ap.add_argument("--classes", default=None, help="comma-separated classes (default: all of campaign.CLASSES)")
    args = ap.parse_args()
    classes = args.classes.split(",") if args.classes else list(campaign.CLASSES)
    unknown = set(classes) - set(campaign.CLASSES)
    if unknown:
        ap.error(f"unknown classes: {', '.join(sorted(unknown))}")
    per = max(1, -(-args.cases // len(classes)))
    deadline = time.time() + 60 * args.minutes if args.minutes else None
    with tempfile.TemporaryDirectory(prefix="ep-fuzz-") as tmp:
        res = run_campaign(
            per,
            Path(tmp),
            classes=classes,
            seed0=args.seed,
            log=lambda m: print(m, flush=True),
            workers=args.workers,
            deadline=deadline,
            checkpoint=args.out,
            timeout_s=args.timeout,
        )
    print(table(res))
    print(f"{res['cases']} cases in {res['seconds']} s, {len(res['violations'])} violations")
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
