"""Fuzz driver: mutated cases (tests/robustness/attacks.py) run by a worker process under a time
and a memory limit; the results tabulated as cases per class x outcome.

Used by tests/robustness/test_fuzz.py (a few hundred cases) and, for the long campaign,
``python tests/robustness/fuzz.py --cases 10000 --out fuzz_results.json`` (or ``pytest --fuzz-long``).
"""

from __future__ import annotations

import argparse
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

#: Per-case wall-clock limit (seconds): a hang is a contract violation.
CASE_TIMEOUT_S = 60.0


class Worker:
    """One long-lived worker process (imports paid once), restarted after a hang or a death."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        env = dict(os.environ, POLARS_MAX_THREADS="1")
        return subprocess.Popen(
            [sys.executable, str(HERE / "fuzz_worker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def run(
        self, case: Path, parquet: bool, keep_going: bool = False, timeout_s: float = CASE_TIMEOUT_S
    ) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        req = {"case": str(case), "parquet": parquet, "keep_going": keep_going}
        self.proc.stdin.write(json.dumps(req) + "\n")
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
            outcome = "memory" if code in (-9, -6, -11) else "crash"
            return {"outcome": outcome, "detail": f"worker died with code {code} (memory cap or abort)"}
        return json.loads(line)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def run_campaign(
    n_per_class: int,
    workdir: Path,
    classes: list[str] | None = None,
    seed0: int = 0,
    log: Any = None,
    workers: int = 1,
    deadline: float | None = None,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """``n_per_class`` seeded cases of every class on ``workers`` worker processes.

    Args:
        deadline: ``time.time()`` after which no new case starts (the counts say how many ran).
        checkpoint: File the running counts are written to every 100 cases.

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

    def snapshot() -> dict[str, Any]:
        return {
            "cases": sum(sum(c.values()) for c in counts.values()),
            "seconds": round(time.monotonic() - t0, 1),
            "counts": {c: dict(v) for c, v in counts.items()},
            "violations": list(bad),
        }

    def lane(k: int) -> None:
        worker = Worker()
        try:
            for cls, seed in items[k::workers]:
                if deadline is not None and time.time() > deadline:
                    return
                try:
                    case = attacks.make_case(cls, seed, workdir / f"w{k}")
                except Exception as exc:  # noqa: BLE001 - a mutation that does not apply
                    with lock:
                        counts[cls]["skipped"] += 1
                    if log:
                        log(f"{cls}:{seed} mutation failed: {exc}")
                    continue
                # odd seeds run with on_error="skip" (--keep-going): it must skip and name, never crash
                res = worker.run(case, parquet=attacks.CLASSES[cls][0] == "parquet", keep_going=seed % 2 == 1)
                _rm(case)
                with lock:
                    counts[cls][res["outcome"]] += 1
                    done[0] += 1
                    if res["outcome"] not in ("ok", "nothing", "error"):
                        bad.append({"class": cls, "seed": seed, **res})
                        if log:
                            log(f"VIOLATION {cls}:{seed} {res}")
                    if checkpoint is not None and done[0] % 100 == 0:
                        checkpoint.write_text(json.dumps(snapshot(), indent=1))
        finally:
            worker.kill()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lane, range(workers)))
    out = snapshot()
    if checkpoint is not None:
        checkpoint.write_text(json.dumps(out, indent=1))
    return out


def _rm(case: Path) -> None:
    for p in case.rglob("*"):  # FIFOs / loops / dirs made by the filesystem class
        if p.is_symlink() or p.is_fifo():
            p.unlink()
    shutil.rmtree(case, ignore_errors=True)


def table(result: dict[str, Any]) -> str:
    """Markdown table: cases per class x outcome."""
    outcomes = ["ok", "nothing", "error", "insane", "crash", "memory", "hang", "skipped"]
    lines = ["| class | " + " | ".join(outcomes) + " |", "|---" * (len(outcomes) + 1) + "|"]
    for cls, c in result["counts"].items():
        lines.append(f"| {cls} | " + " | ".join(str(c.get(o, 0)) for o in outcomes) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", type=int, default=10_000, help="total cases (split evenly over the classes)")
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=None, help="JSON results (also a checkpoint every 100 cases)")
    ap.add_argument("--workers", type=int, default=1, help="worker processes at once")
    ap.add_argument("--minutes", type=float, default=None, help="stop starting new cases after this long")
    args = ap.parse_args()
    per = max(1, -(-args.cases // len(attacks.CLASSES)))
    deadline = time.time() + 60 * args.minutes if args.minutes else None
    with tempfile.TemporaryDirectory(prefix="ep-fuzz-") as tmp:
        res = run_campaign(
            per,
            Path(tmp),
            seed0=args.seed,
            log=lambda m: print(m, flush=True),
            workers=args.workers,
            deadline=deadline,
            checkpoint=args.out,
        )
    print(table(res))
    print(f"{res['cases']} cases in {res['seconds']} s, {len(res['violations'])} violations")
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
