"""The plan of work: shards cut into chunks (the unit of commit), and which are still to score.

A chunk is a fixed row range of one shard, so a resumed run cuts exactly the same chunks again;
which of them are pending is decided from commit records and footers.

Committed chunks are trusted only while their shard is unchanged (same path, size and mtime);
a changed or vanished shard's chunks are un-committed, so the output always mirrors the input.
A shard whose footer, columns or column types are unusable fails alone, before any scoring;
an `[input].where` that does not fit a shard's columns is the job's error, not the shard's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pyarrow as pa

from batchscore.errors import InputDataError, JobError
from batchscore.job.sections import InputConfig
from batchscore.job.where import RowFilter
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.layout import chunk_key, shard_of
from batchscore.pipeline.shards import Shard, check_columns, open_shard

log = logging.getLogger("batchscore")


@dataclass(frozen=True)
class Chunk:
    """A fixed row range of one shard: the unit of commit."""

    shard: Shard
    index: int
    start: int
    stop: int
    of: int  # how many chunks the shard has

    @property
    def key(self) -> str:
        """Deterministic name from shard and chunk numbers; never from input strings."""
        return chunk_key(self.shard.key, self.index)

    @property
    def rows(self) -> int:
        return self.stop - self.start


def chunks_of(shard: Shard, num_rows: int, chunk_rows: int) -> list[Chunk]:
    """Cut a shard into fixed row ranges of `chunk_rows` (one chunk when the shard is small)."""
    starts = range(0, max(num_rows, 1), chunk_rows)
    return [
        Chunk(shard, i, s, min(s + chunk_rows, num_rows), len(starts)) for i, s in enumerate(starts)
    ]


@dataclass
class Pending:
    """The chunks to score, and what was learned on the way."""

    chunks: list[Chunk] = field(default_factory=list)
    carried: pa.Schema | None = None  # output types of the carried columns
    failures: list[dict[str, str]] = field(default_factory=list)
    done_chunks: int = 0
    done_rows: int = 0


def family(kind: pa.DataType) -> str:
    """Types within one family cast into each other safely enough to share an output column."""
    for name, test in (
        ("integer", pa.types.is_integer),
        ("floating", pa.types.is_floating),
        ("string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)),
        ("binary", lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t)),
    ):
        if test(kind):
            return name
    return str(kind)


def check_drift(shard: Shard, schema: pa.Schema, reference: pa.Schema, source: str) -> None:
    """Carried columns must keep their type across shards, or output parts would not agree."""
    for ref in reference:
        found = schema.field(ref.name).type
        if found != ref.type and family(found) != family(ref.type):
            raise InputDataError(
                f"{shard.path}: column {ref.name!r} is {found} here but {ref.type} in {source}; "
                "output files must share one schema, so this shard is not scored"
            )


def pending_work(
    inp: InputConfig,
    *,
    kinds: dict[str, str],
    chunk_rows: int,
    shards: list[Shard],
    ckpt: Checkpoint,
    forget: bool = True,
) -> Pending:
    """Un-commit stale chunks, check every shard still to score, and list its pending chunks.

    ``forget=False`` (a dry run) leaves the stale chunks' records on disk, counting them pending.
    """
    plan = Pending()
    rows_filter = RowFilter(inp.where) if inp.where is not None else None
    committed = ckpt.committed()
    live = {s.key: s for s in shards}
    for key, record in sorted(committed.items()):
        shard = live.get(shard_of(key))
        if shard is None or record["shard"] != shard.identity:
            log.warning(
                "%s changed or is gone since it was scored; its output is redone",
                record["shard"]["path"],
            )
            if forget:
                ckpt.forget(key)
            del committed[key]
    reference: tuple[pa.Schema, str] | None = None
    for shard in shards:
        records = [r for key, r in committed.items() if shard_of(key) == shard.key]
        if records and len(records) == records[0]["chunks"] and reference is not None:
            plan.done_chunks += len(records)
            plan.done_rows += sum(r["rows"] for r in records)
            continue  # whole shard committed: its rows are not read again
        try:
            pf = open_shard(shard)
            check_where(rows_filter, shard, pf.schema_arrow)
            check_columns(shard, pf.schema_arrow, inp.carried, kinds)
            carried = pa.schema([pf.schema_arrow.field(c) for c in inp.carried])
            if reference is None:
                reference = (carried, shard.path)
            check_drift(shard, carried, *reference)
        except InputDataError as exc:
            plan.failures.append({"shard": shard.path, "error": str(exc)})
            continue
        for chunk in chunks_of(shard, pf.metadata.num_rows, chunk_rows):
            if chunk.key in committed:
                plan.done_chunks += 1
                plan.done_rows += committed[chunk.key]["rows"]
            else:
                plan.chunks.append(chunk)
    plan.carried = reference[0] if reference else pa.schema([])
    return plan


def check_where(rows_filter: RowFilter | None, shard: Shard, schema: pa.Schema) -> None:
    """A predicate naming a column the input lacks is a mistake in the job file (exit 2)."""
    problem = rows_filter.check(schema) if rows_filter is not None else None
    if problem:
        raise JobError(f"[input].where: {problem} ({shard.path})")
