"""The ``decoder`` fixture: a test module that uses it (``pytestmark = pytest.mark.usefixtures("decoder")``)
runs once with the native slice scanner (``ep_trace.parsers._kscan``) and once with polars' reader
(``EP_TRACE_NATIVE=0``); the orjson path, the reference, runs under both where a test asks for it."""

from __future__ import annotations

import pytest

from ep_trace.parsers import kineto_native


@pytest.fixture(params=["native", "polars"])
def decoder(request, monkeypatch):
    if request.param == "native" and not kineto_native.available():
        pytest.skip("ep_trace.parsers._kscan not built")  # test_native_scanner_is_built fails then
    monkeypatch.setenv("EP_TRACE_NATIVE", "1" if request.param == "native" else "0")
    return request.param
