"""Row increments (`[input].increments = "rows"`): the plan of work by row, and retiring rows.

A run by rows, at its start (after the clean-up of a killed run's files):

1. finishes a retirement, or a rewrite, a killed run left half done, and un-commits chunks
   whose data file is missing or changed (their rows are then simply not committed);
2. diffs the input against the committed rows (`batchscore.output.diff`);
3. retires the committed rows that no longer hold: a data file all of whose rows retire moves,
   whole, to ``_batchscore/gone/<stamp>/`` (`batchscore.output.retire`'s plan and moves); a
   file some of whose rows retire is rewritten without them (`batchscore.output.rewrite`: in
   place, or under a new chunk key in a Delta table), those rows kept in the same folder;
4. cuts the rows to score into chunks of at most `[output].chunk_rows`, each named with the
   run's label, so rows scored by a later increment land in files of their own.

Every step is safe to cut off: what the diff finds is recomputed from the facts on disk at
the next start, so a killed run leaves nothing that the next one trusts blindly; a rewrite is
published after an intent, and the next start finishes or forgets it (see its module), so
after it no row is in two committed files, nor lost. With a Delta table, the table's files
are made the committed chunks' files before the diff (`Table.reconcile`).

`retire_rows` is the one place that takes committed rows out of the output.

Nothing retires while some shard cannot be read (what left the input cannot be told from what
was not read): the run scores the new rows of the others and fails those shards (exit 3).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import pyarrow as pa

from batchscore.job.sections import InputConfig
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.diff import RowDiff, row_diff
from batchscore.output.drift import folder_reference
from batchscore.output.manifest import problems
from batchscore.output.pending import Pending, check_room, check_shard, read_footer
from batchscore.output.retire import MOVING, carry_out, finish_retiring, summary
from batchscore.output.rewrite import rewrite
from batchscore.storage.layout import (
    kept_name,
    part_name,
    record_name,
    rejected_name,
    retirement_name,
)
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
    # every shard's columns first: a type the folder cannot hold refuses the run here, before
    # anything is un-committed or retired (`batchscore.output.drift`)
    readable, rows_of = [], {}
    reference = folder_reference(ckpt.store, committed, inp.copied)
    for shard in shards:
        footer = read_footer(shard)
        fits, reference = check_shard(plan, shard, footer, reference, inp, kinds, inp.row_filter)
        if fits:
            readable.append(shard)
            rows_of[shard.index] = footer.rows
    plan.carried = reference.schema if reference else pa.schema([])
    for where in ckpt.drop_damaged() if forget else []:
        log.warning("%s was damaged and is removed; its rows are scored again", where)
    for key, why in sorted(problems(ckpt.store, committed).items()):
        record = committed.pop(key)
        said = f"{record['file']} is {why}"
        log.warning("%s: its %d rows are scored again", said, record["rows"])
        plan.redone.append({"chunk": key, "file": record["file"], "why": said})
        if forget:
            ckpt.forget(key, record)
    if forget and ckpt.table is not None:  # the table's files: the committed chunks' files
        ckpt.table.reconcile(committed)
    diff = row_diff(
        inp,
        kinds=kinds,
        shards=readable,
        store=ckpt.store,
        committed=committed,
        carried=plan.carried,
        unread=bool(plan.failures),  # a shard not read: what left cannot be told
    )
    plan.failures += diff.failures
    if forget and diff.retire:
        plan.retired = retire_rows(ckpt, diff, committed, inp)
    plan.chunks = cut(readable, diff, rows_of, chunk_rows=chunk_rows, label=label)
    plan.increments = diff.counts()
    plan.passing = diff.passing
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
        new = rewrite(ckpt, committed.pop(key), diff.retire[key], folder=folder)
        committed[new["chunk"]] = new  # under a new key where the folder is a Delta table
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
