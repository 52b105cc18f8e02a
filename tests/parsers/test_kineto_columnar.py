"""The polars columnar decode (kineto_columnar) equals the orjson decode on every real trace and on
the awkward inputs it must either read identically or hand back to orjson."""

from __future__ import annotations

import json
import os
from pathlib import Path
from unittest import mock

import polars as pl
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ep_trace.errors import TraceFormatError
from ep_trace.parsers import kineto, kineto_columnar, kineto_json, kineto_native

from .decoder_paths import decoder  # noqa: F401 - the fixture, used by pytestmark

pytestmark = pytest.mark.usefixtures("decoder")


def _native_on() -> bool:
    """Whether this run of the test (the ``decoder`` fixture) uses the native scanner."""
    return os.environ.get("EP_TRACE_NATIVE") == "1"


def _same_decode(path: Path) -> tuple[int, int]:
    h0, k0, f0 = kineto._decode(path, columnar=False)
    h1, k1, f1 = kineto._decode(path, columnar=True)
    assert h1 == h0
    assert list(k1.items()) == list(k0.items())  # same kept args, same insertion order
    a, b = pl.concat(f0), pl.concat(f1)
    assert b.schema == a.schema and b.equals(a)
    return a.height, len(k0)


def _kineto_files(external_dir: Path, samples_dir: Path) -> list[Path]:
    files = sorted((external_dir / "kineto").rglob("*.json*")) + sorted(samples_dir.rglob("*.pt.trace.json*"))
    return [f for f in files if f.name.endswith((".json", ".json.gz"))]


def test_columnar_equals_orjson_on_every_real_trace(external_dir, samples_dir, monkeypatch):
    files = _kineto_files(external_dir, samples_dir)
    assert len(files) >= 30
    rows = {}
    # small slices: many slice boundaries (and the last-slice tail) on every file
    monkeypatch.setattr(kineto_json, "CHUNK_BYTES", 48 << 10)
    for f in files:
        rows[f.name] = _same_decode(f)
    assert rows["nccl_data.json.gz"] == (26933, 111)
    assert rows["rank0.json.gz"] == (67217, 320)
    assert rows["sampled_rank-0.json.gz"] == (4811, 28)


def _write(tmp_path: Path, name: str, events: list, **kw) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events, "baseTimeNanoseconds": 10, **kw}))
    return p


def _ev(i: int, **over):
    e = {
        "ph": "X",
        "cat": "cpu_op",
        "name": f"op{i}",
        "pid": 7,
        "tid": 8,
        "ts": 1.5 + i,
        "dur": 2,
        "args": {"External id": i},
    }
    e.update(over)
    return e


@pytest.mark.parametrize(
    "odd",
    [
        {"pid": "Spans", "tid": "PyTorch Profiler"},  # labels -> trailing number or null
        {"tid": -549452224},  # signed 32-bit thread ids (real, hta_nccl_metadata)
        {"tid": "stream 7 "},
        {"pid": True},  # bool: value depends on the rest of the slice -> orjson path
        {"pid": 1.5},
        {"name": 12, "cat": "kernel"},
        {"name": 1.5e3},  # printed differently by polars -> orjson path
        {"ts": 4458676522690.655, "dur": 156.777},
        {"ts": True},  # read as 1.0 by polars: found from the 0 / 1 values -> orjson path -> error
        {"dur": False},
        {"ts": 0, "dur": 1},  # real 0 / 1 values: same columns
        {"ts": 1, "args": {"flag": True, "ts": False}},  # a bool under args is no time
        {"ts": 1694128201435418, "dur": 52},
        {"args": {"correlation": True}},
        {"args": {}},
        {"args": None},
        {"cat": "gpu_memcpy", "args": {"bytes": 4096, "correlation": 3}},
        {"cat": "gpu_memset", "args": {"bytes": "4096"}},  # quoted: reader error -> orjson path -> error
        {"cat": "kernel", "name": "nccl:all_reduce", "args": {"Collective name": None, "correlation": 9}},
        {"cat": "kernel", "args": {"Collective name": None}},  # key present, null: still kept
        {"cat": "cpu_op", "args": {"Collective name": None}},  # not a kernel: no effect, text not counted
        {
            "name": "record_param_comms",
            "args": {"Collective name": "all_to_allv", "Comms Id": 10159970886766084423, "In split size": "[1, 2]"},
        },
        {"name": 'nccl:x}, {"y', "args": {"note": "}, {"}},  # boundary text inside strings
        {"ph": "f", "bp": "e", "id": 5, "args": [1, 2]},  # a non-X event the schema cannot read
        {"unused": 99999999999999999999999},  # beyond uint64 outside the fields read
    ],
)
def test_columnar_equals_orjson_on_odd_events(tmp_path, odd):
    events = [_ev(i) for i in range(40)]
    events[17] = _ev(17, **odd)
    events.append(
        _ev(
            40,
            cat="kernel",
            name="ncclDevKernel_SendRecv",
            pid=0,
            tid=7,
            args={"Collective name": "allreduce", "correlation": 4},
        )
    )
    p = _write(tmp_path, "t.json", events)
    try:
        kineto._decode(p, columnar=False)
    except TraceFormatError as exc:
        with pytest.raises(TraceFormatError) as ei:
            kineto._decode(p, columnar=True)
        assert str(ei.value) == str(exc)
        return
    _same_decode(p)


@pytest.mark.parametrize("n", [10, 400])  # few 0 / 1 times: their events are searched; many: the slice
@pytest.mark.parametrize("indent", [None, 1])  # "}, {" and "},\n {" event boundaries
@pytest.mark.parametrize("odd_name", [False, True])  # a boundary inside a string: the slice is searched
def test_boolean_time_among_unit_durations_gives_the_orjson_error(tmp_path, n, indent, odd_name):
    events = [_ev(i, dur=1) for i in range(n)]
    events[n - 3]["ts"] = True
    if odd_name:
        events[1]["name"] = 'a}, {"b'  # json.dumps writes the event boundary of indent=None
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events}, indent=indent))
    with pytest.raises(TraceFormatError) as want:
        kineto._decode(p, columnar=False)
    with pytest.raises(TraceFormatError) as got:
        kineto._decode(p, columnar=True)
    assert str(got.value) == str(want.value)
    assert f"traceEvents[{n - 3}]: ts has an unusable value 'True'" in str(got.value)


def test_bad_values_keep_the_orjson_error_word_for_word(tmp_path):
    cases = {
        "huge": (
            b'{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":1,"args":{"correlation": 99999999999999999999999}}',
            "traceEvents[0]: args.correlation has an unusable value",
        ),
        "frac": (
            b'{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":1,"args":{"External id": 1.5}}',
            "traceEvents[0]: args['External id'] has an unusable value '1.5'",
        ),
        "str_ts": (
            b'{"ph":"X","cat":"cpu_op","name":"k","pid":0,"tid":7,"ts":"soon","dur":1}',
            "traceEvents[0]: ts has an unusable value 'soon'",
        ),
        "quoted": (
            b'{"ph":"X","cat":"cpu_op","name":"k","pid":0,"tid":7,"ts":1,"dur":1,"args":{"correlation":"12"}}',
            "traceEvents[0]: args.correlation has an unusable value '12'",
        ),
    }
    for name, (ev, want) in cases.items():
        p = tmp_path / f"{name}.json"
        p.write_bytes(b'{"traceEvents": [' + ev + b"]}")
        with pytest.raises(TraceFormatError) as ei:
            kineto._decode(p, columnar=True)
        assert want in str(ei.value), name


def test_slices_use_the_columnar_reader_on_gpu_traces(external_dir, monkeypatch):
    """The fast path really runs (no silent per-slice fallback) on a modern NCCL trace: the native
    scanner on every slice, or (``EP_TRACE_NATIVE=0``) polars' reader."""
    used = []
    if _native_on():
        real_native = kineto_native.slice_frame
        monkeypatch.setattr(
            kineto_native, "slice_frame", lambda *a: (r := real_native(*a), r is not None and used.append(1))[0]
        )
    real = kineto_columnar._slice_frame
    monkeypatch.setattr(kineto_columnar, "_slice_frame", lambda *a: used.append(1) or real(*a))
    monkeypatch.setattr(kineto_json, "CHUNK_BYTES", 256 << 10)
    fallback = []
    real_chunk = kineto._chunk_frame
    header, kept, frames = kineto_columnar.decode_columnar(
        external_dir / "kineto" / "hta_nccl_metadata" / "nccl_data.json.gz",
        lambda *a: fallback.append(1) or real_chunk(*a),
        kineto.ARG_KEEP_PREFIXES,
    )
    assert len(used) == len(frames) >= 10 and fallback == []
    assert sum(f.height for f in frames) == 26933 and len(kept) == 111


_FRACTION = st.integers(-(10**6), 10**6).map(lambda i: i + 0.25)  # (2.0 in an id: a known difference)
_EVENT = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "f", "M"]),
        "cat": st.sampled_from(["kernel", "cpu_op", "gpu_memcpy", "gpu_memset", "cuda_runtime", "user_annotation"]),
        "name": st.sampled_from(["aten::mm", "nccl:all_reduce", "record_param_comms", "ProfilerStep#1", "gloo:x"]),
        "pid": st.integers(-(2**31), 2**31),
        "tid": st.integers(-(2**31), 2**31),
        "ts": st.one_of(st.integers(0, 2**53), st.floats(0, 1e12, allow_nan=False)),
        "dur": st.one_of(st.integers(0, 10**6), st.floats(0, 1e6, allow_nan=False)),
    },
    optional={
        "args": st.fixed_dictionaries(
            {},
            optional={
                "correlation": st.integers(0, 2**53 - 1),
                "External id": st.integers(0, 2**53 - 1),
                "bytes": st.integers(0, 2**40),
                "Collective name": st.sampled_from(["allreduce", "all_to_allv"]),
                "flag": st.booleans(),
            },
        )
    },
)
# odd values Kineto does not write, each either read identically or handed to the orjson path
_ODD = st.one_of(
    st.tuples(st.sampled_from(["ts", "dur"]), st.one_of(st.booleans(), st.none(), st.sampled_from([0, 1, 1.0, "5"]))),
    st.tuples(
        st.sampled_from(["pid", "tid"]),
        # (a quoted negative number, "-5", is a known difference: see the module doc)
        st.one_of(st.booleans(), _FRACTION, st.sampled_from(["Spans", "stream 7 ", "GPU 0", ""])),
    ),
    st.tuples(
        st.sampled_from(["cat", "name"]),
        st.one_of(st.integers(0, 99), st.just(1.5e3), st.none(), st.just('a}, {"b'), st.just("true")),
    ),
    st.tuples(
        st.sampled_from(["correlation", "External id", "bytes", "Collective name"]),
        st.one_of(st.none(), st.booleans(), st.just(2**60), st.sampled_from(["12", "x"])),
    ),
    st.tuples(st.sampled_from(["correlation", "External id", "bytes", "pid", "tid"]), _FRACTION),
    st.just(("Collective name", None)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    events=st.lists(_EVENT, min_size=1, max_size=30),
    odd=st.lists(st.tuples(st.integers(0, 29), _ODD), min_size=1, max_size=3),
    indent=st.sampled_from([None, 1]),
)
def test_columnar_equals_orjson_on_random_events(tmp_path, events, odd, indent):
    """Real-looking events with up to three odd values: the same frames and kept args, or the same
    one-line error."""
    for i, (field, value) in odd:
        ev = events[i % len(events)]
        if i % 2 == 0:  # (on a non-X event an odd value matters less: half the time, make it an X)
            ev["ph"] = "X"
            if field == "Collective name":  # a null one matters on a kernel (its args are kept)
                ev["cat"] = "kernel"
        if field in ("correlation", "External id", "bytes", "Collective name"):
            ev.setdefault("args", {})[field] = value
        else:
            ev[field] = value
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 10}, indent=indent))
    fast: list[bool] = []
    real = kineto_columnar._work
    # (patched per example: the function-scoped monkeypatch would stack a wrapper per example)
    with (
        mock.patch.object(kineto_json, "CHUNK_BYTES", 1 << 10),  # several slices per file
        mock.patch.object(kineto_columnar, "_work", lambda *a: (r := real(*a), fast.append(r is not None))[0]),
    ):
        try:
            want = kineto._decode(p, columnar=False)
        except TraceFormatError as exc:
            with pytest.raises(TraceFormatError) as got:
                kineto._decode(p, columnar=True)
            assert str(got.value) == str(exc)
            event("same error")
            return
        h1, k1, f1 = kineto._decode(p, columnar=True)
    event(f"same frames, {'some' if any(fast) else 'no'} slice read by polars")
    h0, k0, f0 = want
    assert h1 == h0 and list(k1.items()) == list(k0.items())
    if f0 or f1:
        a, b = pl.concat(f0), pl.concat(f1)
        assert b.schema == a.schema and b.equals(a)


_WORDS = st.sampled_from(
    [b'"ts"', b'"dur"', b'"xts"', b'\\"ts\\"', b":", b" ", b"\n", b"\t", b"true", b"false", b"1", b",", b"{", b"}"]
)


@settings(max_examples=600, deadline=None)
@given(
    st.lists(_WORDS, max_size=40), st.integers(0, 80), st.sampled_from([b" ", b"\t", b"\n", b"\x0b", b"\x0c", b"\r"])
)
def test_bool_time_word_search_equals_the_regex(words, pad, blank):
    """The word search answers exactly what the regex does, blanks of any kind and length included
    (before and after the colon)."""
    text = b"".join(words)
    if pad % 3 == 0:
        text = text.replace(b":", b":" + blank * pad, 1)
    elif pad % 3 == 1:
        text = text.replace(b":", blank * pad + b":", 1)
    else:
        text = blank * pad + text
    assert kineto_columnar._has_bool_time(text) == (kineto_columnar._BOOL_TIME.search(text) is not None)


@pytest.mark.parametrize("pad", range(56, 72))
def test_bool_time_behind_a_long_run_of_blanks(pad):
    # (a fixed look-back window would cut the key at some of these lengths)
    text = b'{"dur"' + b" " * pad + b": true}"
    assert kineto_columnar._BOOL_TIME.search(text) and kineto_columnar._has_bool_time(text)


@pytest.mark.parametrize(
    "text",
    [
        b'[{"a":1},{"b":2},{"c":3}]',
        b'[{"a":1},\n  {"b":2},\n  {"c":3}]',
        b'[{"a":1},{"b":2}, {"c":3}]',  # mixed: the regex decides
        b'[{"a":"x},{y"},{"b":2}]',  # a separator inside a string: the count tells
        b'[{"a":1}]',
    ],
)
def test_cuts_equal_the_regex_boundaries(text):
    regex = [(m.start(), m.end() - 1) for m in kineto_json._BOUNDARY_RE.finditer(text)]
    events = text.count(b'"a"') + text.count(b'"b"') + text.count(b'"c"')
    ends, nexts = kineto_columnar._cuts(text, events - 1)
    if len(regex) == events - 1 or b"x},{y" not in text:
        assert list(zip(ends.tolist(), nexts.tolist(), strict=True)) == regex
    else:  # the fast count is off and so is the regex's: the caller's check sends it to orjson
        assert len(ends) != events - 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="0123456789+-.eEtruefalsS \n\t", max_size=12), min_size=1, max_size=20))
def test_python_floatish_test_equals_polars(labels):
    """The few-labels path tests pid / tid labels with Python's re; the many-labels path with polars."""
    want = pl.Series(labels, dtype=pl.Utf8).str.contains(kineto_columnar._FLOATISH).to_list()
    assert [bool(kineto_columnar._FLOATISH_RE.search(t)) for t in labels] == want


def test_compact_cuts_never_trust_a_separator_inside_a_string():
    # 3 events, one boundary written "}, {" and a "},{" inside a name: the separator's count alone
    # (2) would match the expected 2 with one boundary wrong; the regex's count (3) sends it back
    text = b'[{"a":"x},{y"},{"b":2}, {"c":3}]'
    ends, nexts = kineto_columnar._cuts(text, 2)
    regex = [(m.start(), m.end() - 1) for m in kineto_json._BOUNDARY_RE.finditer(text)]
    assert list(zip(ends.tolist(), nexts.tolist(), strict=True)) == regex and len(regex) == 3


@pytest.mark.parametrize(
    "text",
    [
        b'[{"a":"x},{y"},{"b":2},\n{"c":3}]',  # an in-string "},{" and a newline after the comma
        b'[{"a":"x},{y"},{"b":2} ,{"c":3}]',  # ... a blank before it
        b'[{"a":"x} y"},{"b":2},{"c":3}]',  # a blank after a brace inside a string: the regex decides
        b'[{"a":1},{"b":2},{"c":3}]',
    ],
)
def test_compact_cuts_equal_the_regex_whatever_the_blanks(text):
    regex = [(m.start(), m.end() - 1) for m in kineto_json._BOUNDARY_RE.finditer(text)]
    ends, nexts = kineto_columnar._cuts(text, 2)
    if len(regex) == 2:
        assert list(zip(ends.tolist(), nexts.tolist(), strict=True)) == regex
    else:  # the count is off: the caller's check sends the slice to orjson
        assert len(ends) != 2


@pytest.mark.parametrize("null_at", [5, 190])  # in the first piece of the slice, or a later one
def test_null_collective_name_on_a_kernel_in_any_piece_falls_back(tmp_path, monkeypatch, null_at):
    """Only the pieces holding an X kernel without a ``Collective name`` are counted: a null one
    there sends the slice to orjson (which keeps that kernel's args); one on a CPU op does not.
    The native scanner sees the key itself: it keeps that kernel's args with no fallback."""
    events = [_ev(i) for i in range(200)]
    events[100] = _ev(100, cat="cpu_op", args={"Collective name": None})  # in a piece of no kernel: no effect
    events[null_at] = _ev(null_at, cat="kernel", name="ncclDevKernel_AllReduce", args={"Collective name": None})
    p = _write(tmp_path, "t.json", events)
    monkeypatch.setattr(kineto_json, "CHUNK_BYTES", 64 << 10)  # one slice of several ~8 KB pieces
    fast: list[bool] = []
    real = kineto_columnar._work
    monkeypatch.setattr(kineto_columnar, "_work", lambda *a: (r := real(*a), fast.append(r is not None))[0])
    _, kept = _same_decode(p)
    assert kept == 1 and fast == [_native_on()]
    events[null_at] = _ev(null_at, cat="kernel", name="ncclDevKernel_AllReduce")  # no key: nothing to count
    p = _write(tmp_path, "u.json", events)
    fast.clear()
    assert _same_decode(p)[1] == 0 and fast == [True]
