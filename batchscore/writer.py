"""Writer: append a chunk's scored windows to a temporary Parquet file, then publish it whole.

The temporary file lives under ``_batchscore/tmp`` (dataset readers skip ``_`` folders), is
fsynced, checked against the expected row count, and only then renamed into place. The caller
records the commit afterwards; see `batchscore.checkpoint`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from batchscore import faults
from batchscore.checkpoint import part_name
from batchscore.errors import WriteError
from batchscore.fsio import fsync_file, publish, write_error


class ChunkWriter:
    """Writes one chunk's output file."""

    def __init__(self, output: Path, tmp_dir: Path, key: str, schema: pa.Schema) -> None:
        self.final = output / part_name(key)
        self.tmp = tmp_dir / f"{part_name(key)}.{os.getpid()}.tmp"
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

    def publish(self, expected_rows: int) -> Path:
        """Close, fsync, verify and rename into place; the chunk is not yet committed."""
        try:
            self.writer.close()
            faults.hit("after-temp-write")
            fsync_file(self.tmp)
            faults.hit("after-fsync")
            written = pq.read_metadata(self.tmp).num_rows
            if written != expected_rows:
                raise WriteError(
                    f"{self.tmp}: holds {written} rows, expected {expected_rows}; not published"
                )
            publish(self.tmp, self.final)
            faults.hit("after-rename")
        except OSError as exc:
            self.abort()
            raise write_error(self.final, exc) from exc
        except WriteError:
            self.abort()
            raise
        return self.final

    def abort(self) -> None:
        """Drop the temporary file; nothing of this attempt becomes visible."""
        with contextlib.suppress(OSError):
            self.writer.close()
        self.tmp.unlink(missing_ok=True)


def write_table(table: pa.Table, tmp_dir: Path, final: Path) -> None:
    """Publish a small table whole (temp, fsync, rename), e.g. a chunk's rejected rows."""
    tmp = tmp_dir / f"{final.name}.{os.getpid()}.tmp"
    try:
        pq.write_table(table, tmp)
        fsync_file(tmp)
        publish(tmp, final)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(final, exc) from exc
