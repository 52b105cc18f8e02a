"""gloo's transfer threads on SCHED_FIFO (workloads.comm_priority): which threads, the fallbacks, the errors."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from ep_trace.errors import ConfigError
from ep_trace.workloads import comm_priority as cp

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names and SCHED_FIFO are Linux")


@contextmanager
def _named_thread(name: str) -> Iterator[int]:
    """A thread whose OS name (``/proc/self/task/<tid>/comm``) is ``name``, alive inside; yields its tid."""
    ready, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def body() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME: what gloo's c10::setThreadName does
        tid.append(threading.get_native_id())
        ready.set()
        stop.wait()

    t = threading.Thread(target=body)
    t.start()
    ready.wait()
    try:
        yield tid[0]
    finally:
        stop.set()
        t.join()


def test_unknown_priority_is_one_line() -> None:
    with pytest.raises(ConfigError) as e:
        cp.check_comm_priority("high")
    assert str(e.value) == "--comm-priority: 'high' is not one of auto, realtime, normal"


def test_realtime_without_permission_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cp, "realtime_permitted", lambda: False)
    with pytest.raises(ConfigError) as e:
        cp.require_permission("realtime")
    assert str(e.value) == (
        "--comm-priority realtime: this process may not use SCHED_FIFO; run as root, grant CAP_SYS_NICE "
        "or raise RLIMIT_RTPRIO (ulimit -r 1), or use --comm-priority normal"
    )
    cp.require_permission("auto")  # auto falls back, it does not fail
    cp.require_permission("normal")


@linux_only
def test_only_gloo_threads_move_and_only_when_asked() -> None:
    with (
        _named_thread("pt_gloo_runloop") as gloo,
        _named_thread("gloo_tcp_loop") as loop,
        _named_thread("other") as other,
    ):
        assert cp.prioritize_comm_threads("normal") == "normal"
        assert os.sched_getscheduler(gloo) == os.SCHED_OTHER
        got = cp.prioritize_comm_threads("auto")
        if cp.realtime_permitted():
            assert got == "realtime"
            assert [os.sched_getscheduler(t) for t in (gloo, loop)] == [os.SCHED_FIFO] * 2
            assert os.sched_getparam(gloo).sched_priority == 1
        else:
            assert got == "normal"
            assert os.sched_getscheduler(gloo) == os.SCHED_OTHER
        # the compute threads (here: the test's own and an unrelated one) stay on the fair scheduler
        assert os.sched_getscheduler(other) == os.SCHED_OTHER
        assert os.sched_getscheduler(0) == os.SCHED_OTHER


@linux_only
def test_no_gloo_thread_is_normal() -> None:
    assert cp.prioritize_comm_threads("auto") == "normal"


@linux_only
def test_denied_half_way_is_all_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.sched_setscheduler
    moved: list[tuple[int, int]] = []

    def second_denied(tid: int, policy: int, param: os.sched_param) -> None:
        if policy == os.SCHED_FIFO and any(p == os.SCHED_FIFO for _, p in moved):
            raise PermissionError(1, "Operation not permitted")
        moved.append((tid, policy))
        if policy != os.SCHED_FIFO:  # restoring the fair policy is always allowed
            real(tid, policy, param)

    monkeypatch.setattr(os, "sched_setscheduler", second_denied)
    with _named_thread("pt_gloo_runloop") as a, _named_thread("pt_gloo_runloop") as b:
        assert cp.prioritize_comm_threads("auto") == "normal"
        first = min(a, b)  # threads are visited in tid order
        assert moved == [(first, os.SCHED_FIFO), (first, os.SCHED_OTHER)]
        moved.clear()
        with pytest.raises(ConfigError) as e:
            cp.prioritize_comm_threads("realtime")
        assert str(e.value) == (
            f"--comm-priority realtime: could not move gloo thread {max(a, b)} to SCHED_FIFO (Operation not "
            "permitted); run as root, grant CAP_SYS_NICE or use --comm-priority normal"
        )
