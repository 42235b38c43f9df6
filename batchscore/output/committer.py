"""The writer thread's work: append scored parts to their chunk's file, publish and commit it.

A chunk commits as: data file staged (temp, fsync, check), its intent recorded, the file
published (rename), its rejected rows (if any) listed beside the records, then the commit
record. The first commit of a run also writes the folder's claim (the job record and the
decisions it was scored with). A part marked failed drops its shard's open chunks and every
later part of that shard; the other shards go on.

Each chunk's parts arrive in row order, but chunks may complete in any order (a window hands
on its complete parts early, see `batchscore.pipeline.scoring`), so every chunk not yet
complete has its own open file: at most the few a window boundary cuts.

Chunks completed by one handoff of a window (many small shards) are committed as a group:
each step above runs for the whole group, so the group waits for the disk a few times instead
of six times per chunk, and every chunk still has its own file and record.

A chunk is complete when its windows have covered all of its input rows; with an
`[input].where` filter it holds fewer output rows than that, and its record counts both.

No scored row waits for its commit much longer than `[output].commit_s`, however large the
chunk: at each handoff, a chunk whose rows began scoring half of ``commit_s`` ago or more and
that is still open commits the rows it has as a piece of itself (`Chunk.cut`: a prefix of its
rows, named from the chunk and its first row), with the group, and the rest of the chunk goes
on in a file of its own. Handoffs come at least once a window, and the model's windows are
sized to take a quarter of ``commit_s`` (`batchscore.pipeline.pace`), so a piece is committed
within about three quarters of it. `batchscore.output.pieces` says which rows of a chunk its
pieces hold, so a resumed run scores only the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from batchscore import faults
from batchscore.errors import InputDataError
from batchscore.job.sections import OutputConfig
from batchscore.observe.run_stats import RunStats
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.keys import key_columns, keys_of, publish_keys
from batchscore.output.manifest import FileFacts
from batchscore.output.pending import Pending
from batchscore.output.settled import Decision
from batchscore.output.verdict import bad_share_error
from batchscore.output.writer import ChunkWriter
from batchscore.storage.layout import KEYS, part_name, rejected_name
from batchscore.threads import available_cores, in_shares
from batchscore.work.columns import cast_exactly
from batchscore.work.row_errors import rejected_lines
from batchscore.work.units import Chunk, Scored

GROUP = 128  # chunks committed together at most: bounds what one crash leaves to sweep
# Staged files encoded, written, fsynced and checked at once: two per core. Each one encodes
# (CPU) and creates a file in the one staging folder, whose lock serializes creation; more
# threads than that spin on the lock and the GIL (on 2 cores, 16 took 0.3 s longer over 2,000
# one-row chunks than 4, in six paired runs). The fsyncs still overlap.
FINISHERS = min(16, 2 * available_cores())


class Staged:
    """A chunk's file: open while its parts arrive, staged once they cover all of its input
    rows (or once it is cut into a piece, ``done`` False), then committed with its group."""

    def __init__(self, chunk: Chunk, writer: ChunkWriter) -> None:
        self.chunk, self.writer = chunk, writer
        self.read = 0  # input rows its parts covered so far
        self.rejected: list[pa.Table] = []
        self.keys: list[pa.Table] = []  # a Delta table's: its rows' key columns, per part
        self.facts: FileFacts | None = None
        self.since: float | None = None  # when its first rows began scoring (monotonic)
        self.done = True  # whether its commit completes the chunk the run was given


class Committer:
    """Consumes scored parts, a window's handoff at a time (each chunk's parts in order).

    ``claim`` is the job record and ``decision`` what was measured for it (None: nothing),
    both written before the first commit; ``metadata`` goes into every data file's footer.
    """

    def __init__(
        self,
        output: OutputConfig,
        ckpt: Checkpoint,
        *,
        schema: pa.Schema,
        stats: RunStats,
        claim: dict[str, Any],
        decision: Decision | None,
        metadata: dict[str, str],
        todo: Pending,
        on_commit: Callable[[Chunk, dict[str, Any], bool], None] = lambda *committed: None,
    ) -> None:
        """``on_commit`` is told of each chunk (or piece of one) once its commit record is
        written, and whether that completes the chunk the run was given."""
        schema = ckpt.format.fit(schema)  # a table's types (no fixed-size lists, say)
        self.output, self.ckpt, self.schema, self.stats = output, ckpt, schema, stats
        # a table's chunks keep their rows' keys (`batchscore.output.keys`): none by id
        self.id = ckpt.format.id_column
        self.keyed = key_columns(schema, self.id)
        self.claim, self.decision, self.metadata = claim, decision, metadata
        self.bad_by_shard, self.total_rows = todo.bad_by_shard, todo.total_rows
        self.on_commit = on_commit
        self.open: dict[str, Staged] = {}  # chunk key -> its file, while parts are missing
        self.staged: list[Staged] = []  # complete chunks waiting for their group's commit
        self.failures: list[dict[str, str]] = []
        self.failed_shards: set[int] = set()

    def __call__(self, parts: list[Scored]) -> None:
        """Take a handoff of a window's parts (one per chunk); commit what they complete."""
        for part in parts:
            self.take(part)
            if len(self.staged) >= GROUP:
                self.commit()
        self.cut_due()
        if self.staged:
            self.commit()

    def take(self, item: Scored) -> None:
        chunk = item.chunk
        if chunk.shard.index in self.failed_shards:
            return
        try:
            if item.error is not None:
                raise item.error
            file = self.open.get(chunk.key)
            if file is None:
                file = self.open[chunk.key] = Staged(chunk, self.writer_for(chunk))
            rows = conform(item.table, self.schema, chunk)
            file.writer.append(rows)
            if self.keyed:
                file.keys.append(rows.select(self.keyed))
            file.read += item.table.num_rows if item.read is None else item.read
            if file.since is None:  # its rows' clock starts with the first of them
                file.since = time.monotonic() if item.started is None else item.started
        except InputDataError as exc:
            self.drop_open(chunk.shard.index)  # the staged chunks are complete: they commit
            self.failed_shards.add(chunk.shard.index)
            self.failures.append({"shard": chunk.shard.path, "error": str(exc)})
            return
        if item.rejected is not None and item.rejected.num_rows:
            file.rejected.append(item.rejected)
        if file.read == file.chunk.rows:
            self.staged.append(self.open.pop(chunk.key))

    def cut_due(self) -> None:
        """Stage, as a piece, the rows of every open chunk that began scoring half of
        ``commit_s`` ago or more (see the module's note); the rest of each stays open."""
        due = time.monotonic() - self.output.commit_s / 2
        for file in self.open.values():
            if file.read and file.since is not None and file.since <= due:
                piece, rest = file.chunk.cut(file.chunk.start + file.read)
                staged = Staged(piece, file.writer)
                staged.read, staged.rejected, staged.done = file.read, file.rejected, False
                self.staged.append(staged)
                file.chunk, file.writer = rest, self.writer_for(rest)
                file.read, file.rejected, file.since = 0, [], None

    def writer_for(self, chunk: Chunk) -> ChunkWriter:
        """A writer for the chunk's file, its footer naming the source shard (and, once it is
        staged, the chunk and rows it holds: `finish`)."""
        metadata = {**self.metadata, "batchscore.shard": chunk.shard.path}
        return ChunkWriter(self.ckpt.store, chunk.key, self.schema, metadata)

    def commit(self) -> None:
        """Commit the staged chunks as one group (see the module's note)."""
        group, self.staged = self.staged, []
        try:
            records = self.publish(group)
        except BaseException:  # nothing of the group is committed: no staged file stays
            for staged in group:
                staged.writer.abort()
            raise
        for staged, committed in zip(group, records, strict=True):
            self.committed(staged.chunk, committed, done=staged.done)
        certain = bad_share_error(
            self.bad_by_shard,
            total=self.total_rows,
            limit=self.output.max_bad_share,
            ckpt=self.ckpt,
        )
        if certain is not None:  # over the limit however the rest turns out: stop now
            raise certain

    def publish(self, group: list[Staged]) -> list[dict[str, Any]]:
        """The protocol's steps for the whole group; returns the records written."""
        self.finish(group)
        if self.claim is not None:  # the folder is this job's from its first commit on
            self.ckpt.claim(self.claim)
            if self.decision:
                self.ckpt.settle(self.decision)
            self.claim = None
        self.ckpt.intend([intent(s.chunk, s.facts) for s in group])
        for staged in group:
            staged.writer.publish(durable=False)
        self.ckpt.barrier("")  # every rename above made durable by one folder sync
        if self.keyed:  # the chunks' keys, durable before their rows join the table
            self.ckpt.barrier(KEYS)
        files = [(s.chunk.key, s.facts) for s in group]  # one commit of the format's log
        self.ckpt.format.append(files, schema=self.schema, metadata=self.metadata)
        faults.hit("after-table-commit")
        bad = {}
        for staged in group:
            bad[staged.chunk.key] = sum(t.num_rows for t in staged.rejected)
            if bad[staged.chunk.key]:
                lines = rejected_lines(staged.rejected)
                self.ckpt.store.write_text(rejected_name(staged.chunk.key), lines)
        records = [record(s.chunk, s.facts, bad[s.chunk.key]) for s in group]
        self.ckpt.commit(records)
        return records

    def finish(self, group: list[Staged]) -> None:
        """Close, fsync and check every staged file of the group, a few at once; in a Delta
        table, publish each chunk's keys (made durable by the group's barrier)."""

        def one(staged: Staged) -> None:
            chunk = staged.chunk
            rows = f"{chunk.start}-{chunk.stop}"
            staged.writer.name(chunk.key, {"batchscore.chunk": chunk.key, "batchscore.rows": rows})
            staged.facts = staged.writer.finish(staged.writer.rows)
            if self.keyed:
                empty = [self.schema.empty_table().select(self.keyed)]
                rows = pa.concat_tables(staged.keys or empty)
                keys = keys_of(rows, self.id, written=self.schema)
                if keys is not None:
                    publish_keys(self.ckpt.store, staged.chunk.key, keys, durable=False)

        in_shares(one, group, FINISHERS)

    def committed(self, chunk: Chunk, committed: dict[str, Any], *, done: bool) -> None:
        """Count a chunk (or piece, not ``done``) whose record is written; tell ``on_commit``."""
        self.on_commit(chunk, committed, done)
        self.stats.chunks_committed += done
        self.stats.bad_rows += committed["bad_rows"]
        self.stats.filtered += committed["filtered"]
        path = chunk.shard.path
        self.bad_by_shard[path] = self.bad_by_shard.get(path, 0) + committed["bad_rows"]

    def abort(self) -> None:
        """Drop the open chunks and the staged ones, if any; nothing of them becomes visible."""
        self.drop_open()
        for staged in self.staged:
            staged.writer.abort()
        self.staged = []

    def drop_open(self, shard: int | None = None) -> None:
        """Drop the open chunks (of ``shard`` alone, if given); none of them becomes visible."""
        for key, file in list(self.open.items()):
            if shard is None or file.chunk.shard.index == shard:
                file.writer.abort()
                del self.open[key]


def conform(table: pa.Table, schema: pa.Schema, chunk: Chunk) -> pa.Table:
    """Cast a window to the output schema, every value exactly (`cast_exactly`: one folder,
    one schema, `batchscore.output.drift`); a value that does not fit fails its shard."""
    if table.schema == schema:
        return table
    try:
        if sorted(table.column_names) == sorted(schema.names):  # the row hash goes last
            table = table.select(schema.names)  # (`output_schema`); other mismatches: cast's
            return cast_exactly(table, schema)
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputDataError(
            f"{chunk.shard.path}: rows {chunk.start}-{chunk.stop}: {exc}; the output folder "
            "holds the column in another type, which cannot hold this value exactly"
        ) from exc


def intent(chunk: Chunk, facts: FileFacts) -> dict[str, Any]:
    """What the intent says of a chunk's file before it is published."""
    return {"chunk": chunk.key, "file": part_name(chunk.key), **facts.as_record()}


def record(chunk: Chunk, facts: FileFacts, bad_rows: int) -> dict[str, Any]:
    """The commit record of a chunk: its data file as written (the manifest entry), and enough
    to skip the chunk on resume and to notice its shard change.

    ``rows`` are the output rows (those that passed `where`); ``filtered`` the input rows of
    the chunk's range that did not (none in a chunk that picked its rows by row: `where` was
    applied when they were picked, and the rows it did not pick are not filtered). A piece's
    record names the whole chunk (``piece_of``) and its rows (``span``: `batchscore.output.pieces`).
    """
    piece = {} if chunk.whole else {"piece_of": chunk.whole_key, "span": list(chunk.span)}
    return {
        "chunk": chunk.key,
        "file": part_name(chunk.key),
        **facts.as_record(),
        "shard": chunk.shard.identity,
        "chunks": chunk.of,
        "start": chunk.start,
        "stop": chunk.stop,
        "filtered": chunk.picked - facts.rows,
        "bad_rows": bad_rows,
        "committed_at": time.time(),
        **piece,
    }
