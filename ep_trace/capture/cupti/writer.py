"""The ``rank{r}.ep-events.parquet`` file: canonical ``events`` rows written by the CUPTI collector.

Pure (pyarrow + polars, no cupti, no torch), so the reader in ``ep_trace.parsers.cupti`` shares the
format constants without needing a GPU. Layout:

* Arrow schema = :data:`ep_trace.schema.EVENTS` exactly; one row group per flushed step;
* footer key-value metadata ``ep_trace.cupti`` = a JSON object with ``format_version``, ``rank``,
  ``world_size``, ``local_rank``, ``host``, ``device``, ``backend``, ``job_id``, ``pid``,
  ``clock_offset_ns`` (already applied to the times), ``cupti_version``, ``torch_version``,
  ``ep_trace_version``, ``steps`` (steps written) and ``events`` (rows written).

Parquet writes its footer on close: a process killed before :meth:`EventsWriter.close` leaves a
file the reader rejects with a clear message (the sidecar ``rank{r}.ep.jsonl`` still keeps every
finished step).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from ep_trace.schema import EVENTS, validate
from ep_trace.trace_files import CUPTI_FORMAT_VERSION as FORMAT_VERSION
from ep_trace.trace_files import CUPTI_METADATA_KEY as METADATA_KEY
from ep_trace.trace_files import events_path

__all__ = ["EventsWriter", "events_path"]


class EventsWriter:
    """Appends canonical events batches to one Parquet file, one row group per batch.

    Args:
        path: Output file (created or truncated).
        meta: JSON-serialisable rank metadata written into the footer at :meth:`close`.
    """

    def __init__(self, path: str | Path, meta: dict[str, Any]) -> None:
        self.path = Path(path)
        self.meta = {"format_version": FORMAT_VERSION, **meta}
        self._schema = pl.DataFrame(schema=EVENTS).to_arrow().schema
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(self.path, self._schema, compression="zstd")
        self.rows_written = 0

    def write(self, events: pl.DataFrame) -> None:
        """Validate one batch against the canonical schema and append it as a row group."""
        if self._writer is None:
            raise ValueError(f"{self.path}: writer already closed")
        if events.height == 0:
            return
        validate("events", events, str(self.path))
        table = events.to_arrow().cast(self._schema)
        self._writer.write_table(table)
        self.rows_written += events.height

    def close(self, **final_meta: Any) -> Path:
        """Write the footer (metadata updated with ``final_meta``) and close the file.

        Returns:
            The path of the finished file.
        """
        if self._writer is None:
            return self.path
        self.meta.update(final_meta)
        self._writer.add_key_value_metadata({METADATA_KEY: json.dumps(self.meta, sort_keys=True).encode()})
        self._writer.close()
        self._writer = None
        return self.path
