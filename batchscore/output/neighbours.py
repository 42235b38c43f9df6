"""A table's other writers, at a run's start: what they did, what batchscore does about it.

A table is shared. Other tools compact it (OPTIMIZE, Z-order), delete from it, vacuum it, add
columns to it and append rows of their own, and their commits are the table's truth:
batchscore never undoes them, never doubles a row because of them, and says what it did about
them. At the start of a run that may change the table, before anything changes:

1. `check_columns`: the table must still take batchscore's files (a column batchscore writes
   dropped, renamed or retyped is refused, naming it; a column added, nullable, is kept), and
   `check_carried` the input's columns as they now are (an id whose type changed);
2. `check_keys`: every chunk another writer took over that must leave the table (its shard
   left or changed, by rows its rows are diffed, a ``--restart``) must have its keys, or its
   rows could not be found among the table's (without an `[input].id` they cannot be);
3. `reconcile`: the table's files of batchscore's and the commit records are made one set,
   but for the chunks another writer took over: those are said once (which of its commits
   took them, from the log), marked in their records, and left as that writer left them.

A chunk another writer took over is committed: its file is the table's business now (gone, by
vacuum, is no damage), its rows are read by their keys, and it is never scored again while
its input holds (a row that writer deleted stays deleted until its input row changes).
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchscore.errors import WriteError
from batchscore.job.sections import ROW_HASH
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.drift import SchemaDriftError
from batchscore.output.format import OutputFormat
from batchscore.output.keys import key_columns, keys_of, publish_keys, read_keys, written_columns
from batchscore.storage.layout import DONE, keys_name, own_names, part_name, record_name
from batchscore.work.columns import canonical_schema

log = logging.getLogger("batchscore")
TAKEN = "handed"  # a record's note: which commits of another writer took its file over
NAMED = 5  # ids named in a refusal, at most


def taken_over(ckpt: Checkpoint, committed: dict[str, dict[str, Any]]) -> set[str]:
    """The committed chunks another writer took over (none where the folder is no table)."""
    return ckpt.format.handed(committed)


def check_columns(ckpt: Checkpoint) -> None:
    """Refuse (`WriteError`, naming the column) a table that no longer takes the files
    batchscore committed to it, before anything changes (`batchscore.output.delta_columns`)."""
    table = ckpt.format
    if table.exists():
        table.check_takes(written(ckpt, table))


def check_carried(ckpt: Checkpoint, carried: pa.Schema | None) -> None:
    """Refuse (`SchemaDriftError`, exit 5, naming the column, as a folder of files refuses
    the same drift), before anything changes, input columns this run carries that the table
    holds under another type (an id whose type changed in the input, say): the old rows
    would retire, then the new ones be refused. A table that holds no file takes any columns
    (`Table.mode_for`: after a --restart of a job that changed)."""
    table = ckpt.format
    if carried is None or not len(carried) or not table.holds_files():
        return
    ours = table.fit(canonical_schema(carried)).remove_metadata()
    try:
        table.check_takes(ours, what=" as the input's columns now are")
    except WriteError as exc:  # the input drifted, not the table: the folder's conflict
        raise SchemaDriftError(str(exc)) from None


def written(ckpt: Checkpoint, table: OutputFormat) -> pa.Schema | None:
    """The columns batchscore's committed files were written with: as a chunk's keys recall
    them, else as a committed file's footer says (None: nothing committed tells)."""
    for key in sorted(table.kept()):
        keys = read_keys(ckpt.store, key)
        if keys is not None and (columns := written_columns(keys)) is not None:
            return columns
    for name in sorted(own_names(DONE, ckpt.store.names(DONE))):
        try:
            record = ckpt.read_json(f"{DONE}/{name}", ("file",))
            if record is None or ckpt.store.size(record["file"]) is None:
                continue
            with ckpt.store.open_input(record["file"]) as fh:
                return table.fit(pq.read_schema(fh)).remove_metadata()
        except (ValueError, OSError, pa.ArrowException):
            continue
    return None


def check_keys(table: OutputFormat, records: dict[str, dict[str, Any]], doing: str) -> None:
    """Refuse (`WriteError`), before anything changes, to take chunks ``records`` out of the
    table for ``doing`` where some that another writer took over have no keys, or (by
    shards: keys of ids alone) where a row that stays holds an id of theirs: the merge that
    takes them out would take it too (another writer's row, or a row of a shard that stays)."""
    taken = table.handed(records)
    if not taken:
        return
    lacking = sorted(k for k in taken if table.store.size(keys_name(k)) is None)
    if lacking:
        shards = sorted({records[k]["shard"]["path"] for k in lacking})
        by = table.whose({part_name(k) for k in lacking})
        why = "an older batchscore wrote them" if table.id_column else "the job has no [input].id"
        raise WriteError(
            f"{table.uri}: {doing} would take {len(lacking)} committed chunk(s) of "
            f"{', '.join(shards)} out of {table.title}, but another writer rewrote their "
            f"files ({by}) and batchscore has no keys to find their rows by ({why}); "
            "batchscore changed nothing. Restore the table to a version before that writer's "
            "(deltalake's DeltaTable.restore, Iceberg's rollback to a snapshot) while their "
            "files are still there, or point [output].path at a new folder"
        )
    first = read_keys(table.store, min(taken))
    if first is None or ROW_HASH in first.column_names:  # by rows: the row hash tells rows apart
        return
    keys = [found for k in records if (found := read_keys(table.store, k)) is not None]
    shared = shared_ids(table, keys)
    if shared:
        raise WriteError(
            f"{table.uri}: {doing} would take rows of ids {', '.join(map(repr, shared))} out "
            f"of {table.title}, where another writer rewrote them into its own files, but "
            "rows that stay (another writer's, or a shard's that stays) hold those ids too, "
            "and a delete by id would take them as well; batchscore changed nothing. Make the "
            "ids unique in the table, or point [output].path at a new folder"
        )


def shared_ids(table: OutputFormat, keys: list[pa.Table]) -> list[Any]:
    """The first few ids the table holds more rows of than ``keys`` (the rows that leave)."""
    name = keys[0].column_names[0]
    leaving = pa.concat_tables([k.select([name]).replace_schema_metadata(None) for k in keys])
    want = leaving.group_by(name).aggregate([(name, "count")]).rename_columns([name, "want"])
    kind, values, found = want.schema.field(name).type, want.column(name), []
    for column in table.scan(name):  # every file: another writer's may hold the ids as
        ids = column.cast(kind)  # string_view, say
        found.append(ids.filter(pc.is_in(ids, value_set=values)))
    held = pa.table({name: pa.chunked_array(found, type=kind)})
    have = held.group_by(name).aggregate([(name, "count")]).rename_columns([name, "held"])
    both = have.join(want, name)
    return both.filter(pc.greater(both["held"], both["want"])).column(name).to_pylist()[:NAMED]


def reconcile(ckpt: Checkpoint, committed: dict[str, dict[str, Any]]) -> set[str]:
    """Make the table's batchscore files the ``committed`` chunks' files (records whose files
    are intact), but for the chunks another writer took over, which it returns: a chunk file
    the table holds with no record leaves it, and a record's file it lacks whose version is
    even (batchscore's append never reached the log) joins it, in one transaction (the table
    is made from the first one's columns if there is none). An unrecorded chunk another
    writer took over (a kill after its append, then a compaction) has its rows taken out by
    its keys, and keys no chunk needs go. A run keeps all this in step itself; this mends what
    a kill at an unforeseen moment, or a hand on the log, left apart."""
    table = ckpt.format
    if not table.exists() and committed:
        make(ckpt, table, committed)
    live, taken, kept = table.chunks(), table.handed(committed), table.kept()
    table.mend(committed, stray=sorted(live - set(committed)), missing=set(committed) - live)
    orphans = kept - set(committed) - live
    lost = sorted(table.handed(orphans))
    if lost:
        log.warning(
            "%s: another writer took over %d chunk file(s) batchscore added but never "
            "recorded (a killed run's); their rows leave %s by their keys, and "
            "are scored again",
            table.uri,
            len(lost),
            table.title,
        )
        table.take_back(lost)
    table.drop_keys(sorted(orphans | (kept & (live - set(committed)))))
    say(ckpt, table, committed, taken)
    return taken


def make(ckpt: Checkpoint, table: OutputFormat, committed: dict[str, dict[str, Any]]) -> None:
    """Make the table (its log was deleted) with the first committed file's columns."""
    first = committed[min(committed)]["file"]
    try:
        with ckpt.store.open_input(first) as fh:
            schema = pq.read_schema(fh)
    except (OSError, pa.ArrowException) as exc:
        raise WriteError(f"{table.uri}: cannot read {first} to make {table.title}: {exc}") from exc
    table.create(table.fit(schema).remove_metadata())


def backfill(ckpt: Checkpoint, committed: dict[str, dict[str, Any]]) -> None:
    """Keys for committed chunks that have none (an older batchscore's), from their files
    while they are still on disk, before anything needs them; without an `[input].id` there
    are none to keep. Only keys are written: the table and the records stay as they are."""
    table = ckpt.format
    if table.id_column is None:
        return
    kept = table.kept()
    for key, record in sorted(committed.items()):
        if key in kept:
            continue
        try:
            if ckpt.store.size(record["file"]) is None:
                continue
            with ckpt.store.open_input(record["file"]) as fh:
                schema = pq.read_schema(fh)
            columns = key_columns(schema, table.id_column)
            rows = ckpt.store.read_table(record["file"], columns) if columns else None
        except (OSError, pa.ArrowException):
            continue
        keys = keys_of(rows, table.id_column, written=schema) if rows is not None else None
        if keys is not None:
            publish_keys(ckpt.store, key, keys)


def say(
    ckpt: Checkpoint, table: OutputFormat, committed: dict[str, dict[str, Any]], taken: set[str]
) -> None:
    """Say, once, which committed chunks another writer took over and by which commits, and
    note it in their records (a chunk back in the table, restored, loses the note)."""
    fresh = sorted(k for k in taken if TAKEN not in committed[k])
    back = sorted(k for k in committed if k not in taken and TAKEN in committed[k])
    if not fresh and not back:
        return
    records = {}
    if fresh:
        by = table.whose({part_name(k) for k in fresh})
        then = (
            "they leave the table by their ids when their input changes or leaves"
            if table.id_column
            else "with no [input].id, a shard of theirs that changes or leaves is refused"
        )
        log.warning(
            "%s: %d committed chunk file(s) (%d rows) were replaced or removed by another "
            "writer (%s); their rows are left in %s as that writer wrote them, "
            "never added again nor scored again while their input holds; %s",
            table.uri,
            len(fresh),
            sum(committed[k]["rows"] for k in fresh),
            by,
            table.title,
            then,
        )
        records |= {record_name(k): committed[k] | {TAKEN: by} for k in fresh}
    for key in back:
        records[record_name(key)] = {k: v for k, v in committed[key].items() if k != TAKEN}
    ckpt.write_many(records)
    for record in records.values():
        committed[record["chunk"]] = record
