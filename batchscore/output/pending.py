"""The plan of work: shards cut into chunks (the unit of commit), and which are still to score.

A chunk is a fixed row range of one shard, so a resumed run cuts exactly the same chunks again;
which of them are pending is decided from commit records, the data files' footers and the
shards' footers. A committed chunk is trusted while its data file is as written (see
`batchscore.output.manifest`) and its shard is unchanged (same path, size and mtime); a missing
or changed file, or a changed shard, puts it back to pending. Shards are known by a key made
from their path, so adding, removing or renaming a shard never touches another's output; the
output of a shard that left the input moves out of the data files (`status` lists it as gone).

A shard whose footer, columns or column types are unusable fails alone, before any scoring;
an `[input].where` that does not fit a shard's columns is the job's error, not the shard's.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from batchscore.errors import InputDataError, JobError, OutputConflictError
from batchscore.job.sections import InputConfig
from batchscore.job.where import RowFilter
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.manifest import problems, written_for
from batchscore.output.neighbours import (
    backfill,
    check_carried,
    check_keys,
    reconcile,
    taken_over,
)
from batchscore.output.retire import finish_retiring, retire, summary
from batchscore.storage.fs import is_url
from batchscore.storage.layout import part_name, shard_of
from batchscore.work.shards import check_columns, is_text, open_shard
from batchscore.work.units import Chunk, Shard, chunks_of

log = logging.getLogger("batchscore")
FOOTER_READS = 8  # object-store shard footers read at once while the plan is made


@dataclass
class Pending:
    """The chunks to score, and what was learned on the way."""

    chunks: list[Chunk] = field(default_factory=list)
    # the input as listed for this plan: what else the run reads of it (the sample measured
    # on) comes from the same listing, never from a second one
    shards: list[Shard] = field(default_factory=list)
    carried: pa.Schema | None = None  # output types of the carried columns
    failures: list[dict[str, str]] = field(default_factory=list)
    redone: list[dict[str, str]] = field(default_factory=list)  # committed, now to score again
    gone: list[dict] = field(default_factory=list)  # shards no longer input: their output
    done_chunks: int = 0
    done_rows: int = 0
    total_rows: int = 0  # the job's input rows, from the footers (the bad-row gate's base)
    bad_by_shard: dict[str, int] = field(default_factory=dict)  # committed rows with an error
    increments: dict[str, int] | None = None  # by rows: the diff's counts (`output.diff`)
    retired: list[dict] = field(default_factory=list)  # by rows: the retirements made


def family(kind: pa.DataType) -> str:
    """Types within one family cast into each other safely enough to share an output column."""
    if pa.types.is_dictionary(kind):
        return family(kind.value_type)
    for name, test in (
        ("integer", pa.types.is_integer),
        ("floating", pa.types.is_floating),
        ("string", is_text),
        ("binary", lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t)),
    ):
        if test(kind):
            return name
    return str(kind)


def typed(reference: pa.Schema, schema: pa.Schema) -> pa.Schema:
    """The reference with its all-null columns (an empty shard's, say) typed by ``schema``."""
    fields = [schema.field(f.name) if pa.types.is_null(f.type) else f for f in reference]
    return pa.schema(fields)


def check_drift(shard: Shard, schema: pa.Schema, reference: pa.Schema, source: str) -> None:
    """Carried columns must keep their type across shards, or output parts would not agree.
    A column of nulls only (type null) fits any type."""
    for ref in reference:
        found = schema.field(ref.name).type
        if pa.types.is_null(found) or pa.types.is_null(ref.type):
            continue
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
    fingerprint: str,
    forget: bool = True,
) -> Pending:
    """Un-commit what no longer holds, check every shard still to score, list its chunks.

    ``forget=False`` (a dry run) changes nothing on disk: what no longer holds counts pending.
    """
    plan = Pending(shards=shards)
    rows_filter = inp.row_filter
    if forget and ckpt.table is not None and shards:  # before anything retires or is forgotten
        check_carried(ckpt, carried_by(shards[0], inp))
    committed = stale(ckpt, shards, plan, fingerprint=fingerprint, forget=forget)
    by_shard: dict[str, list[dict]] = {}
    for key, record in committed.items():
        by_shard.setdefault(shard_of(key), []).append(record)
    whole = {s.key for s in shards if whole_shard(by_shard.get(s.key, []))}
    reference: tuple[pa.Schema, str] | None = None
    pool = ThreadPoolExecutor(FOOTER_READS)
    try:
        # footers in an object store are read ahead (each waits on a round trip); local ones
        # here, one by one: each takes a tenth of a millisecond, less than a thread's handoff
        remote = [s for s in shards if s.key not in whole and is_url(s.path)]
        ahead = {s.key: pool.submit(read_footer, s) for s in remote}
        for shard in shards:
            records = by_shard.get(shard.key, [])
            plan.bad_by_shard[shard.path] = sum(r["bad_rows"] for r in records)
            if shard.key in whole and reference is not None:
                plan.done_chunks += len(records)
                plan.done_rows += sum(r["rows"] for r in records)
                plan.total_rows += sum(r["stop"] - r["start"] for r in records)
                continue  # whole shard committed: its rows are not read again
            footer = ahead[shard.key].result() if shard.key in ahead else read_footer(shard)
            reference = plan_shard(
                plan, shard, footer, reference, inp, kinds, rows_filter, chunk_rows, committed
            )
    finally:  # a storage error stops the plan: the footers not yet read are not read
        pool.shutdown(cancel_futures=True)
    plan.carried = reference[0] if reference else pa.schema([])
    if forget:  # a dry run leaves the folder as it is
        check_room(ckpt, plan.chunks, fingerprint)
    return plan


def carried_by(shard: Shard, inp: InputConfig) -> pa.Schema | None:
    """The columns a shard carries to the output, as its footer has them (None: it cannot
    be read, or lacks one: the plan fails it alone)."""
    footer = read_footer(shard)
    if isinstance(footer, InputDataError):
        return None
    try:
        return pa.schema([footer.schema.field(c) for c in inp.copied])
    except KeyError:  # a column missing, or named twice
        return None


def whole_shard(records: list[dict]) -> bool:
    """Whether these commit records cover every chunk of their shard."""
    return bool(records) and len(records) == records[0]["chunks"]


@dataclass(frozen=True)
class Footer:
    """What planning needs of a shard's footer (the file itself is closed again)."""

    rows: int
    schema: pa.Schema


def read_footer(shard: Shard) -> Footer | InputDataError:
    """A shard's row count and schema, or the error that names it. An object store's footers
    are read a few at a time: each read waits on a round trip, not on Python."""
    try:
        pf = open_shard(shard)
    except InputDataError as exc:
        return exc
    try:
        return Footer(pf.metadata.num_rows, pf.schema_arrow)
    finally:
        pf.close()


def plan_shard(
    plan: Pending,
    shard: Shard,
    footer: Footer | InputDataError,
    reference: tuple[pa.Schema, str] | None,
    inp: InputConfig,
    kinds: dict[str, str],
    rows_filter: RowFilter | None,
    chunk_rows: int,
    committed: dict[str, dict],
) -> tuple[pa.Schema, str] | None:
    """Check one shard against the job and the shards before it, and add its chunks to the
    plan (those committed as done); returns the schema later shards must match."""
    fits, reference = check_shard(plan, shard, footer, reference, inp, kinds, rows_filter)
    if not fits:
        return reference
    for chunk in chunks_of(shard, footer.rows, chunk_rows):
        if chunk.key in committed:
            plan.done_chunks += 1
            plan.done_rows += committed[chunk.key]["rows"]
        else:
            plan.chunks.append(chunk)
    return reference


def check_shard(
    plan: Pending,
    shard: Shard,
    footer: Footer | InputDataError,
    reference: tuple[pa.Schema, str] | None,
    inp: InputConfig,
    kinds: dict[str, str],
    rows_filter: RowFilter | None,
) -> tuple[bool, tuple[pa.Schema, str] | None]:
    """Whether one shard's footer fits the job and the shards before it (if not, its failure
    is in ``plan``), and the schema later shards must match."""
    try:
        if isinstance(footer, InputDataError):
            raise footer
        plan.total_rows += footer.rows
        check_columns(shard, footer.schema, inp.copied, kinds)
        check_where(rows_filter, shard, footer.schema)
        carried = pa.schema([footer.schema.field(c) for c in inp.copied])
        if reference is None:
            reference = (carried, shard.path)
        else:
            check_drift(shard, carried, *reference)
            reference = (typed(reference[0], carried), reference[1])
    except InputDataError as exc:
        plan.failures.append({"shard": shard.path, "error": str(exc)})
        return False, reference
    return True, reference


def stale(
    ckpt: Checkpoint, shards: list[Shard], plan: Pending, *, fingerprint: str, forget: bool = True
) -> dict[str, dict]:
    """The commit records that still hold; un-commit the others (unless ``forget`` is off, for
    a dry run) and say why in ``plan``.

    The output of a shard that left the input moves out of the data files first, kept under
    ``_batchscore/gone/`` (see `batchscore.output.retire`); a dry run only lists it. In a
    Delta table, a chunk another writer took over is committed whatever became of its file
    (`batchscore.output.neighbours`); one that must leave must have keys to find its rows by,
    which is checked before anything changes.
    """
    live = {s.key: s for s in shards}
    plan.gone = finish_retiring(ckpt) if forget else []
    committed = ckpt.committed()
    taken = taken_over(ckpt, committed)
    if forget:
        backfill(ckpt, committed)
        leaving = {
            key: record
            for key, record in committed.items()
            if shard_of(key) not in live or record["shard"] != live[shard_of(key)].identity
        }
        check_keys(ckpt.table, leaving, "the shards that changed or left the input")
        plan.gone += retire(ckpt, committed, set(live), fingerprint=fingerprint)
    for where in ckpt.drop_damaged() if forget else []:
        log.warning("%s was damaged and is removed; its chunk is scored again", where)
    damaged = problems(ckpt.store, {k: r for k, r in committed.items() if k not in taken})
    redo: list[str] = []
    for key, record in sorted(committed.items()):
        shard = live.get(shard_of(key))
        rows = f"rows {record['start']}-{record['stop']} of {record['shard']['path']}"
        if key in damaged:
            why = f"{record['file']} is {damaged[key]}"
        elif shard is not None and record["shard"] != shard.identity:
            why = (
                f"{record['shard']['path']} changed since it was scored (by shards, a changed "
                'shard is scored again whole; with [input].id, increments = "rows" scores '
                "only its changed rows)"
            )
        else:
            continue
        if shard is not None:
            log.warning("%s: %s are scored again", why, rows)
            plan.redone.append({"chunk": key, "file": record["file"], "why": why})
        redo.append(key)
    if forget and ckpt.table is not None:  # the rows of those taken over leave in one merge
        ckpt.table.retire(key for key in redo if key in taken)
    for key in redo:
        if forget:
            ckpt.forget(key, committed[key])
        del committed[key]
    plan.gone += summary({k: r for k, r in committed.items() if shard_of(k) not in live})
    if forget:  # the table's files: the committed chunks' files (but those taken over)
        reconcile(ckpt, committed)
    return committed


def check_room(ckpt: Checkpoint, chunks: list[Chunk], fingerprint: str) -> None:
    """Make room for the pending chunks' files, touching only batchscore's own.

    A file at a pending chunk's name whose footer says this job wrote it for that chunk (its
    commit record was lost) is a crashed attempt's, and is removed: it is replaced, never
    appended to. Any other file there was not written by batchscore: the run refuses, before
    scoring, and leaves it as it is.
    """
    names = set(ckpt.store.names(""))
    for chunk in chunks:
        name = part_name(chunk.key)
        if name not in names:
            continue
        footer = written_for(ckpt.store, name)
        if footer.get("batchscore.chunk") == chunk.key and (
            footer.get("batchscore.fingerprint") == fingerprint
        ):
            log.info("removed %s: an unrecorded attempt of this job", ckpt.store.where(name))
            ckpt.remove(name)  # `_SUCCESS` first: see `Checkpoint.remove`
        else:
            raise OutputConflictError(
                f"{ckpt.store.where(part_name(chunk.key))}: a file batchscore did not write is "
                "where this job's output goes; it is left as it is: move it away, or point "
                "[output].path at another folder"
            )


def check_where(rows_filter: RowFilter | None, shard: Shard, schema: pa.Schema) -> None:
    """A predicate naming a column the input lacks is a mistake in the job file (exit 2); a
    shard with two columns of a name it reads is the shard's (it fails alone)."""
    if rows_filter is None:
        return
    check_columns(shard, schema, tuple(c for c in rows_filter.columns if c in schema.names), {})
    problem = rows_filter.check(schema)
    if problem:
        raise JobError(f"[input].where: {problem} ({shard.path})")
