"""Shards that left the input: their output moves out of the data files, kept under ``gone/``.

The data files hold the current input only (a reader's ``**/*.parquet`` glob must not see a
removed shard's rows, nor a renamed shard's twice), so at the start of a run every file of a
shard no longer in the input moves, whole, into one folder per retirement under
``_batchscore/gone/``, where nothing ends in ``.parquet``; moving it back restores it.

A retirement is a plan first: ``_batchscore/gone/<stamp>.json`` lists every move (per chunk:
its data file, its rejected rows, then its commit record) and says "moving"; then each file
moves (a rename in a folder; a copy, then a delete, in an object store); then the folders are
made durable and the plan says "kept". A run killed anywhere leaves each file in its old place
or its new one (in an object store, for a moment, in both: the glob still sees the old one
only), and the next start finishes the plan before it reads a record. Only files a commit
record names move (or, for a record too damaged to read, a file whose footer says this job
wrote it for that chunk): a file batchscore did not write is never touched. A plan lists only
batchscore's own names (a chunk's data file, rejected rows, commit record, each to its place
in the retirement's folder); one that lists anything else was not written by batchscore and is
skipped, so an edited or planted plan moves nothing. `_SUCCESS` goes before the plan is
written: a folder whose move is half done never says it is complete.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import PurePosixPath
from typing import Any

from batchscore import faults
from batchscore.output.checkpoint import Checkpoint, Damaged
from batchscore.output.manifest import written_for
from batchscore.output.pieces import whole_chunks
from batchscore.storage.layout import (
    DONE,
    GONE,
    REJECTED,
    is_kept_move,
    kept_name,
    own_names,
    part_name,
    record_name,
    rejected_name,
    retirement_name,
    shard_of,
)

log = logging.getLogger("batchscore")
MOVING, KEPT = "moving", "kept"
PLAN_KEYS = ("state", "moves", "shards")
EMPTY = {"chunks_done": 0, "rows_done": 0, "rows_written": 0, "bad_rows": 0}


def retirements(ckpt: Checkpoint) -> list[tuple[str, dict[str, Any]]]:
    """Every readable retirement plan with its name, oldest first (a damaged one, or one that
    lists a move batchscore never plans, is skipped with a warning: what it moved is still in
    its folder)."""
    found = []
    for name in sorted(own_names(GONE, ckpt.store.names(GONE))):
        rel = f"{GONE}/{name}"
        try:
            plan = ckpt.read_json(rel, PLAN_KEYS)
            if plan is not None:
                check_moves(ckpt, rel, plan)
        except Damaged as exc:
            log.warning("%s; skipped", exc)
            continue
        if plan is not None:
            found.append((rel, plan))
    return found


def check_moves(ckpt: Checkpoint, rel: str, plan: dict[str, Any]) -> None:
    """`Damaged` unless every move of ``plan`` is one a retirement plans (`is_kept_move`)."""
    moves = plan["moves"]
    if not isinstance(moves, list) or not isinstance(plan["shards"], list):
        raise Damaged(ckpt.store.where(rel), "its moves or shards are not lists")
    for move in moves:
        if not (
            isinstance(move, list)
            and len(move) == 2
            and all(isinstance(m, str) for m in move)
            and is_kept_move(rel, *move)
        ):
            raise Damaged(ckpt.store.where(rel), f"it lists a move batchscore never makes: {move}")


def finish_retiring(ckpt: Checkpoint) -> list[dict[str, Any]]:
    """Finish every retirement a killed run left half done, before any record is read; return
    what they kept, per shard (the killed run never reported it)."""
    finished = []
    for rel, plan in retirements(ckpt):
        if plan["state"] == MOVING:
            carry_out(ckpt, rel, plan)
            finished += kept(ckpt, rel, plan)
    return finished


def retire(
    ckpt: Checkpoint, committed: dict[str, dict[str, Any]], live: set[str], *, fingerprint: str
) -> list[dict[str, Any]]:
    """Move the output of every shard whose key is not in ``live`` out of the data files (see
    the module's note), and drop its chunks from ``committed``; return, per shard, what was
    kept and where (the run report's ``gone_shards``)."""
    gone = {key: r for key, r in committed.items() if shard_of(key) not in live}
    unreadable = [
        rel
        for rel in ckpt.damaged
        if rel.startswith(f"{DONE}/") and shard_of(PurePosixPath(rel).stem) not in live
    ]
    if not gone and not unreadable:
        return []
    moves = []
    for key in sorted(gone):
        moves += [part_name(key), rejected_name(key), record_name(key)]
    for rel in unreadable:  # its file moves too when the footer says this job wrote it there
        key = PurePosixPath(rel).stem
        footer = written_for(ckpt.store, part_name(key))
        if footer.get("batchscore.chunk") == key and (
            footer.get("batchscore.fingerprint") == fingerprint
        ):
            moves.append(part_name(key))
        moves += [rejected_name(key), rel]
        ckpt.damaged.pop(rel)
    rel = retirement_name(time.time(), os.getpid())
    targets = [[move, kept_name(rel, move)] for move in moves]
    plan = {"state": MOVING, "shards": summary(gone), "moves": targets}
    ckpt.drop_success()  # from here until every move is made, the folder is not complete
    ckpt.write_json(rel, plan)
    carry_out(ckpt, rel, plan)
    for key in gone:
        del committed[key]
    return kept(ckpt, rel, plan)


def kept(ckpt: Checkpoint, rel: str, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """What a carried-out retirement kept, per shard, with where; each said as a warning."""
    where = ckpt.store.where(rel.removesuffix(".json"))
    for shard in plan["shards"]:
        log.warning(
            "%s is no longer input: its output (%d rows) moved out of the data files, kept in %s",
            shard["shard"],
            shard["rows_written"],
            where,
        )
    return [{**shard, "kept": where} for shard in plan["shards"]]


def carry_out(ckpt: Checkpoint, rel: str, plan: dict[str, Any]) -> None:
    """Make every move of ``plan`` that is not made yet, durably, then record it as kept
    (`_SUCCESS` removed first; a move that fails is a `WriteError` naming the file, and the
    next start finishes the plan)."""
    ckpt.drop_success()
    # the shards' rows leave a table's log in one transaction
    ckpt.format.retire_files(source for source, _ in plan["moves"])
    for source, target in plan["moves"]:
        if ckpt.store.size(source) is not None:
            ckpt.move(source, target)
            faults.hit("retire-move")
    for folder in ("", DONE, REJECTED, GONE, rel.removesuffix(".json")):
        ckpt.barrier(folder)
    ckpt.write_json(rel, {**plan, "state": KEPT})


def summary(records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per shard (by path): its chunks and rows that a retirement keeps, as `status` shows them."""
    shards: dict[str, dict[str, Any]] = {}
    of: dict[str, list[dict[str, Any]]] = {}  # each shard's records
    for record in records.values():
        path = record["shard"]["path"]
        shard = shards.setdefault(path, {"shard": path, "chunks": record["chunks"]} | EMPTY)
        of.setdefault(path, []).append(record)
        shard["rows_done"] += record["stop"] - record["start"]
        shard["rows_written"] += record["rows"]
        shard["bad_rows"] += record.get("bad_rows", 0)
    for path, mine in of.items():  # a chunk committed in pieces counts once, when whole
        shards[path]["chunks_done"] = len(whole_chunks(mine))
    return [shards[path] for path in sorted(shards)]
