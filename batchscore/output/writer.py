"""Writer: append a chunk's scored windows to a temporary Parquet file, then publish it whole.

The temporary file is staged locally (under ``_batchscore/tmp`` for a local output, which
dataset readers skip), made durable and checked against the expected row count (`finish`, which
returns what the manifest records of it), and only then published: renamed into place in a
folder, uploaded whole to an object store. The caller writes the intent before `publish` and
records the commit after it; see `batchscore.output.checkpoint`.
"""

from __future__ import annotations

import contextlib
import os

import pyarrow as pa
import pyarrow.parquet as pq

from batchscore import faults
from batchscore.errors import OutputConflictError, WriteError, write_error
from batchscore.files import CREATE
from batchscore.output.manifest import FileFacts, facts_of, facts_of_bytes
from batchscore.storage import Store
from batchscore.storage.layout import part_name, staged_name

HOLD_BYTES = 1 << 20  # a chunk's rows kept in memory before its file is created (see `append`)


class ChunkWriter:
    """Writes one chunk's output file; ``metadata`` goes into its Parquet footer.

    What names the file itself (its chunk and rows) may be known only once it is finished: a
    chunk cut into pieces by time (`[output].commit_s`) learns where a piece ends when it is
    cut. `name` gives them then; they go into the footer's key-value metadata, and into the
    schema's too where the file is written at the end (held), as most are.
    """

    def __init__(self, store: Store, key: str, schema: pa.Schema, metadata: dict[str, str]) -> None:
        self.store = store
        self.final = part_name(key)
        self.tmp = store.staging / staged_name(self.final, os.getpid())
        self.schema = schema.with_metadata(metadata)
        self.entries: dict[str, str] = {}  # the file's own footer entries (`name`)
        self.rows = 0
        self.writer: pq.ParquetWriter | None = None  # the staged file, once there is one
        self.file: pa.NativeFile | None = None  # ... and the file it writes to
        self.held: list[pa.Table] = []  # windows not yet written to it
        self.held_bytes = 0

    def append(self, table: pa.Table) -> None:
        """Add a window of scored rows (already in input order and in the output schema).

        A small chunk's windows stay in memory until `finish`, so its file is created there,
        where a group's files are created a few at once (creating a file waits on the
        journal); a chunk past `HOLD_BYTES` streams to its file as before.
        """
        try:
            faults.hit("write-chunk")
            self.held.append(table)
            self.held_bytes += table.nbytes
            if self.held_bytes > HOLD_BYTES:
                self.spill()
        except OSError as exc:
            self.abort()
            raise write_error(self.tmp, exc) from exc
        self.rows += table.num_rows

    def name(self, key: str, entries: dict[str, str]) -> None:
        """Publish the file as chunk ``key``'s, its footer holding ``entries`` too."""
        self.final, self.entries = part_name(key), entries

    def complete(self) -> tuple[pa.Buffer, int] | None:
        """Finish the file's contents. A chunk still held in memory is encoded there and its
        bytes returned with the row count its footer holds, for `Store.stage` to write in one
        call and for its facts (no re-read, no re-parse of the footer: on many one-row chunks
        those cost more than the rows); a streamed chunk's file is written to the end and
        closed, and None returned."""
        if self.writer is not None:
            self.spill()
            if self.entries:  # the schema's copy was written when the file was created
                self.writer.add_key_value_metadata(self.entries)
            self.writer.close()
            self.file.close()  # the writer leaves a file it was handed open
            return None
        sink = pa.BufferOutputStream()
        own = {k.encode(): v.encode() for k, v in self.entries.items()}
        schema = self.schema.with_metadata({**(self.schema.metadata or {}), **own})
        with pq.ParquetWriter(sink, schema) as writer:
            for table in self.held:
                writer.write_table(table)
        self.held = []
        return sink.getvalue(), writer.writer.metadata.num_rows  # the footer just written

    def spill(self) -> None:
        """Write the held windows to the staged file, creating it first if need be."""
        if self.writer is None:  # created here, never through a link planted at its name
            fd = os.open(self.tmp, CREATE, 0o644)
            self.file = pa.PythonFile(os.fdopen(fd, "wb"), mode="w")
            self.writer = pq.ParquetWriter(self.file, self.schema)
        for table in self.held:
            self.writer.write_table(table)
        self.held, self.held_bytes = [], 0

    def finish(self, expected_rows: int) -> FileFacts:
        """Close, make durable and verify the staged file; return its facts (not yet visible)."""
        try:
            held = self.complete()
            if held is None:  # streamed: its file is written, now made durable
                faults.hit("after-temp-write")
                self.store.sync(self.tmp)
            else:  # held: written and made durable through one open
                self.store.stage(self.tmp, held[0])
                faults.hit("after-temp-write")
            faults.hit("after-fsync")
            facts = facts_of(self.tmp) if held is None else facts_of_bytes(*held)
        except OSError as exc:
            self.abort()
            raise write_error(self.tmp, exc) from exc
        if facts.rows != expected_rows:
            self.abort()
            raise WriteError(
                f"{self.tmp}: holds {facts.rows} rows, expected {expected_rows}; not published"
            )
        return facts

    def publish(self, *, durable: bool = True) -> str:
        """Move the finished file into place; the chunk is not yet committed. ``durable=False``
        leaves the move to the caller's `Store.barrier` (a group of chunks syncs once).

        A file already at the chunk's name is not batchscore's (its own were removed with their
        records), so it is left alone and the run stops.
        """
        try:
            if self.store.size(self.final) is not None:
                self.abort()
                raise OutputConflictError(
                    f"{self.store.where(self.final)}: a file batchscore did not write is where "
                    "this chunk's output goes; it is left as it is: move it away, or point "
                    "[output].path at another folder"
                )
            self.store.publish(self.tmp, self.final, durable=durable)
            faults.hit("after-rename")
        except OSError as exc:
            self.abort()
            raise write_error(self.store.where(self.final), exc) from exc
        return self.store.where(self.final)

    def abort(self) -> None:
        """Drop the temporary file; nothing of this attempt becomes visible."""
        if self.writer is not None:
            with contextlib.suppress(OSError):
                self.writer.close()
            with contextlib.suppress(OSError):
                self.file.close()
        self.held = []
        self.tmp.unlink(missing_ok=True)
