"""The writer thread's work: append scored windows to the open chunk, publish and commit it.

A chunk commits as: data file published (temp, fsync, check, rename), its rejected rows (if
any) published beside the records, then the commit record. A window marked failed drops the
open chunk and every later window of its shard; the other shards go on.

A chunk is complete when its windows have covered all of its input rows; with an
`[input].where` filter it holds fewer output rows than that, and its record counts both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from batchscore.errors import BadRowsError, InputDataError
from batchscore.job.sections import OutputConfig
from batchscore.observe.report import RunStats
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.layout import REJECTED, part_name, rejected_name
from batchscore.output.pending import Chunk
from batchscore.pipeline.stages import Scored
from batchscore.pipeline.writer import ChunkWriter, write_table


class Committer:
    """Consumes `Scored` windows in order; one chunk is open at a time."""

    def __init__(
        self,
        output: OutputConfig,
        ckpt: Checkpoint,
        schema: pa.Schema,
        stats: RunStats,
        on_commit: Callable[[Chunk, dict[str, Any]], None] = lambda chunk, record: None,
    ) -> None:
        """``on_commit`` is told of each chunk once its commit record is written."""
        self.output, self.ckpt, self.schema, self.stats = output, ckpt, schema, stats
        self.on_commit = on_commit
        self.writer: ChunkWriter | None = None
        self.read = 0  # input rows of the open chunk seen so far
        self.rejected: list[pa.Table] = []
        self.failures: list[dict[str, str]] = []
        self.failed_shards: set[int] = set()
        records = ckpt.committed().values()
        self.rows = sum(r["rows"] for r in records)
        self.bad = sum(r.get("bad_rows", 0) for r in records)

    def __call__(self, item: Scored) -> None:
        chunk = item.chunk
        if chunk.shard.index in self.failed_shards:
            return
        try:
            if item.error is not None:
                raise item.error
            if self.writer is None:
                self.writer, self.read = ChunkWriter(self.ckpt.store, chunk.key, self.schema), 0
            self.writer.append(conform(item.table, self.schema, chunk))
            self.read += item.table.num_rows if item.read is None else item.read
        except InputDataError as exc:
            self.abort()
            self.failed_shards.add(chunk.shard.index)
            self.failures.append({"shard": chunk.shard.path, "error": str(exc)})
            return
        if item.rejected is not None and item.rejected.num_rows:
            self.rejected.append(item.rejected)
        if self.read == chunk.rows:
            self.commit(chunk)

    def commit(self, chunk: Chunk) -> None:
        rows = self.writer.rows  # the rows that passed `where`: all of them without one
        self.writer.publish(rows)
        self.writer = None
        bad = sum(t.num_rows for t in self.rejected)
        if bad:
            write_table(pa.concat_tables(self.rejected), self.ckpt.store, rejected_name(chunk.key))
        self.rejected = []
        committed = record(chunk, bad, rows)
        self.ckpt.commit(committed)
        self.on_commit(chunk, committed)
        self.stats.chunks_committed += 1
        self.stats.bad_rows += bad
        self.stats.filtered += chunk.rows - rows
        self.rows, self.bad = self.rows + rows, self.bad + bad
        if self.bad > self.output.max_bad_share * self.rows:
            raise BadRowsError(
                f"{self.bad:,} of {self.rows:,} committed rows failed "
                f"({self.bad / self.rows:.1%}), above [output].max_bad_share = "
                f"{self.output.max_bad_share}; see {self.ckpt.store.where(REJECTED)} for each "
                "row's error"
            )

    def abort(self) -> None:
        """Drop the open chunk, if any; nothing of it becomes visible."""
        if self.writer is not None:
            self.writer.abort()
            self.writer = None
        self.rejected = []


def conform(table: pa.Table, schema: pa.Schema, chunk: Chunk) -> pa.Table:
    """Cast a window to the output schema; a value that does not fit fails its shard."""
    if table.schema == schema:
        return table
    try:
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputDataError(f"{chunk.shard.path}: rows {chunk.start}-{chunk.stop}: {exc}") from exc


def record(chunk: Chunk, bad_rows: int, rows: int | None = None) -> dict[str, Any]:
    """The commit record of a chunk: enough to skip it on resume and to notice its shard change.

    ``rows`` are the output rows (those that passed `where`); ``filtered`` the input rows of
    the chunk's range that did not.
    """
    rows = chunk.rows if rows is None else rows
    return {
        "chunk": chunk.key,
        "file": part_name(chunk.key),
        "shard": chunk.shard.identity,
        "chunks": chunk.of,
        "start": chunk.start,
        "stop": chunk.stop,
        "rows": rows,
        "filtered": chunk.rows - rows,
        "bad_rows": bad_rows,
        "committed_at": time.time(),
    }
