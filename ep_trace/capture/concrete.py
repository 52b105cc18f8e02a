"""torch.profiler's ``Concrete Inputs``, recorded only where they are needed.

With ``record_shapes=True`` torch writes op arguments as ``Concrete Inputs``: plain scalars always,
scalar lists (a dim list, a collective's split sizes) while a process-wide switch is on, which it
is by default (``record_concrete_inputs_enabled_fn`` returns true and ``isSupportedScalarList``
reads it, ``torch/csrc/profiler/collection.cpp``). gloo's split lists exist only there (arguments 3
and 4 of the ``c10d::alltoall_base_`` op), so without them a trace has no split sizes unless the
sidecar has them (:func:`ep_trace.record_a2a`).

The cost is measured here on torch 2.13.0+cpu (2-vCPU VM), in a fresh process, 200 x ``y = x * 2.0``
on a 4 MB tensor under ``torch.profiler.profile(record_shapes=True)``:

* switch on: 7.0-11.3 ms per op and +837-865 MB of RSS in 4 of 5 processes (0.19 ms and +97 MB in
  the fifth). 837-865 MB is about the bytes of all 200 outputs: memory was not reused while the
  profiler ran, and every op faulted in fresh pages. Why an op without a list argument pays, the
  torch source did not tell; the measurement is what this module acts on;
* switch off: 0.17-0.50 ms per op and +97-113 MB in 5 of 5.

In the demo (benchmarks/README.md, stop 21), the 2-rank 1-chunk step went from 62-75 ms to 43 ms at
512 tokens and from 213 ms to 129 ms at 2048 tokens. The in-step 4 MB all-to-all's median wait-free
transfer went from 7.2 ms to 1.8 ms. In the 4-rank README example, permute went from 9-12 ms per
step on ranks 2-3 to 0.6-2.8 ms, and the step from 140-157 ms to 128-136 ms. A profiler that
changes what it measures that much gives a wrong verdict, so
:class:`~ep_trace.capture.tracer.Tracer` can turn the recording off (``concrete_inputs=False``),
and code that needs it for one call wraps that call in :func:`collective_inputs`. The demo does
this around its all-to-alls: their split lists stay in the trace, and no other op records its lists.

The switch is torch's one process-wide flag (``torch._C._profiler._set_record_concrete_inputs_enabled_val``,
private; missing in old releases, where nothing is changed). Python cannot read it, so when the
last Tracer that turned it off stops, it is set back to torch's default (on).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["collective_inputs", "suppress", "restore"]

_lock = threading.Lock()
_off = 0  # running Tracers that turned the recording off (mirrors torch's own global flag)


def _setter() -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover - capture needs torch; this only keeps imports cheap
        return None
    return getattr(torch._C._profiler, "_set_record_concrete_inputs_enabled_val", None)


def suppress() -> bool:
    """Turn the recording off for a starting Tracer. Returns False where torch has no switch."""
    global _off
    set_val = _setter()
    if set_val is None:
        return False
    with _lock:
        _off += 1
        set_val(False)
    return True


def restore() -> None:
    """Undo one :func:`suppress`; the last one sets torch's default (on) again."""
    global _off
    set_val = _setter()
    if set_val is None:
        return
    with _lock:
        _off = max(_off - 1, 0)
        if _off == 0:
            set_val(True)


@contextmanager
def collective_inputs() -> Iterator[None]:
    """Record ``Concrete Inputs`` inside the block (the split lists of a collective issued in it).

    A no-op unless a running Tracer turned the recording off.

    Example:
        >>> with collective_inputs():  # doctest: +SKIP
        ...     dist.all_to_all_single(out, inp, out_splits, in_splits)
    """
    set_val = _setter() if _off else None
    if set_val is None:
        yield
        return
    set_val(True)
    try:
        yield
    finally:
        with _lock:
            set_val(_off == 0)
