"""Parquet round trip: converted records -> EventsWriter -> read_cupti -> validated canonical tables."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from ep_trace.capture.cupti.convert import records_to_events
from ep_trace.capture.cupti.writer import EventsWriter, events_path
from ep_trace.errors import TraceFormatError
from ep_trace.parsers.cupti import is_cupti_file, read_cupti
from ep_trace.schema import RANKS

DATA = Path(__file__).resolve().parents[1] / "data" / "cupti" / "moe_step_records.json"
META = {
    "rank": 0,
    "world_size": 2,
    "host": "gpu-node-1",
    "device": "cuda:0",
    "backend": "nccl",
    "job_id": "j",
    "local_rank": 0,
    "torch_version": "2.13.0",
    "ep_trace_version": "0.1.0",
}


@pytest.fixture(scope="module")
def golden() -> pl.DataFrame:
    doc = json.loads(DATA.read_text())
    return records_to_events(doc["records"], rank=0, ranges=doc["ranges"], clock_offset_ns=doc["clock_offset_ns"])


def _write(path: Path, batches: list[pl.DataFrame], meta: dict = META) -> Path:
    w = EventsWriter(path, meta)
    for b in batches:
        w.write(b)
    return w.close(steps=len(batches))


def test_round_trip_two_row_groups(golden: pl.DataFrame, tmp_path: Path) -> None:
    path = _write(events_path(tmp_path, 0), [golden.head(9), golden.tail(7)])
    assert path.name == "rank0.ep-events.parquet" and is_cupti_file(path)
    assert pq.ParquetFile(path).num_row_groups == 2
    t = read_cupti(path)
    assert t.events.equals(golden)
    assert t.ranks.schema == RANKS
    r = t.ranks.row(0, named=True)
    assert r == {
        "rank": 0,
        "world_size": 2,
        "host": "gpu-node-1",
        "local_rank": 0,
        "device": "cuda:0",
        "cpu_cores": None,
        "host_cores": None,
        "backend": "nccl",
        "source_file": str(path),
        "format": "cupti",
        "job_id": "j",
        "trace_start_ns": 1_764_400_000_000_000_750,
        "trace_end_ns": 1_764_400_000_000_022_250,
        "clock_offset_ns": 0,
        "rank_source": "cupti_metadata",
        "has_sidecar": False,
        "ep_group_ranks": None,
        "hidden_size": None,
        "dtype": None,
        "num_experts": None,
        "top_k": None,
        "torch_version": "2.13.0",
        "ep_trace_version": "0.1.0",
        "node_rank": None,
        "local_world_size": None,
    }
    assert t.collectives.height == 0
    footer = json.loads(pq.ParquetFile(path).metadata.metadata[b"ep_trace.cupti"])
    assert (footer["format_version"], footer["steps"]) == (1, 2)


def test_truncated_file_is_a_clear_error(golden: pl.DataFrame, tmp_path: Path) -> None:
    path = _write(tmp_path / "rank0.ep-events.parquet", [golden])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the job died before stop(): no footer
    with pytest.raises(TraceFormatError) as ei:
        read_cupti(path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}: not a readable Parquet file (")
    assert msg.endswith(
        "; re-run the capture; a job that dies before CuptiCollector.stop() leaves a file without its Parquet footer"
    )
    assert "\n" not in msg


def test_plain_parquet_without_metadata(golden: pl.DataFrame, tmp_path: Path) -> None:
    path = tmp_path / "x.ep-events.parquet"
    golden.write_parquet(path)
    with pytest.raises(TraceFormatError) as ei:
        read_cupti(path)
    assert str(ei.value) == (
        f"{path}: no ep-trace CUPTI metadata (footer key 'ep_trace.capture.cupti') in this Parquet file; only files written by "
        "ep_trace.capture.cupti.CuptiCollector can be read as CUPTI events; rename other Parquet files so they do not end in "
        "'.ep-events.parquet'"
    )


def test_newer_format_version(golden: pl.DataFrame, tmp_path: Path) -> None:
    path = _write(tmp_path / "rank0.ep-events.parquet", [golden], {**META, "format_version": 9})
    with pytest.raises(
        TraceFormatError, match=r"ep_trace.cupti: CUPTI events format_version 9 is newer than this ep-trace reads \(1\)"
    ):
        read_cupti(path)


def test_rows_of_another_rank(golden: pl.DataFrame, tmp_path: Path) -> None:
    path = _write(tmp_path / "rank3.ep-events.parquet", [golden], {**META, "rank": 3})
    with pytest.raises(TraceFormatError, match="events: 16 events carry rank 0 but the footer says rank 3"):
        read_cupti(path)


def test_wrong_schema_rejected(golden: pl.DataFrame, tmp_path: Path) -> None:
    path = tmp_path / "rank0.ep-events.parquet"
    table = golden.drop("seq").to_arrow()
    table = table.replace_schema_metadata(None)
    pq.write_table(table, path)
    f = pq.ParquetFile(path)
    # Re-write with our footer key but a wrong schema.
    w = pq.ParquetWriter(tmp_path / "bad.ep-events.parquet", f.schema_arrow)
    w.write_table(f.read())
    w.add_key_value_metadata({b"ep_trace.cupti": json.dumps({**META, "format_version": 1}).encode()})
    w.close()
    with pytest.raises(
        TraceFormatError, match=r"table 'events' does not match the canonical schema \(missing \['seq'\]"
    ):
        read_cupti(tmp_path / "bad.ep-events.parquet")


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "rank0.ep-events.parquet"
    empty.write_bytes(b"")
    with pytest.raises(TraceFormatError, match="not a readable Parquet file"):
        read_cupti(empty)
    with pytest.raises(TraceFormatError, match="file not found; check the path"):
        read_cupti(tmp_path / "nope.ep-events.parquet")


def test_writer_rejects_bad_rows(golden: pl.DataFrame, tmp_path: Path) -> None:
    w = EventsWriter(tmp_path / "rank0.ep-events.parquet", META)
    bad = golden.with_columns(
        pl.when(pl.col("event_id") == 3).then(pl.lit(0, pl.Int64)).otherwise(pl.col("end_ns")).alias("end_ns")
    )
    with pytest.raises(TraceFormatError, match=r"events\[3\]: negative duration"):
        w.write(bad)
    w.close()
    assert read_cupti(tmp_path / "rank0.ep-events.parquet").events.height == 0
