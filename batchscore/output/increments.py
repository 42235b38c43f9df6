"""Row increments (`[input].increments = "rows"`): the plan of work by row, and retiring rows.

A run by rows, at its start (after the clean-up of a killed run's files):

1. finishes a retirement a killed run left half done, and un-commits chunks whose data file
   is missing or changed (their rows are then simply not committed);
2. diffs the input against the committed rows (`batchscore.output.diff`);
3. retires the committed rows that no longer hold: a data file all of whose rows retire moves,
   whole, to ``_batchscore/gone/<stamp>/`` (`batchscore.output.retire`'s plan and moves); a
   file some of whose rows retire is rewritten without them (`rewrite`), those rows kept in
   the same folder;
4. cuts the rows to score into chunks of at most `[output].chunk_rows`, each named with the
   run's label, so rows scored by a later increment land in files of their own.

Every step is safe to cut off: what the diff finds is recomputed from the facts on disk at
the next start, so a killed run leaves nothing that the next one trusts blindly. A rewrite
replaces its file atomically (a rename, or an object's upload) after an intent naming the new
file and its new record: the next start finds the file either as its record says (nothing
happened) or as the intent says, and then writes the record (`Checkpoint.sweep`), so no row
is ever in two committed files, nor lost.

`retire_rows` is the one place that takes committed rows out of the output: a sink that is not
a folder of Parquet files (a Delta table: a delete transaction) implements it its own way.

Nothing retires while some shard cannot be read (what left the input cannot be told from what
was not read): the run scores the new rows of the others and fails those shards (exit 3).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchscore import faults
from batchscore.errors import write_error
from batchscore.job.sections import InputConfig
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.diff import RowDiff, int64s, row_diff
from batchscore.output.manifest import FileFacts, facts_of_bytes, problems
from batchscore.output.pending import Pending, check_room, check_shard, read_footer
from batchscore.output.retire import MOVING, carry_out, finish_retiring, summary
from batchscore.storage.layout import (
    intent_name,
    kept_name,
    part_name,
    record_name,
    rejected_name,
    retirement_name,
    staged_name,
)
from batchscore.work.row_errors import FIELD
from batchscore.work.units import Chunk, Shard, chunks_of

log = logging.getLogger("batchscore")


def pending_rows(
    inp: InputConfig,
    *,
    kinds: dict[str, str],
    chunk_rows: int,
    shards: list[Shard],
    ckpt: Checkpoint,
    fingerprint: str,
    forget: bool = True,
    label: str = "",
) -> Pending:
    """The plan of a run by rows (see the module's note); ``forget=False`` (a dry run:
    `plan`, `status`) changes nothing on disk. ``label``: the run's, in its chunks' names."""
    plan = Pending(shards=shards)
    plan.gone = finish_retiring(ckpt) if forget else []
    committed = ckpt.committed()
    for where in ckpt.drop_damaged() if forget else []:
        log.warning("%s was damaged and is removed; its rows are scored again", where)
    for key, why in sorted(problems(ckpt.store, committed).items()):
        record = committed.pop(key)
        said = f"{record['file']} is {why}"
        log.warning("%s: its %d rows are scored again", said, record["rows"])
        plan.redone.append({"chunk": key, "file": record["file"], "why": said})
        if forget:
            ckpt.forget(key, record)
    readable, reference, rows_of = [], None, {}
    for shard in shards:
        footer = read_footer(shard)
        fits, reference = check_shard(plan, shard, footer, reference, inp, kinds, inp.row_filter)
        if fits:
            readable.append(shard)
            rows_of[shard.index] = footer.rows
    plan.carried = reference[0] if reference else pa.schema([])
    diff = row_diff(
        inp,
        kinds=kinds,
        shards=readable,
        store=ckpt.store,
        committed=committed,
        unread=bool(plan.failures),  # a shard not read: what left cannot be told
    )
    plan.failures += diff.failures
    if forget and diff.retire:
        plan.retired = retire_rows(ckpt, diff, committed, inp)
    plan.chunks = cut(readable, diff, rows_of, chunk_rows=chunk_rows, label=label)
    plan.increments = diff.counts()
    plan.done_rows = diff.unchanged
    plan.done_chunks = len(committed)
    for record in committed.values():
        path = record["shard"]["path"]
        plan.bad_by_shard[path] = plan.bad_by_shard.get(path, 0) + record["bad_rows"]
    if forget:
        check_room(ckpt, plan.chunks, fingerprint)
    return plan


def cut(
    shards: list[Shard],
    diff: RowDiff,
    rows_of: dict[int, int],
    *,
    chunk_rows: int,
    label: str,
) -> list[Chunk]:
    """The rows to score as chunks of at most ``chunk_rows`` rows of one shard each. A shard
    all of whose rows (that pass `where`) are to score is cut into its fixed ranges, as a run
    by shards cuts it; otherwise each chunk picks its rows, and one whose rows are a whole
    range reads that range (`Chunk.picks` None)."""
    chunks: list[Chunk] = []
    for shard in shards:
        rows = diff.score.get(shard.index)
        if rows is None or not len(rows):
            continue
        if len(rows) == diff.passing.get(shard.index):
            whole = chunks_of(shard, rows_of[shard.index], chunk_rows)
            chunks += [dataclasses.replace(c, label=label) for c in whole]
            continue
        groups = [rows[i : i + chunk_rows] for i in range(0, len(rows), chunk_rows)]
        for index, picks in enumerate(groups):
            start, stop = int(picks[0]), int(picks[-1]) + 1
            contiguous = stop - start == len(picks)
            chunks.append(
                Chunk(
                    shard,
                    index,
                    start,
                    stop,
                    len(groups),
                    picks=None if contiguous else picks,
                    label=label,
                )
            )
    return chunks


def retire_rows(
    ckpt: Checkpoint, diff: RowDiff, committed: dict[str, dict[str, Any]], inp: InputConfig
) -> list[dict[str, Any]]:
    """Retire the committed rows the diff found no longer hold, keeping them under one
    retirement folder of ``gone/``; drop the files that retire whole from ``committed``.
    Returns what was kept where (the run report's ``retired``)."""
    whole = {
        key: committed[key]
        for key, rows in diff.retire.items()
        if len(rows) == committed[key]["rows"]
    }
    rel = retirement_name(time.time(), os.getpid())
    moves = []
    for key in sorted(whole):
        moves += [
            [m, kept_name(rel, m)] for m in (part_name(key), rejected_name(key), record_name(key))
        ]
    plan = {
        "state": MOVING,
        "shards": [],  # by rows, shards do not leave: rows do (`files`, `rows`)
        "moves": moves,
        "files": summary(whole),
        "rows": diff.counts(),
    }
    ckpt.drop_success()  # from here until every row is in place, the folder is not complete
    ckpt.write_json(rel, plan)
    folder = rel.removesuffix(".json")
    ckpt.store.prepare(folder)
    for key in sorted(set(diff.retire) - set(whole)):
        committed[key] = rewrite(ckpt, committed[key], diff.retire[key], folder=folder)
    carry_out(ckpt, rel, plan)
    for key in whole:
        del committed[key]
    where = ckpt.store.where(folder)
    log.warning(
        "%d committed row(s) retired (%d edited, %d no longer input): kept in %s",
        diff.to_retire,
        diff.changed,
        diff.deleted,
        where,
    )
    return [{"kept": where, "rows": diff.to_retire, "files": len(diff.retire)}]


def rewrite(
    ckpt: Checkpoint, record: dict[str, Any], retired: np.ndarray, *, folder: str
) -> dict[str, Any]:
    """Rewrite a committed data file without its ``retired`` rows (kept in ``folder``), in
    place: an intent naming the new file and its record, the file replaced atomically, then
    the record (see the module's note). Returns the new record."""
    store, key, file = ckpt.store, record["chunk"], record["file"]
    table = store.read_table(file)
    keep = np.setdiff1d(np.arange(table.num_rows), retired, assume_unique=True)
    gone, kept_bytes = encoded(table.take(int64s(retired))), encoded(table.take(int64s(keep)))
    publish_bytes(ckpt, gone, kept_name(folder + ".json", file))
    facts = facts_of_bytes(kept_bytes, len(keep))
    new = {**record, **facts.as_record(), "committed_at": time.time()}
    new["bad_rows"] = bad_rows(table.take(int64s(keep)))
    new["retired"] = record.get("retired", 0) + len(retired)
    ckpt.intend([intent(key, file, facts, new)])
    publish_bytes(ckpt, kept_bytes, file)
    faults.hit("rewrite")
    ckpt.write_json(record_name(key), new)
    ckpt.remove(intent_name(key))
    return new


def intent(key: str, file: str, facts: FileFacts, record: dict[str, Any]) -> dict[str, Any]:
    """A rewrite's intent: the file it publishes (as any intent names one) and the record
    that commits it, which the next start writes if the file it finds is this one."""
    return {"chunk": key, "file": file, **facts.as_record(), "record": record}


def bad_rows(table: pa.Table) -> int:
    """Rows written with an error (`on_error = "skip"`)."""
    if FIELD.name not in table.column_names:
        return 0
    return table.num_rows - table.column(FIELD.name).null_count


def encoded(table: pa.Table) -> pa.Buffer:
    """A table as a Parquet file's bytes, its schema's metadata (the footer) kept."""
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def publish_bytes(ckpt: Checkpoint, data: pa.Buffer, rel: str) -> None:
    """Stage ``data`` and publish it as ``rel``, replacing what is there, atomically."""
    local = ckpt.tmp_dir / staged_name(rel, os.getpid())
    try:
        ckpt.store.stage(local, data)
        ckpt.store.publish(local, rel)
    except OSError as exc:
        local.unlink(missing_ok=True)
        raise write_error(ckpt.store.where(rel), exc) from exc
