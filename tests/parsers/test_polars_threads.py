"""ep_trace.parsers.polars_threads: ``--jobs N`` gives polars min(N, CPUs) threads in the driver and
one in each spawned reader worker, never over the user's ``POLARS_MAX_THREADS`` and never once
polars is loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ep_trace.parsers import polars_threads
from ep_trace.parsers.engines import local_executor

_PROBE = (
    "import json, os\n"
    "{pre}"
    "from ep_trace.parsers.polars_threads import configure_threads\n"
    "done = configure_threads({jobs})\n"
    "import polars\n"
    "print(json.dumps([done, polars.thread_pool_size()]))\n"
)


def _probe(jobs: int, pre: str = "", user: str | None = None) -> tuple[bool, int]:
    env = {k: v for k, v in os.environ.items() if k not in ("POLARS_MAX_THREADS", "EP_TRACE_CHOSE_POLARS_THREADS")}
    if user is not None:
        env["POLARS_MAX_THREADS"] = user
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(pre=pre, jobs=jobs)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    done, size = json.loads(out.stdout.strip().splitlines()[-1])
    return done, size


def test_jobs_sets_the_pool_size_capped_by_the_cpus() -> None:
    assert _probe(1) == (True, 1)
    cpus = len(os.sched_getaffinity(0))
    assert _probe(64) == (True, min(64, cpus))


def test_user_value_is_kept() -> None:
    assert _probe(1, user="2") == (False, 2)


def test_no_effect_once_polars_is_loaded() -> None:
    done, size = _probe(1, pre="import polars\n")
    assert not done
    assert size == len(os.sched_getaffinity(0))  # polars' own default: every CPU


def _worker_pool_size() -> int:
    import polars

    return polars.thread_pool_size()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to tell 1 thread from the default")
def test_workers_get_one_thread_when_the_command_line_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLARS_MAX_THREADS", "2")
    monkeypatch.setenv("EP_TRACE_CHOSE_POLARS_THREADS", "1")
    assert polars_threads.worker_threads() == "1"
    with local_executor(1) as pool:
        assert pool.submit(_worker_pool_size).result(timeout=120) == 1
    monkeypatch.delenv("EP_TRACE_CHOSE_POLARS_THREADS")  # the user's 2: workers keep it
    assert polars_threads.worker_threads() is None
    with local_executor(1) as pool:
        assert pool.submit(_worker_pool_size).result(timeout=120) == 2
