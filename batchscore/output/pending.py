"""The plan of work: shards cut into chunks (the unit of commit), and which are still to score.

A chunk is a fixed row range of one shard, so a resumed run cuts exactly the same chunks again;
which of them are pending is decided from commit records, the data files' footers and the
shards' footers. A committed chunk is trusted while its data file is as written (see
`batchscore.output.manifest`) and its shard is unchanged (same path, size and mtime); a missing
or changed file, or a changed shard, puts it back to pending. A chunk committed in pieces
(`[output].commit_s`, `batchscore.output.pieces`) is pending for the rows no piece holds.
Shards are known by a key made from their path, so adding, removing or renaming a shard never
touches another's output; the output of a shard that left the input moves out of the data
files (`status` lists it as gone).

Planning only reads (`plan_shards` makes a `batchscore.output.survey.Plan`); a run carries
the plan out (`batchscore.output.apply`).

A shard whose footer, columns or column types are unusable fails alone, before any scoring;
an `[input].where` that does not fit a shard's columns is the job's error, not the shard's. A
carried column whose type the folder's committed files cannot hold exactly refuses the run
before anything is retired or un-committed (`batchscore.output.drift`).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pyarrow as pa

from batchscore.errors import InputDataError, JobError
from batchscore.job.sections import InputConfig
from batchscore.job.where import RowFilter
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.drift import Reference, check_drift, folder_reference
from batchscore.output.manifest import problems, written_for
from batchscore.output.neighbours import taken_over
from batchscore.output.pieces import gaps, pieces_by_chunk, whole_chunks
from batchscore.output.retire import summary
from batchscore.output.survey import Plan, Room, Survey
from batchscore.storage.fs import is_url
from batchscore.storage.layout import part_name, shard_of
from batchscore.storage.store import Store
from batchscore.work.shards import check_columns, open_shard
from batchscore.work.units import Chunk, Shard, chunks_of

log = logging.getLogger("batchscore")
FOOTER_READS = 8  # object-store shard footers read at once while the plan is made


@dataclass
class Pending:
    """The chunks a run scores, and what was learned on the way: while a plan is made, its
    counts as they are gathered; in a run, its own copy of the plan as carried out
    (`batchscore.output.apply`), which the committer counts into."""

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
    # by rows: shard index -> its rows that pass `where` (the diff's, read once)
    passing: dict[int, int] = field(default_factory=dict)
    retired: list[dict] = field(default_factory=list)  # by rows: the retirements made

    def frozen(self, ckpt: Checkpoint, survey: Survey, **actions: Any) -> Plan:
        """These counts as a `Plan`, with the ``actions`` a run must take (`Plan`'s fields;
        the room to make and the table's reconciliation are `batchscore.output.todo`'s)."""
        return Plan(
            survey,
            self.chunks,
            self.carried,
            self.failures,
            self.redone,
            self.gone,
            self.done_chunks,
            self.done_rows,
            self.total_rows,
            self.bad_by_shard,
            self.increments,
            self.passing,
            damaged=MappingProxyType(dict(ckpt.damaged)),
            uncommit=tuple(r["chunk"] for r in self.redone),
            **actions,
        )


def plan_shards(ckpt: Checkpoint, survey: Survey) -> Plan:
    """The plan of a run by shards: what no longer holds is to un-commit (or, of a shard that
    left the input, to retire), every shard still to score is checked and cut into chunks.
    Reads only (`Plan`)."""
    inp, shards = survey.inp, list(survey.shards)
    kinds, chunk_rows = survey.kinds, survey.chunk_rows
    plan = Pending(shards=shards)
    rows_filter = inp.row_filter
    committed = ckpt.committed()
    as_read = MappingProxyType(dict(committed))
    reference = folder_reference(ckpt.store, committed, inp.copied)
    records = by_shard_key(committed)
    footers = read_footers([s for s in shards if not settled(s, records.get(s.key, []))])
    if reference is not None:  # a drift refuses the run before anything changes
        check_folder(shards, footers, reference, inp.copied)
    taken = frozenset(taken_over(ckpt, committed))
    committed = stale(shards, plan, committed, store=ckpt.store, taken=taken)
    by_shard = by_shard_key(committed)
    whole = {s.key for s in shards if whole_shard(by_shard.get(s.key, []))}
    for shard in shards:
        records = by_shard.get(shard.key, [])
        plan.bad_by_shard[shard.path] = sum(r["bad_rows"] for r in records)
        if shard.key in whole and reference is not None:
            plan.done_chunks += records[0]["chunks"]
            plan.done_rows += sum(r["rows"] for r in records)
            plan.total_rows += sum(r["stop"] - r["start"] for r in records)
            continue  # whole shard committed: its rows are not read again
        footer = footers[shard.key] if shard.key in footers else read_footer(shard)
        reference = plan_shard(
            plan, shard, footer, reference, inp, kinds, rows_filter, chunk_rows, records
        )
    plan.carried = reference.schema if reference else pa.schema([])
    live = {s.key for s in shards}
    return plan.frozen(
        ckpt,
        survey,
        records=as_read,
        leaving=frozenset(k for k in as_read if shard_of(k) not in live),
        taken=taken,
        take_out=frozenset(r["chunk"] for r in plan.redone) & taken,
    )


def by_shard_key(committed: dict[str, dict]) -> dict[str, list[dict]]:
    """The commit records of each shard, by its key."""
    found: dict[str, list[dict]] = {}
    for key, record in committed.items():
        found.setdefault(shard_of(key), []).append(record)
    return found


def settled(shard: Shard, records: list[dict]) -> bool:
    """Whether ``records`` commit every chunk of the shard as it is now (its footer need not
    be read)."""
    return whole_shard(records) and all(r["shard"] == shard.identity for r in records)


def read_footers(shards: list[Shard]) -> dict[str, Footer | InputDataError]:
    """Each shard's footer (`read_footer`), by its key; in an object store a few at a time
    (each waits on a round trip), here one by one (a tenth of a millisecond each, less than a
    thread's handoff). A storage error stops the plan: the footers not yet read are not."""
    pool = ThreadPoolExecutor(FOOTER_READS)
    try:
        ahead = {s.key: pool.submit(read_footer, s) for s in shards if is_url(s.path)}
        return {s.key: ahead[s.key].result() if s.key in ahead else read_footer(s) for s in shards}
    finally:
        pool.shutdown(cancel_futures=True)


def check_folder(
    shards: list[Shard],
    footers: dict[str, Footer | InputDataError],
    reference: Reference,
    copied: tuple[str, ...],
) -> None:
    """`SchemaDriftError` for the first shard whose carried columns the folder's types do not
    hold; a shard that fails for another reason (unreadable, a column missing) is left to fail
    alone in the plan."""
    for shard in shards:
        footer = footers.get(shard.key)
        if footer is None or isinstance(footer, InputDataError):
            continue
        schema = footer.schema
        if all(len(schema.get_all_field_indices(c)) == 1 for c in copied):
            check_drift(shard, pa.schema([schema.field(c) for c in copied]), reference)


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
    """Whether these commit records cover every chunk of their shard (some maybe in pieces)."""
    return bool(records) and len(whole_chunks(records)) == records[0]["chunks"]


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
    reference: Reference | None,
    inp: InputConfig,
    kinds: dict[str, str],
    rows_filter: RowFilter | None,
    chunk_rows: int,
    records: list[dict],
) -> Reference | None:
    """Check one shard against the job and the shards before it, and add its chunks to the
    plan (those its commit ``records`` hold as done; of a chunk committed in part, the rows
    its pieces do not hold); returns the schema later shards must match."""
    fits, reference = check_shard(plan, shard, footer, reference, inp, kinds, rows_filter)
    if not fits:
        return reference
    committed = {r["chunk"]: r for r in records}
    pieces = pieces_by_chunk(records)
    for chunk in chunks_of(shard, footer.rows, chunk_rows):
        if chunk.key in committed:
            plan.done_chunks += 1
            plan.done_rows += committed[chunk.key]["rows"]
            continue
        done = pieces.get(chunk.key, [])
        plan.done_rows += sum(r["rows"] for r in done)
        rest = gaps(chunk, done)
        plan.done_chunks += not rest
        plan.chunks += rest
    return reference


def check_shard(
    plan: Pending,
    shard: Shard,
    footer: Footer | InputDataError,
    reference: Reference | None,
    inp: InputConfig,
    kinds: dict[str, str],
    rows_filter: RowFilter | None,
) -> tuple[bool, Reference | None]:
    """Whether one shard's footer fits the job and the shards before it (if not, its failure
    is in ``plan``), and the types later shards must fit (`batchscore.output.drift`: a type
    the folder's committed files cannot hold refuses the run, `SchemaDriftError`)."""
    try:
        if isinstance(footer, InputDataError):
            raise footer
        plan.total_rows += footer.rows
        check_columns(shard, footer.schema, inp.copied, kinds)
        check_where(rows_filter, shard, footer.schema)
        carried = pa.schema([footer.schema.field(c) for c in inp.copied])
        reference = check_drift(shard, carried, reference)
    except InputDataError as exc:
        plan.failures.append({"shard": shard.path, "error": str(exc)})
        return False, reference
    return True, reference


def stale(
    shards: list[Shard],
    plan: Pending,
    committed: dict[str, dict],
    *,
    store: Store,
    taken: frozenset[str],
) -> dict[str, dict]:
    """The ``committed`` records that still hold; of the others, say in ``plan`` why their
    chunks are scored again (a run un-commits them: `batchscore.output.apply`).

    The output of a shard that left the input is listed in ``plan.gone`` as it stands (a run
    moves it out of the data files first, kept under ``_batchscore/gone/``: see
    `batchscore.output.retire`). In a Delta table, a chunk another writer took over
    (``taken``) is committed whatever became of its file (`batchscore.output.neighbours`).
    """
    live = {s.key: s for s in shards}
    committed = dict(committed)
    damaged = problems(store, {k: r for k, r in committed.items() if k not in taken})
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
        del committed[key]
    plan.gone += summary({k: r for k, r in committed.items() if shard_of(k) not in live})
    return committed


def plan_room(
    store: Store, chunks: list[Chunk], fingerprint: str, *, removed: set[str]
) -> tuple[Room, ...]:
    """The files at the pending chunks' names (a chunk's own, or its first piece's), but
    those the run ``removed`` before it makes room, in the order a run meets them (none
    without a ``fingerprint``: a look that makes no room).

    A file whose footer says this job wrote it for that chunk (its commit record was lost) is
    a crashed attempt's: the run removes it, as it is replaced, never appended to. Any other
    was not written by batchscore: the run refuses, before scoring, and leaves it as it is
    (`batchscore.output.apply.make_room`).
    """
    if not fingerprint:
        return ()
    names = set(store.names("")) - removed
    found = []
    for key in (key for chunk in chunks for key in chunk.names):
        name = part_name(key)
        if name not in names:
            continue
        footer = written_for(store, name)
        ours = footer.get("batchscore.chunk") == key and (
            footer.get("batchscore.fingerprint") == fingerprint
        )
        found.append(Room(name, ours))
    return tuple(found)


def check_where(rows_filter: RowFilter | None, shard: Shard, schema: pa.Schema) -> None:
    """A predicate naming a column the input lacks is a mistake in the job file (exit 2); a
    shard with two columns of a name it reads is the shard's (it fails alone)."""
    if rows_filter is None:
        return
    check_columns(shard, schema, tuple(c for c in rows_filter.columns if c in schema.names), {})
    problem = rows_filter.check(schema)
    if problem:
        raise JobError(f"[input].where: {problem} ({shard.path})")
