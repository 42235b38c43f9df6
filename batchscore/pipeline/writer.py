"""Writer: append a chunk's scored windows to a temporary Parquet file, then publish it whole.

The temporary file is staged locally (under ``_batchscore/tmp`` for a local output, which
dataset readers skip), made durable, checked against the expected row count, and only then
published: renamed into place in a folder, uploaded whole to an object store. The caller
records the commit afterwards; see `batchscore.output.checkpoint`.
"""

from __future__ import annotations

import contextlib
import os

import pyarrow as pa
import pyarrow.parquet as pq

from batchscore import faults
from batchscore.errors import WriteError, write_error
from batchscore.output.layout import part_name, staged_name
from batchscore.storage import Store


class ChunkWriter:
    """Writes one chunk's output file."""

    def __init__(self, store: Store, key: str, schema: pa.Schema) -> None:
        self.store = store
        self.final = part_name(key)
        self.tmp = store.staging / staged_name(self.final, os.getpid())
        self.schema = schema
        self.rows = 0
        try:
            self.writer = pq.ParquetWriter(self.tmp, schema)
        except OSError as exc:
            raise write_error(self.tmp, exc) from exc

    def append(self, table: pa.Table) -> None:
        """Add a window of scored rows (already in input order and in the output schema)."""
        try:
            faults.hit("write-chunk")
            self.writer.write_table(table)
        except OSError as exc:
            self.abort()
            raise write_error(self.tmp, exc) from exc
        self.rows += table.num_rows

    def publish(self, expected_rows: int) -> str:
        """Close, make durable, verify and publish; the chunk is not yet committed."""
        try:
            self.writer.close()
            faults.hit("after-temp-write")
            self.store.sync(self.tmp)
            faults.hit("after-fsync")
            written = pq.read_metadata(self.tmp).num_rows
            if written != expected_rows:
                raise WriteError(
                    f"{self.tmp}: holds {written} rows, expected {expected_rows}; not published"
                )
            self.store.publish(self.tmp, self.final)
            faults.hit("after-rename")
        except OSError as exc:
            self.abort()
            raise write_error(self.store.where(self.final), exc) from exc
        except WriteError:
            self.abort()
            raise
        return self.store.where(self.final)

    def abort(self) -> None:
        """Drop the temporary file; nothing of this attempt becomes visible."""
        with contextlib.suppress(OSError):
            self.writer.close()
        self.tmp.unlink(missing_ok=True)


def write_table(table: pa.Table, store: Store, rel: str) -> None:
    """Publish a small table whole (stage, sync, publish), e.g. a chunk's rejected rows."""
    tmp = store.staging / staged_name(rel, os.getpid())
    try:
        pq.write_table(table, tmp)
        store.sync(tmp)
        store.publish(tmp, rel)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(store.where(rel), exc) from exc
