"""In-process CUPTI activity collector (extra ``cupti``). Importing this package never needs a GPU.

Modules: :mod:`~ep_trace.capture.cupti.collector` (``CuptiCollector``: cupti-python activity API ->
per-step Parquet; the only module that imports cupti, and only in ``start()``),
:mod:`~ep_trace.capture.cupti.convert` (pure: activity records as dicts -> canonical ``events``),
:mod:`~ep_trace.capture.cupti.writer` (the ``rank{r}.ep-events.parquet`` layout, read back by
``ep_trace.parsers.cupti.read_cupti``).
``Tracer(..., backend="cupti")`` drives the collector; ``stage()`` reaches it through
``ep_trace.capture.stages._CUPTI``.
"""
