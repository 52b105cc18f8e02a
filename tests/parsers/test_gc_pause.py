"""The cyclic collector is held off during a Kineto read and restored after it, also across threads."""

from __future__ import annotations

import gc
import json
import threading
from pathlib import Path

import pytest

from ep_trace.errors import TraceFormatError
from ep_trace.parsers import gc_pause
from ep_trace.parsers.kineto import read_kineto_file
from ep_trace.parsers.kineto_files import read_kineto_files


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def _trace(tmp_path: Path, events: object) -> Path:
    p = tmp_path / "rank0.pt.trace.json"
    p.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events, "baseTimeNanoseconds": 10}))
    return p


def test_paused_nests_and_restores(collector_on):
    with gc_pause.paused():
        assert not gc.isenabled()
        with gc_pause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still runs
    assert gc.isenabled()


def test_paused_keeps_a_collector_the_program_turned_off(collector_on):
    gc.disable()
    with gc_pause.paused():
        pass
    assert not gc.isenabled()


def test_paused_restores_after_an_error(collector_on):
    with pytest.raises(ValueError), gc_pause.paused():
        raise ValueError("x")
    assert gc.isenabled()


def test_paused_in_two_threads_turns_on_after_the_last(collector_on):
    inside, release = threading.Barrier(2), threading.Event()
    seen = []

    def read() -> None:
        with gc_pause.paused():
            inside.wait()
            release.wait()
        seen.append(gc.isenabled())

    t = threading.Thread(target=read)
    t.start()
    with gc_pause.paused():
        inside.wait()
        release.set()
        t.join()
        assert seen == [False]  # the other thread's block ended while this one runs: still off
    assert gc.isenabled()


def test_reads_leave_the_collector_on(tmp_path, collector_on):
    ev = {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 2, "ts": 1.0, "dur": 2.0}
    good = _trace(tmp_path, [ev])
    read_kineto_file(good)
    assert gc.isenabled()
    read_kineto_files([good, good], None)
    assert gc.isenabled()
    bad = _trace(tmp_path, [{**ev, "ts": "x"}])
    with pytest.raises(TraceFormatError):
        read_kineto_file(bad)
    assert gc.isenabled()
