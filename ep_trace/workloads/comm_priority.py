"""The demo's transfer threads progress the way a GPU rank's transfers do: not queued behind compute.

On a GPU rank a transfer has resources of its own (the NIC's DMA engines, copy engines, NCCL's
high-priority streams or DeepEP's reserved SMs), so an all-to-all in flight progresses while the
rank computes. A gloo rank's transfer is CPU work of gloo's threads (torch's ``ProcessGroupGloo``
worker, named ``pt_gloo_runloop`` in ``torch/csrc/distributed/c10d/ProcessGroupGloo.cpp``
``runLoop``, and gloo's TCP event loop ``gloo_tcp_loop``). When the ranks' compute threads keep
every core busy, the fair scheduler queues each wake-up of those threads behind the running compute
for up to a scheduler slice (~1.4 ms on the 2-vCPU VM of benchmarks/README.md, kernel 6.18, EEVDF),
and a pipelined transfer that should run under chunk c's GEMMs is still waiting when chunk c+1
needs it. Measured there (``benchmarks/comm_sched.py``: ``/proc/<tid>/schedstat``, 2 ranks, 512
tokens, no profiler, the same run alternating 1 and 4 chunks): gloo's threads waited 5 ms per step on
the run queue with 1 chunk and 12-16 ms with 4, and 4 chunks cost +8.5-9.9 ms per step; with those
threads on ``SCHED_FIFO`` (priority 1) their run-queue wait fell to 0.2-0.3 ms per step, the 1-chunk
step got 4-5 ms faster, and 4 chunks cost +4.2-4.3 ms. The difference is a property of the CPU
scheduler, not of the EP pipeline a GPU job runs, so the demo gives gloo's threads real-time
priority when the process may.

The compute threads stay on the normal policy (a real-time compute loop would starve the machine);
Linux's real-time throttling (``sched_rt_runtime_us``) caps the transfer threads at 95 % of a core
in any case, and they block (condition variable, epoll) whenever they have nothing to move.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path

from ep_trace.errors import ConfigError

__all__ = [
    "COMM_PRIORITIES",
    "COMM_THREAD_PREFIXES",
    "check_comm_priority",
    "prioritize_comm_threads",
    "realtime_permitted",
    "require_permission",
]

logger = logging.getLogger(__name__)

#: ``--comm-priority`` values: ``auto`` = realtime where permitted, else normal.
COMM_PRIORITIES = ("auto", "realtime", "normal")

#: Thread-name prefixes of gloo's transfer threads (``pt_gloo_runloop``, ``gloo_tcp_loop``).
COMM_THREAD_PREFIXES = ("pt_gloo", "gloo_")

#: SCHED_FIFO priority of the transfer threads: the lowest real-time level, above every normal thread.
_FIFO_PRIORITY = 1


def _supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "sched_setscheduler")


def realtime_permitted() -> bool:
    """Whether this process may put a thread on ``SCHED_FIFO`` (root, ``CAP_SYS_NICE`` or ``RLIMIT_RTPRIO``).

    Tried on a short-lived thread of its own, so that nothing else of the process changes.
    """
    if not _supported():
        return False
    ok: list[bool] = []

    def probe() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(_FIFO_PRIORITY))
            ok.append(True)
        except OSError:
            ok.append(False)

    t = threading.Thread(target=probe, name="ep_trace_rt_probe")
    t.start()
    t.join()
    return bool(ok and ok[0])


def check_comm_priority(priority: str) -> None:
    """Raise :class:`ConfigError` unless ``priority`` is one of :data:`COMM_PRIORITIES`."""
    if priority not in COMM_PRIORITIES:
        raise ConfigError(f"--comm-priority: {priority!r} is not one of {', '.join(COMM_PRIORITIES)}")


def require_permission(priority: str) -> None:
    """Raise :class:`ConfigError` when ``realtime`` is asked for and this process may not use it."""
    if priority == "realtime" and not realtime_permitted():
        raise ConfigError(
            "--comm-priority realtime: this process may not use SCHED_FIFO; run as root, grant CAP_SYS_NICE "
            "or raise RLIMIT_RTPRIO (ulimit -r 1), or use --comm-priority normal"
        )


def _comm_threads() -> list[int]:
    tids = []
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith(COMM_THREAD_PREFIXES):
            tids.append(int(task.name))
    return sorted(tids)


def prioritize_comm_threads(priority: str) -> str:
    """Put this process's gloo transfer threads on ``SCHED_FIFO`` (``realtime``/``auto``) or leave them.

    Call it in a rank after the process group exists and one collective has run (gloo starts its
    threads by then).

    Args:
        priority: One of :data:`COMM_PRIORITIES`.

    Returns:
        What the threads run at: ``realtime`` or ``normal`` (``auto`` without the permission, no
        gloo thread found, or not Linux).

    Raises:
        ConfigError: ``realtime`` was asked for and a thread could not be moved.
    """
    if priority == "normal" or not _supported():
        return "normal"
    tids = _comm_threads()
    if not tids:
        return "normal"
    moved: list[int] = []
    for tid in tids:
        try:
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(_FIFO_PRIORITY))
            moved.append(tid)
        except ProcessLookupError:  # ended meanwhile
            continue
        except PermissionError as e:
            for done in moved:  # all or none: a half-prioritised rank would be neither case
                os.sched_setscheduler(done, os.SCHED_OTHER, os.sched_param(0))
            if priority == "realtime":
                raise ConfigError(
                    f"--comm-priority realtime: could not move gloo thread {tid} to SCHED_FIFO ({e.strerror}); "
                    "run as root, grant CAP_SYS_NICE or use --comm-priority normal"
                ) from e
            logger.info("gloo's threads stay at normal priority: %s", e.strerror)
            return "normal"
    return "realtime" if moved else "normal"
