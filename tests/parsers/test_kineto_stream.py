"""``kineto_stream._last_boundary`` (found backwards from the end) is the last match of the
boundary regex in the final window, as iterating every match from the window's start gives."""

from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from ep_trace.parsers import kineto_json, kineto_stream

_TOKENS = st.sampled_from([b"}", b"{", b",", b" ", b"\n", b"\t", b"\x0b", b"a", b'"', b"},{", b"},\n  {", b"} , {"])


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(_TOKENS, max_size=60), read=st.integers(1, 40))
def test_last_boundary_equals_the_last_regex_match(parts, read):
    buf = bytearray(b"".join(parts))
    lo = max(0, len(buf) - 2 * read)  # (the window: two reads)
    want = None
    for want in kineto_json._BOUNDARY_RE.finditer(buf, lo):  # noqa: B007 - the last match is wanted
        pass
    with mock.patch.object(kineto_stream, "_READ", read):
        got = kineto_stream._last_boundary(buf)
    assert (got.span() if got else None) == (want.span() if want else None)


def test_last_boundary_golden():
    buf = bytearray(b'[{"a": {"b": 1}},\n  {"c": "},{"}, {"d": 2}')
    m = kineto_stream._last_boundary(buf)
    assert m is not None and bytes(buf[m.start() : m.end()]) == b"}, {"
    assert kineto_stream._last_boundary(bytearray(b'{"a": {"b": 1}}')) is None
