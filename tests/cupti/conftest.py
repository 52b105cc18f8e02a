"""cupti-python stand-in for the CPU tests of the CUPTI collector.

``FakeCupti`` implements the handful of cupti-python calls the collector makes and emulates the CUPTI
behaviour that matters here: records are handed over only on flush (in several buffers), every CUDA
API call gets a fresh correlation id, and a call made while an external id is pushed yields an
EXTERNAL_CORRELATION record carrying the top of the stack.
"""

from __future__ import annotations

import os
import sys
import threading
import types
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from ep_trace.capture.cupti import collector as col


class FakeCupti:
    class ActivityKind:
        MEMCPY, MEMSET, DRIVER, RUNTIME, CONCURRENT_KERNEL, EXTERNAL_CORRELATION = 1, 2, 4, 5, 10, 39

    class ExternalCorrelationKind:
        CUSTOM0, CUSTOM1, CUSTOM2 = 3, 4, 5

    class CallbackDomain:
        DRIVER_API, RUNTIME_API = 1, 2

    def __init__(self, fail_enable: bool = False) -> None:
        self.fail_enable = fail_enable
        self.enabled: list[int] = []
        self.pending: list[SimpleNamespace] = []
        self.stack: list[tuple[int, int]] = []
        self.clock = 5_000
        self.corr = 0
        self.completed = None
        self.flushes = 0
        self.muted: list[tuple[str, int, int]] = []

    # --- the cupti-python calls the collector makes
    def activity_register_callbacks(self, requested, completed) -> None:
        assert requested() == (8 * 1024 * 1024, 0)
        self.completed = completed

    def activity_enable(self, kind: int) -> None:
        if self.fail_enable:
            raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
        self.enabled.append(int(kind))

    def activity_enable_runtime_api(self, cbid: int, enable: int) -> None:
        self.muted.append(("runtime", cbid, enable))

    def activity_enable_driver_api(self, cbid: int, enable: int) -> None:
        self.muted.append(("driver", cbid, enable))

    def activity_disable(self, kind: int) -> None:
        self.enabled.remove(int(kind))

    def get_timestamp(self) -> int:
        self.clock += 10
        return self.clock

    def activity_push_external_correlation_id(self, kind: int, ext: int) -> None:
        self.stack.append((kind, ext))

    def activity_pop_external_correlation_id(self, kind: int) -> None:
        assert self.stack.pop()[0] == kind

    def activity_flush_all(self, flag: int) -> None:
        assert flag == 1
        self.flushes += 1
        batch, self.pending = self.pending, []
        for i in range(0, len(batch), 3):  # several buffers per flush
            self.completed(batch[i : i + 3])

    def get_callback_name(self, domain: int, cbid: int) -> str:
        return {(2, 211): "cudaLaunchKernel_v7000", (1, 652): "cuLaunchKernelEx"}[(domain, cbid)]

    # --- emulation of a CUDA launch as CUPTI reports it
    def launch(self, name: str, dur: int, stream: int = 7, driver: bool = False) -> None:
        self.corr += 1
        t = self.get_timestamp()
        kind, cbid = (4, 652) if driver else (5, 211)
        self.pending.append(
            SimpleNamespace(
                kind=kind,
                cbid=cbid,
                start=t,
                end=t + 5,
                process_id=os.getpid(),
                thread_id=threading.get_native_id(),
                correlation_id=self.corr,
                return_value=0,
            )
        )
        if self.stack:
            self.pending.append(
                SimpleNamespace(
                    kind=39, external_kind=self.stack[-1][0], external_id=self.stack[-1][1], correlation_id=self.corr
                )
            )
        self.pending.append(
            SimpleNamespace(
                kind=10,
                start=t + 20,
                end=t + 20 + dur,
                device_id=0,
                context_id=1,
                stream_id=stream,
                correlation_id=self.corr,
                name=name,
                grid_x=1,
            )
        )


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCupti]:
    """A FakeCupti importable as ``from cupti import cupti``; the collector believes one GPU is visible."""
    f = FakeCupti()
    pkg = types.ModuleType("cupti")
    pkg.cupti = f  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupti", pkg)
    monkeypatch.setattr(col, "_cuda_device_count", lambda: 1)
    yield f
    assert col.active() is None
