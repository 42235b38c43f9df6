"""A run's start, acting: recovery from a killed run, then its plan of work carried out.

`recover` makes the folder as a finished run leaves it, before anything is read for the plan:
the folders a run writes into, the clean-up of a killed run's files (`Checkpoint.sweep`), a
table that no longer takes batchscore's files refused (`batchscore.output.neighbours
.check_columns`), a rewrite by rows and a retirement a killed run left half done finished.
`apply` then carries out the plan `batchscore.output.todo.to_do` made, in this order:

- by shards: the input's columns checked against a table's; keys made for chunks that
  lack them, and a refusal where a chunk that must leave the table has none; the output of
  the shards that left the input moved to ``_batchscore/gone/``; damaged bookkeeping
  removed; the chunks to score again un-committed (those another writer took over taken out
  of the table by their keys first); the table made one with the records; room made for the
  new files;
- by rows: damaged bookkeeping removed; keys made, and the same refusal; the chunks whose
  files are missing or changed un-committed; the table made one with the records, and the
  input's columns checked against it; room made; the rows that no longer hold retired
  (`batchscore.output.increments.retire_rows`).

Every step that deletes or moves a file removes `_SUCCESS` first (`Checkpoint.remove`), and
each is safe to cut off: the next start recovers, then plans again from the facts on disk.
"""

from __future__ import annotations

import logging
from typing import Any

from batchscore.errors import OutputConflictError
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.increments import bad_by_shard, retire_rows
from batchscore.output.neighbours import (
    backfill,
    check_carried,
    check_columns,
    check_keys,
    reconcile,
)
from batchscore.output.pending import Pending, carried_by
from batchscore.output.retire import finish_retiring, retire
from batchscore.output.rewrite import finish_rewrites
from batchscore.output.survey import Plan, Room
from batchscore.storage.layout import shard_of

log = logging.getLogger("batchscore")


def recover(ckpt: Checkpoint) -> list[dict[str, Any]]:
    """Finish what a killed run left half done, before anything is read for the plan;
    return the shards whose retirement it finished (the killed run never reported them)."""
    ckpt.prepare()
    for garbage in ckpt.sweep():
        log.info("removed %s, left by an interrupted run", garbage)
    check_columns(ckpt)
    finish_rewrites(ckpt)
    return finish_retiring(ckpt)


def apply(ckpt: Checkpoint, plan: Plan, *, recovered: list[dict[str, Any]]) -> Pending:
    """Carry ``plan`` out (see the module's note); the run's own copy of it, as it leaves the
    folder. ``recovered``: what `recover` finished retiring, reported with this run's."""
    if plan.survey.inp.by_rows:
        return apply_rows(ckpt, plan, recovered=recovered)
    return apply_shards(ckpt, plan, recovered=recovered)


def apply_shards(ckpt: Checkpoint, plan: Plan, *, recovered: list[dict[str, Any]]) -> Pending:
    """By shards: shards that left retired, chunks that no longer hold un-committed."""
    survey, committed = plan.survey, dict(plan.records)
    shards = list(survey.shards)
    live = {s.key: s for s in shards}
    if shards and ckpt.format.holds_files():  # before anything retires or is forgotten
        check_carried(ckpt, carried_by(shards[0], survey.inp))
    backfill(ckpt, committed)
    leaving = {
        key: record
        for key, record in committed.items()
        if shard_of(key) not in live or record["shard"] != live[shard_of(key)].identity
    }
    check_keys(ckpt.format, leaving, "the shards that changed or left the input")
    gone = recovered + retire(ckpt, committed, set(live), fingerprint=survey.fingerprint)
    for where in ckpt.drop_damaged():
        log.warning("%s was damaged and is removed; its chunk is scored again", where)
    # the rows of those taken over leave a table in one merge
    ckpt.format.retire(key for key in plan.uncommit if key in plan.take_out)
    for key in plan.uncommit:
        ckpt.forget(key, committed.pop(key))
    reconcile(ckpt, committed)  # the table's files: the committed chunks' (but those taken over)
    make_room(ckpt, plan.room)
    return pending(plan, gone=gone)


def apply_rows(ckpt: Checkpoint, plan: Plan, *, recovered: list[dict[str, Any]]) -> Pending:
    """By rows: chunks whose files are missing or changed un-committed, rows retired."""
    committed = dict(plan.records)
    for where in ckpt.drop_damaged():
        log.warning("%s was damaged and is removed; its rows are scored again", where)
    backfill(ckpt, committed)
    check_keys(ckpt.format, {k: committed[k] for k in plan.taken}, "the diff of rows")
    for key in plan.uncommit:
        ckpt.forget(key, committed.pop(key))
    # the table's files: the committed chunks' files (but those taken over, as planned)
    taken = reconcile(ckpt, committed)
    check_carried(ckpt, plan.carried)  # before anything retires: the rows must fit it
    make_room(ckpt, plan.room)  # a refusal comes before anything retires
    retired = []
    if plan.diff is not None and plan.diff.retire:
        retired = retire_rows(ckpt, plan.diff, committed, taken=taken)
    return pending(
        plan,
        gone=recovered,
        retired=retired,
        done_chunks=len(committed),
        bad_by_shard=bad_by_shard(committed),
    )


def make_room(ckpt: Checkpoint, room: tuple[Room, ...]) -> None:
    """Remove the crashed attempts' files at the pending chunks' names, in order; a file
    batchscore did not write there refuses the run (`OutputConflictError`), left as it is."""
    for found in room:
        if not found.ours:
            raise OutputConflictError(
                f"{ckpt.store.where(found.name)}: a file batchscore did not write is "
                "where this job's output goes; it is left as it is: move it away, or point "
                "[output].path at another folder"
            )
        log.info("removed %s: an unrecorded attempt of this job", ckpt.store.where(found.name))
        ckpt.remove(found.name)  # `_SUCCESS` first: see `Checkpoint.remove`


def pending(plan: Plan, **after: Any) -> Pending:
    """The run's own copy of ``plan``, with what carrying it out changed (``after``)."""
    return Pending(
        **{
            "chunks": list(plan.chunks),
            "shards": plan.shards,
            "carried": plan.carried,
            "failures": list(plan.failures),
            "redone": list(plan.redone),
            "done_chunks": plan.done_chunks,
            "done_rows": plan.done_rows,
            "total_rows": plan.total_rows,
            "bad_by_shard": dict(plan.bad_by_shard),
            "increments": plan.increments,
            "passing": dict(plan.passing),
        }
        | after
    )
