"""Row increments (`[input].increments = "rows"`): the plan of work by row, and retiring rows.

A run by rows, at its start, once a retirement or a rewrite a killed run left half done is
finished (`batchscore.output.apply.recover`), plans (`plan_rows`, which only reads):

1. the chunks whose data file is missing or changed are to un-commit (their rows are then
   simply not committed);
2. the diff of the input against the committed rows (`batchscore.output.diff`);
3. the rows to score cut into chunks of at most `[output].chunk_rows`, each named with the
   run's label, so rows scored by a later increment land in files of their own, and what
   stands at their files' names;

then carries the plan out (`batchscore.output.apply`): un-commits those chunks, makes room
for the new files (a refusal comes before anything retires), and retires the committed rows
that no longer hold (`retire_rows`): a data file all of whose rows retire moves, whole, to
``_batchscore/gone/<stamp>/`` (`batchscore.output.retire`'s plan and moves); a file some of
whose rows retire is rewritten without them (`batchscore.output.rewrite`: in place, or under a
new chunk key in a Delta table), those rows kept in the same folder. In a Delta table, the
rows of a chunk another writer took over leave the table by its keys, wherever they lie
(`batchscore.output.neighbours`).

Every step is safe to cut off: what the diff finds is recomputed from the facts on disk at
the next start, so a killed run leaves nothing that the next one trusts blindly; a rewrite is
published after an intent, and the next start finishes or forgets it (see its module), so
after it no row is in two committed files, nor lost. With a Delta table, the diff reads the
committed chunks' files, but for those another writer took over, whose rows it reads from
their keys; the run makes the table's files the committed chunks' files before anything
retires (`batchscore.output.neighbours.reconcile`), which leaves those taken over as they are.

`retire_rows` is the one place that takes committed rows out of the output.

Nothing retires while some shard cannot be read (what left the input cannot be told from what
was not read): the run scores the new rows of the others and fails those shards (exit 3).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from types import MappingProxyType
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore.output.checkpoint import Checkpoint
from batchscore.output.diff import RowDiff, row_diff
from batchscore.output.drift import folder_reference
from batchscore.output.keys import publish_keys, read_keys
from batchscore.output.manifest import problems
from batchscore.output.neighbours import taken_over
from batchscore.output.pending import Pending, check_shard, read_footer
from batchscore.output.retire import MOVING, carry_out, summary
from batchscore.output.rewrite import rewrite
from batchscore.output.survey import Plan, Survey
from batchscore.storage.layout import (
    kept_name,
    part_name,
    record_name,
    rejected_name,
    retirement_name,
)
from batchscore.work.columns import int64s
from batchscore.work.units import Chunk, Shard, chunks_of

log = logging.getLogger("batchscore")


def plan_rows(ckpt: Checkpoint, survey: Survey) -> Plan:
    """The plan of a run by rows (see the module's note, steps 2 and 3; of steps 1 and 4, what
    a run will do). Reads only (`Plan`): a run carries it out (`batchscore.output.apply`)."""
    inp = survey.inp
    plan = Pending(shards=list(survey.shards))
    committed = ckpt.committed()
    records = MappingProxyType(dict(committed))
    # every shard's columns first: a type the folder cannot hold refuses the run here, before
    # anything is un-committed or retired (`batchscore.output.drift`)
    readable, rows_of = [], {}
    reference = folder_reference(ckpt.store, committed, inp.copied)
    for shard in survey.shards:
        footer = read_footer(shard)
        fits, reference = check_shard(
            plan, shard, footer, reference, inp, survey.kinds, inp.row_filter
        )
        if fits:
            readable.append(shard)
            rows_of[shard.index] = footer.rows
    plan.carried = reference.schema if reference else pa.schema([])
    taken = frozenset(taken_over(ckpt, committed))  # a Delta table's, by another writer
    intact = {k: r for k, r in committed.items() if k not in taken}  # (not damaged)
    for key, why in sorted(problems(ckpt.store, intact).items()):
        record = committed.pop(key)
        said = f"{record['file']} is {why}"
        log.warning("%s: its %d rows are scored again", said, record["rows"])
        plan.redone.append({"chunk": key, "file": record["file"], "why": said})
    diff = row_diff(
        inp,
        kinds=survey.kinds,
        shards=readable,
        store=ckpt.store,
        committed=committed,
        carried=plan.carried,
        unread=bool(plan.failures),  # a shard not read: what left cannot be told
        taken=taken,
    )
    plan.failures += diff.failures
    plan.chunks = cut(readable, diff, rows_of, chunk_rows=survey.chunk_rows, label=survey.label)
    plan.increments = diff.counts()
    plan.passing = diff.passing
    plan.done_rows = diff.unchanged
    plan.done_chunks = len(committed)
    plan.bad_by_shard = bad_by_shard(committed)
    retire = MappingProxyType(dict(diff.retire))
    return plan.frozen(ckpt, survey, records=records, taken=taken, retire=retire, diff=diff)


def bad_by_shard(committed: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The committed rows written with an error, by shard path (the bad-row gate's)."""
    found: dict[str, int] = {}
    for record in committed.values():
        path = record["shard"]["path"]
        found[path] = found.get(path, 0) + record["bad_rows"]
    return found


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
    ckpt: Checkpoint, diff: RowDiff, committed: dict[str, dict[str, Any]], *, taken: set[str]
) -> list[dict[str, Any]]:
    """Retire the committed rows the diff found no longer hold, keeping them under one
    retirement folder of ``gone/``; drop the files that retire whole from ``committed``.
    The rows of a chunk another writer took over (``taken``, in a Delta table) leave the
    table by their keys, wherever they lie, and its keys lose them (`retire_taken`).
    Returns what was kept where (the run report's ``retired``)."""
    keys = {key: read_keys(ckpt.store, key) for key in diff.retire if key in taken}
    whole = {
        key: committed[key]
        for key, rows in diff.retire.items()
        if len(rows)
        == (keys[key].num_rows if keys.get(key) is not None else committed[key]["rows"])
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
    retire_taken(ckpt, diff, committed, {k: v for k, v in keys.items() if k not in whole})
    for key in sorted(set(diff.retire) - set(whole) - set(keys)):
        new = rewrite(ckpt, committed.pop(key), diff.retire[key], folder=folder)
        committed[new["chunk"]] = new  # under a new key where the folder is a Delta table
    carry_out(ckpt, rel, plan)  # a whole chunk taken over leaves the table by its keys here
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


def retire_taken(
    ckpt: Checkpoint,
    diff: RowDiff,
    committed: dict[str, dict[str, Any]],
    keys: dict[str, pa.Table | None],
) -> None:
    """Take some rows of chunks another writer took over out of the table, by their keys
    (one merge), then out of each chunk's record and keys, in that order: a kill in between
    leaves keys that still name them, and the next diff retires them again (a merge that
    finds nothing), its record's count taken from the keys, not lessened twice."""
    if not keys:
        return
    leaving = {
        k: found.take(int64s(diff.retire[k])) for k, found in keys.items() if found is not None
    }
    ckpt.format.delete_rows(leaving)
    for key, found in sorted(keys.items()):
        if found is None:
            continue
        rows = diff.retire[key]
        kept = np.setdiff1d(np.arange(found.num_rows), rows, assume_unique=True)
        record = committed[key] | {
            "rows": len(kept),
            "retired": committed[key].get("retired", 0) + len(rows),
        }
        ckpt.write_json(record_name(key), record)
        publish_keys(ckpt.store, key, found.take(int64s(kept)))
        committed[key] = record
