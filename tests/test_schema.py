"""The canonical schema module: conform / validate at the parser boundary."""

from __future__ import annotations

import polars as pl
import pytest

from ep_trace import schema
from ep_trace.errors import TraceFormatError

ROW = {"rank": [0], "event_id": [1], "kind": ["gpu_kernel"], "name": ["k"], "start_ns": [5], "end_ns": [7]}


def test_kind_is_an_enum_of_event_kinds() -> None:
    ev = schema.validate("events", schema.conform("events", pl.DataFrame(ROW)))
    assert ev.schema["kind"] == pl.Enum(schema.EVENT_KINDS)
    assert ev["kind"].to_physical().dtype == pl.UInt8  # 1 byte per row
    assert ev.filter(pl.col("kind").is_in(["gpu_kernel", "runtime"])).height == 1


def test_category_is_categorical() -> None:
    ev = schema.conform("events", pl.DataFrame({**ROW, "category": ["kernel"]}))
    assert ev.schema["category"] == pl.Categorical() and ev["category"].to_physical().dtype == pl.UInt32
    assert (
        ev.filter(pl.col("category") == "kernel").height == 1 and ev.filter(pl.col("category") == "cpu_op").height == 0
    )


def test_unknown_kind_is_a_one_line_error() -> None:
    with pytest.raises(TraceFormatError) as exc:
        schema.conform("events", pl.DataFrame({**ROW, "kind": ["weird"]}))
    assert str(exc.value) == "<events>: events: unknown kind 'weird'; this is a parser bug; please report it"


def test_negative_interval_names_the_row() -> None:
    df = schema.conform("events", pl.DataFrame({**ROW, "start_ns": [9]}))
    with pytest.raises(TraceFormatError) as exc:
        schema.validate("events", df, "rank0.json")
    assert (
        str(exc.value)
        == "rank0.json: events[0]: negative duration in table 'events' (start_ns=9, end_ns=7); the trace is corrupt; re-export it"
    )
