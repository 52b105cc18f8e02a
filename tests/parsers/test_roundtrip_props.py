"""Property tests: random well-formed traces round-trip (events in = rows out + documented drops)."""

from __future__ import annotations

import json
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ep_trace.parsers import kineto_json
from ep_trace.parsers.kineto import read_kineto
from ep_trace.parsers.splits import parse_int_list

CATS = [
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "user_annotation",
    "cpu_op",
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "Trace",
    "cuda_sync",
    "brand_new_category",
]
KIND = {
    "kernel": "gpu_kernel",
    "gpu_memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "gpu_user_annotation": "gpu_annotation",
    "user_annotation": "cpu_annotation",
    "cpu_op": "cpu_op",
    "python_function": "python_frame",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
}

# µs with a 3-digit ns fraction, as current Kineto writes them, or plain ints (2022-2023 traces).
us = st.one_of(st.integers(0, 10**9), st.integers(0, 10**12).map(lambda n: n / 1000))
x_event = st.fixed_dictionaries(
    {
        "ph": st.just("X"),
        "cat": st.sampled_from(CATS),
        "name": st.text(min_size=0, max_size=12),
        "pid": st.integers(0, 3),
        "tid": st.integers(0, 5),
        "ts": us,
        "dur": us,
        "args": st.fixed_dictionaries(
            {}, optional={"correlation": st.integers(0, 50), "External id": st.integers(0, 50)}
        ),
    }
)
other_event = st.one_of(
    st.fixed_dictionaries(
        {
            "ph": st.just("M"),
            "name": st.just("thread_name"),
            "pid": st.integers(0, 3),
            "tid": st.integers(0, 5),
            "args": st.just({"name": "t"}),
        }
    ),
    st.fixed_dictionaries(
        {
            "ph": st.sampled_from(["s", "f"]),
            "cat": st.just("ac2g"),
            "id": st.integers(0, 50),
            "pid": st.integers(0, 3),
            "tid": st.integers(0, 5),
            "ts": us,
        }
    ),
    st.fixed_dictionaries(
        {
            "ph": st.just("i"),
            "name": st.just("Record Window End"),
            "pid": st.just(""),
            "tid": st.just(""),
            "ts": us,
            "s": st.just("g"),
        }
    ),
)


def _canon(x: object) -> object:
    """Numbers as floats, recursively (the reader keeps times, not their JSON spelling)."""
    if isinstance(x, dict):
        return {k: _canon(v) for k, v in x.items()}
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    return x


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    events=st.lists(st.one_of(x_event, x_event, other_event), min_size=1, max_size=40).filter(
        lambda es: any(e["ph"] == "X" for e in es)
    ),
    base=st.one_of(st.none(), st.just(1_719_853_884_000_000_000)),
    indent=st.sampled_from([None, 1]),
    chunk=st.sampled_from([64, 1 << 20]),
)
def test_random_traces_round_trip(tmp_path_factory, events, base, indent, chunk):
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": events, "INFO": ["x]"]}
    if base is not None:
        doc["baseTimeNanoseconds"] = base
    p = tmp_path_factory.mktemp("rt") / "t.json"
    p.write_text(json.dumps(doc, indent=indent))
    old = kineto_json.CHUNK_BYTES
    kineto_json.CHUNK_BYTES = chunk
    try:
        t = read_kineto(p)
    finally:
        kineto_json.CHUNK_BYTES = old
    seen: set[str] = set()
    xs = []
    for i, e in enumerate(events):
        key = json.dumps(_canon(e), sort_keys=True)  # 0 and 0.0 µs are one time: the same event
        if e["ph"] == "X" and key not in seen:  # an exact copy of an X event is dropped (issue 12)
            seen.add(key)
            xs.append((i, e))
    ev = t.events.sort("event_id")
    # Documented drops: non-X phases (metadata, flows, instants) and exact copies of an X event.
    assert ev["event_id"].to_list() == [i for i, _ in xs]
    assert ev["kind"].to_list() == [KIND.get(e["cat"], "other") for _, e in xs]
    assert ev["name"].to_list() == [e["name"] for _, e in xs]

    def ns(v):
        return int((Decimal(repr(v)) * 1000).to_integral_value())

    assert ev["start_ns"].to_list() == [(base or 0) + ns(e["ts"]) for _, e in xs]
    assert (ev["end_ns"] - ev["start_ns"]).to_list() == [ns(e["dur"]) for _, e in xs]
    assert t.ranks["rank"].to_list() == [1]
    first_launch: dict[int, int] = {}
    for i, e in xs:
        if e["cat"] in ("cuda_runtime", "cuda_driver") and "correlation" in e["args"]:
            first_launch.setdefault(e["args"]["correlation"], i)
    want = [
        first_launch.get(e["args"].get("correlation")) if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset") else None
        for _, e in xs
    ]
    assert ev["launch_id"].to_list() == want


@given(vals=st.lists(st.integers(0, 10**6), min_size=0, max_size=80), spaced=st.booleans())
def test_split_strings_round_trip(vals, spaced):
    sep = ", " if spaced else ","
    parsed = parse_int_list("[" + sep.join(map(str, vals)) + "]")
    assert parsed is not None and list(parsed.values) == vals and not parsed.truncated
    assert parse_int_list(vals).values == tuple(vals)  # real JSON arrays from third-party exporters


@given(vals=st.lists(st.integers(0, 999), min_size=31, max_size=80), newer=st.booleans())
def test_truncated_split_strings(vals, newer):
    head = vals[:29] if newer else vals[:30]
    text = "[" + ", ".join(map(str, head)) + ", ..." + (f", {vals[-1]}" if newer else "") + "]"
    full = parse_int_list(text, len(vals))
    assert full.truncated and len(full.values) == len(vals)
    assert list(full.values[: len(head)]) == head and (
        full.values[-1] == vals[-1] if newer else full.values[-1] is None
    )
    assert list(parse_int_list(text).values) == head  # without the true length only the leading values are placed
