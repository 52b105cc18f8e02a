"""The native slice scanner (``ep_trace.parsers._kscan`` via ``kineto_native``) on tiny inline
slices: each one reads exactly what the orjson path (``kineto._chunk_frame``) reads, or gives up
with a named reason (and the slice goes to the other paths). Never a different value."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ep_trace.errors import TraceFormatError
from ep_trace.parsers import kineto, kineto_columnar, kineto_native, kineto_stream
from ep_trace.parsers.kineto_stream import Slice

_PREFIXES = kineto.ARG_KEEP_PREFIXES
_FLOATS = ("ts", "dur")

needs_native = pytest.mark.skipif(not kineto_native.available(), reason="ep_trace.parsers._kscan not built")


def test_native_scanner_is_built():
    """CI proves the fast path runs: the extension imports unless it is switched off."""
    if os.environ.get("EP_TRACE_NATIVE") == "0":
        pytest.skip("EP_TRACE_NATIVE=0")
    from ep_trace.parsers import _kscan

    assert kineto_native.available() and callable(_kscan.scan)


def _slice(*pieces: bytes) -> Slice:
    return Slice(list(pieces), [b",\n"] * (len(pieces) - 1))


def _reference(sl: Slice) -> tuple[pl.DataFrame, int, list[tuple[int, dict[str, Any]]]]:
    """The orjson path on the slice's text (raises where it refuses the input)."""
    evs = orjson.loads(sl.text)
    kept: dict[int, dict[str, Any]] = {}
    frame = kineto._chunk_frame(evs, 0, Path("t.json"), kept)
    return frame, len(evs), list(kept.items())


def _bits(s: pl.Series) -> list[Any]:
    """Float values by their bits (0.0 and -0.0 apart), nulls as None."""
    v = s.to_numpy(allow_copy=True)
    return [
        None if m else int(b)
        for m, b in zip(s.is_null().to_list(), np.asarray(v, dtype=np.float64).view(np.int64), strict=True)
    ]


def _assert_same(got, want) -> None:
    frame, n, kept = got
    wframe, wn, wkept = want
    assert n == wn
    assert frame.schema == wframe.schema and frame.equals(wframe)
    for c in _FLOATS:
        assert _bits(frame[c]) == _bits(wframe[c])
    assert kept == wkept


def _native(sl: Slice):
    return kineto_native.slice_frame(sl, _PREFIXES)


def _why(text: bytes) -> str | None:
    """The scanner's reason for giving up on one piece, None when it reads it."""
    from ep_trace.parsers import _kscan

    got = _kscan.scan([text], tuple(p.encode() for p in _PREFIXES))
    return got if isinstance(got, str) else None


def _x(**over) -> dict[str, Any]:
    e: dict[str, Any] = {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 7, "tid": 8, "ts": 1.5, "dur": 2}
    e.update(over)
    return e


def _piece(events: list[Any], **dumps) -> bytes:
    return json.dumps(events, **dumps).encode()


# --- read exactly ------------------------------------------------------------------------------


@needs_native
@pytest.mark.parametrize(
    "ev",
    [
        _x(name='q"b\\c/d\n\te\u00e9\U0001f600\x01'),  # every escape, a surrogate pair when ensure_ascii
        _x(name="é 漢字 😀", cat="kernel"),
        _x(pid="Spans", tid="PyTorch Profiler"),  # labels: trailing number, else null
        _x(pid="stream 7 ", tid="GPU 0"),
        _x(pid="", tid="-5"),  # the orjson path keeps the digits only: 5
        _x(pid="007", tid=-549452224),
        _x(ts=4458676522690.655, dur=0.001),
        _x(ts=-0.0, dur=0),
        _x(ts=1694128201435418, dur=52),
        _x(ts=9007199254740993, dur=1e-5),  # 2^53 + 1: strtod's rounding, as float(int)
        _x(ts=8.98846567431158e307, dur=5e-324),  # 2^1023 (a decimal exponent of 308 gives up)
        _x(ts=2.2250738585072011e-308, dur=123456789.12345678),
        _x(cat="gpu_memcpy", args={"bytes": 4096, "correlation": 3, "External id": 11}),
        _x(cat="gpu_memset", args={"bytes": None}),
        _x(cat="cpu_op", args={"bytes": "x", "flag": True}),  # bytes of another category: not read
        _x(cat="kernel", args={"Collective name": None, "correlation": 9}),  # null: still kept
        _x(cat="cpu_op", args={"Collective name": None}),  # not a kernel: not kept
        _x(name="nccl:all_reduce", args={}),  # a marker with empty args: not kept
        _x(name="record_param_comms", args={"Comms Id": 10159970886766084423, "In split size": "[1, 2]"}),
        _x(args={"a": {"b": [1, {"correlation": 5}], "c": "}"}, "correlation": 3}),  # nested: skipped
        _x(name='x},{"ph":"X"', args={"note": "}, {"}),  # boundary text inside strings
        _x(args=None, cat=None, name=None),
        {"ph": "f", "bp": "e", "id": 5, "args": [1, 2], "ts": True},  # not X: only validated
        {"ph": "M", "name": "process_name", "args": {"name": "x"}, "unused": 99999999999999999999999},
        {"ph": 5},
        {},
    ],
)
@pytest.mark.parametrize("dumps", [{}, {"indent": 1}, {"separators": (",", ":")}, {"ensure_ascii": False}])
def test_scanner_reads_what_the_orjson_path_reads(ev, dumps):
    events = [_x(name="aten::mm"), ev, _x(cat="kernel", name="ncclDevKernel", args={"Collective name": "ar"})]
    sl = _slice(_piece(events, **dumps))
    got = _native(sl)
    assert got is not None, _why(sl.pieces[0])
    _assert_same(got, _reference(sl))


@needs_native
def test_events_over_several_pieces_keep_their_ids_and_texts():
    evs = [_x(name=f"nccl:op{i}", args={"correlation": i}) for i in range(6)]
    sl = _slice(_piece(evs[:2]), _piece([{"ph": "M"}, *evs[2:5]], indent=2), _piece(evs[5:]))
    got = _native(sl)
    assert got is not None
    _assert_same(got, _reference(sl))
    assert got[0]["event_id"].to_list() == [0, 1, 3, 4, 5, 6] and [i for i, _ in got[2]] == [0, 1, 3, 4, 5, 6]


@needs_native
@pytest.mark.parametrize("text", [b"[]", b"[ \n ]", b"  [\n]\n"])
def test_empty_pieces(text):
    frame, n, kept = _native(_slice(text))
    assert n == 0 and frame.height == 0 and kept == []
    assert frame.schema == kineto._chunk_frame([], 0, Path("t.json"), {}).schema


# --- give up, with the reason ------------------------------------------------------------------


@needs_native
@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b'[{"ph":"X","name":"a\xffb"}]', "invalid UTF-8"),
        (b'[{"ph":"X","name":"a\xed\xa0\x80"}]', "invalid UTF-8"),  # a surrogate as raw UTF-8
        (b'[{"ph":"X","name":"\\ud800"}]', "lone high surrogate"),
        (b'[{"ph":"X","name":"\\udc00x"}]', "lone low surrogate"),
        (b'[{"ph":"X","name":"\\x"}]', "bad escape"),
        (b'[{"ph":"X","name":"a\tb"}]', "control character in a string"),
        (b'[{"ph":"X","ts":1,"ts":2}]', "duplicate key"),
        (b'[{"ph":"X","args":{"correlation":1,"correlation":2}}]', "duplicate key"),
        (b'[{"ph":"X","\\u0074s":1}]', "escaped key"),
        (b'[{"ph":"\\u0058"}]', "escaped ph"),
        (b'[{"ph":"X","ts":true}]', "ts or dur is no number"),
        (b'[{"ph":"X","dur":"5"}]', "ts or dur is no number"),
        (b'[{"ph":"X","ts":1234567890123456789}]', "unusual ts or dur number"),
        (b'[{"ph":"X","args":{"correlation":1.5}}]', "id or bytes is no int of <= 18 digits"),
        (b'[{"ph":"X","args":{"External id":1e3}}]', "id or bytes is no int of <= 18 digits"),
        (b'[{"ph":"X","args":{"correlation":1152921504606846976}}]', "id or bytes is no int of <= 18 digits"),
        (b'[{"ph":"X","args":{"correlation":"12"}}]', "id or bytes is no number"),
        (b'[{"ph":"X","args":{"correlation":true}}]', "id or bytes is no number"),
        (b'[{"ph":"X","cat":"gpu_memcpy","args":{"bytes":"4096"}}]', "id or bytes is no number"),
        (b'[{"ph":"X","pid":1.5}]', "pid or tid is no int of <= 18 digits"),
        (b'[{"ph":"X","pid":true}]', "pid or tid is a bool or a container"),
        (b'[{"ph":"X","tid":"GPU \\u0661"}]', "pid or tid label with unusual characters"),  # Arabic-Indic 1
        (b'[{"ph":"X","tid":"stream 1234567890123456789"}]', "pid or tid label number of > 18 digits"),
        (b'[{"ph":"X","name":12}]', "cat or name is no string"),
        (b'[{"ph":"X","cat":["kernel"]}]', "cat or name is no string"),
        (b'[{"ph":"X","args":[1]}]', "args is no object"),
        (b'[{"ph":"X","args":"x"}]', "args is no object"),
        (b'[{"ph":"f","args":{"x":1e400}}]', "number near the float range"),
        (b'[{"ph":"f","x":01}]', "',' expected"),
        (b'[{"ph":"f","x":1.}]', "bad number"),
        (b'[{"ph":"f","x":.5}]', "value expected"),
        (b'[{"ph":"f","x":NaN}]', "value expected"),
        (b'[{"ph":"f","x":tru}]', "bad literal"),
        (b'[{"ph":"f"},]', "event is no object"),
        (b'[{"ph":"f"} {"ph":"f"}]', "',' expected"),
        (b'[{"ph":"f",}]', "object key expected"),
        (b"[1]", "event is no object"),
        (b'[{"ph":"f"}] x', "text after the piece's array"),
        (b'[{"ph":"f","x":"abc}]', "unterminated string"),
        (b'[{"ph":"f","x":' + b"[" * 300 + b"]" * 300 + b"}]", "nested too deep"),
    ],
)
def test_scanner_gives_up_on_what_it_does_not_read_plainly(text, why):
    assert _why(text) == why
    assert _native(_slice(text)) is None


@needs_native
def test_given_up_slices_keep_the_orjson_error_word_for_word(tmp_path, monkeypatch):
    """Where the scanner gives up, the other paths decide: the same one-line error as orjson."""
    p = tmp_path / "t.json"
    p.write_bytes(b'{"traceEvents": [{"ph":"X","cat":"cpu_op","name":"k","pid":0,"tid":7,"ts":"soon","dur":1}]}')
    monkeypatch.setenv("EP_TRACE_NATIVE", "0")
    with pytest.raises(TraceFormatError) as want:
        kineto._decode(p, columnar=False)
    monkeypatch.setenv("EP_TRACE_NATIVE", "1")
    with pytest.raises(TraceFormatError) as got:
        kineto._decode(p)
    assert str(got.value) == str(want.value)
    assert "traceEvents[0]: ts has an unusable value 'soon'" in str(got.value)


def test_switched_off_by_the_environment(tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(kineto_native, "slice_frame", lambda *a: calls.append(1))
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [_x()]}))
    monkeypatch.setenv("EP_TRACE_NATIVE", "0")
    kineto._decode(p)
    assert calls == []
    if kineto_native.available():
        monkeypatch.setenv("EP_TRACE_NATIVE", "1")
        kineto._decode(p)  # (the patched scanner returns None: polars' reader takes the slice)
        assert calls == [1]


# --- generated events: the orjson path's values, or a reason ------------------------------------

_NUM_TEXT = st.from_regex(r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][-+]?[0-9]{1,3})?", fullmatch=True)
_TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["Spans", "stream 7 ", "GPU 0", "-5", "", "kernel", "gpu_memcpy", "nccl:x", 'a},{"b']),
)
_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    _TEXT,
    _NUM_TEXT.map(lambda t: ("@num", t)),  # raw number text, put in after json.dumps
)
_VALUE = st.recursive(
    _SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=6
)
_PLAUSIBLE = st.one_of(
    st.integers(-(2**53), 2**53), st.floats(-1e15, 1e15), _TEXT, _NUM_TEXT.map(lambda t: ("@num", t)), st.none()
)
_FIELD = st.sampled_from(["cat", "name", "pid", "tid", "ts", "dur", "ph", "other"])
_ARG = st.sampled_from(["correlation", "External id", "bytes", "Collective name", "other"])


@st.composite
def _events(draw) -> list[Any]:
    evs: list[Any] = []
    for _ in range(draw(st.integers(1, 6))):
        ev: dict[str, Any] = _x(
            cat=draw(st.sampled_from(["kernel", "cpu_op", "gpu_memcpy", "gpu_memset", "cuda_runtime"])),
            name=draw(st.sampled_from(["aten::mm", "nccl:all_reduce", "record_param_comms", "gloo:x", "k"])),
            ts=draw(st.one_of(st.integers(0, 2**53), st.floats(0, 1e12))),
            args={"correlation": draw(st.integers(0, 2**53))},
        )
        # (mostly plausible values: a generated event the reference refuses tests little)
        for field, value in draw(st.lists(st.tuples(_FIELD, st.one_of(_PLAUSIBLE, _VALUE)), max_size=1)):
            ev[field] = value
        for field, value in draw(st.lists(st.tuples(_ARG, st.one_of(_PLAUSIBLE, _VALUE)), max_size=2)):
            if isinstance(ev.get("args"), dict):
                ev["args"][field] = value
        evs.append(ev if draw(st.integers(0, 30)) != 13 else draw(_VALUE))  # (hypothesis favours 0)
    return evs


def _dump(value: Any, nums: list[str]) -> Any:
    """``value`` with each raw number replaced by a placeholder string (see :func:`_events`)."""
    if isinstance(value, tuple) and value and value[0] == "@num":
        nums.append(value[1])
        return f"@num{len(nums) - 1}@"
    if isinstance(value, list):
        return [_dump(v, nums) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v, nums) for k, v in value.items()}
    return value


@needs_native
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    events=_events(), dumps=st.sampled_from([{}, {"indent": 1}, {"separators": (",", ":")}, {"ensure_ascii": False}])
)
def test_generated_events_decode_as_orjson_or_give_up(events, dumps):
    nums: list[str] = []
    text = json.dumps(_dump(events, nums), **dumps)
    for i, t in enumerate(nums):
        text = text.replace(f'"@num{i}@"', t, 1)
    sl = _slice(text.encode())
    got = _native(sl)
    try:
        want = _reference(sl)
    except (orjson.JSONDecodeError, TraceFormatError, TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        assert got is None  # the reference refuses it: the scanner must have given up
        event("reference refuses; scanner gave up")
        return
    event("scanner read it" if got is not None else f"scanner gave up: {_why(sl.pieces[0])}")
    if got is not None:
        _assert_same(got, want)


@needs_native
@settings(max_examples=200, deadline=None)
@given(num=_NUM_TEXT)
def test_number_texts_read_as_orjson_reads_them(num):
    """Every JSON number text (long mantissas, big exponents): orjson's float, or a reason."""
    sl = _slice(f'[{{"ph":"X","ts":{num},"dur":1}}]'.encode())
    got = _native(sl)
    try:
        want = _reference(sl)
    except (orjson.JSONDecodeError, TraceFormatError):
        assert got is None
        return
    if got is not None:
        _assert_same(got, want)
    else:
        event(f"gave up: {_why(sl.pieces[0])}")


def test_work_uses_the_scanner_first(tmp_path, monkeypatch):
    """``_work`` takes the scanner's frame when it gives one (no polars read of that slice)."""
    if not kineto_native.available():
        pytest.skip("ep_trace.parsers._kscan not built")
    monkeypatch.setenv("EP_TRACE_NATIVE", "1")
    monkeypatch.setattr(kineto_columnar, "_slice_frame", lambda *a: pytest.fail("polars path used"))
    frame, n, kept = kineto_columnar._work(_slice(_piece([_x(), {"ph": "M"}])), _PREFIXES)
    assert n == 2 and frame.height == 1


@needs_native
def test_mutated_real_pieces_decode_as_orjson_or_give_up(external_dir):
    """3,000 random byte edits of real ~4 KB pieces (NCCL kernels with Collective names, CPU ops):
    whatever the scanner reads, orjson reads the same; everything else it gives up on (an ASan /
    UBSan build of the scanner ran 80,000 of these clean)."""
    import random

    path = external_dir / "kineto" / "hta_nccl_metadata" / "nccl_data.json.gz"
    pieces = [p for sl in kineto_stream.stream_pieces(path, {}, piece_bytes=4096) for p in sl.pieces[:30]]
    alphabet = b'{}[]",:\\ 0123456789.eE-+tfnulx\xff\xc3\xa9\x00\n'
    rng = random.Random(7)
    read = 0
    for _ in range(3000):
        p = bytearray(rng.choice(pieces))
        for _ in range(rng.randint(1, 3)):
            if not p:
                break
            i, op = rng.randrange(len(p)), rng.random()
            if op < 0.5:
                p[i] = rng.choice(alphabet)
            elif op < 0.75:
                del p[i : i + rng.randint(1, 8)]
            else:
                p[i:i] = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
        sl = _slice(bytes(p))
        got = _native(sl)
        if got is not None:
            read += 1
            _assert_same(got, _reference(sl))
    assert read > 100  # (edits inside names and numbers keep valid JSON: those are read and compared)
