"""Each shard's state, as `batchscore status` shows it: from its commit records and their
files by shard, and by rows from the diff a run would make (read only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchscore.errors import BatchscoreError
from batchscore.job.sections import Job
from batchscore.models.tasks import input_kinds
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.pieces import whole_chunks
from batchscore.output.survey import Plan, Survey
from batchscore.output.todo import to_do
from batchscore.work.shards import find_shards, open_shard


@dataclass
class ShardStatus:
    shard: str
    state: str  # done | pending | partial | failed | changed | missing | damaged | gone
    chunks_done: int
    chunks: int
    rows_done: int  # input rows of committed chunks
    rows: int
    bad_rows: int
    rows_written: int  # output rows: rows_done less those `[input].where` dropped
    problems: list[str] = field(default_factory=list)  # committed files no longer as written
    kept: str | None = None  # gone: the folder its output was moved to


def shard_status(
    path: str,
    records: list[dict[str, Any]],
    damaged: dict[str, str],
    *,
    rows: int = 0,
    chunks: int = 0,
    gone: bool = False,
) -> ShardStatus:
    """A shard's committed work; its state is "gone" (no longer input, output kept), or a
    missing or damaged file's, or left for the caller to decide ("pending")."""
    intact = [r for r in records if r["chunk"] not in damaged]
    issues = [f"{r['file']}: {damaged[r['chunk']]}" for r in records if r["chunk"] in damaged]
    state = "gone" if gone else "pending"
    if issues and not gone:
        state = "missing" if all(i.endswith(": missing") for i in issues) else "damaged"
    done_rows = sum(r["stop"] - r["start"] for r in intact)
    if gone:
        rows, chunks = done_rows, records[0]["chunks"]
    return ShardStatus(
        path,
        state,
        len(whole_chunks(intact)),  # a chunk committed in pieces counts once all are
        chunks,
        done_rows,
        rows,
        sum(r.get("bad_rows", 0) for r in intact),
        sum(r["rows"] for r in intact),
        issues,
    )


def rows_by_shard(
    job: Job,
    ckpt: Checkpoint,
    committed: dict[str, dict[str, Any]],
    damaged: dict[str, str],
    *,
    failed: set[str],
) -> tuple[list[ShardStatus], Plan]:
    """By rows: each shard's rows committed and still to score, from the diff a run would make
    (read only), and that dry run's plan (its counts, `batchscore.output.diff.RowDiff.counts`,
    and the bad-row gate's numbers). A shard's
    chunks are the committed files whose records name it and the chunks its rows to score
    would make; a committed file missing or damaged is named, as by shard, and its rows
    counted as to score. Rows `where` drops are done (none is to score), never written. A
    shard the last run ``failed`` (a row it could not score) is failed while rows of it are
    still to score, as by shard."""
    kinds = input_kinds(job.model.task, job.input, job.options)
    todo = to_do(
        ckpt,
        Survey(
            inp=job.input,
            kinds=kinds,
            chunk_rows=job.output.chunk_rows,
            shards=tuple(find_shards(job.input)),
        ),
    )
    failing = {f["shard"]: f["error"] for f in todo.failures}
    records: dict[str, list[dict[str, Any]]] = {}
    for record in committed.values():
        records.setdefault(record["shard"]["path"], []).append(record)
    found = []
    for shard in todo.shards:
        chunks = len([c for c in todo.chunks if c.shard.index == shard.index])
        to_score = sum(c.picked for c in todo.chunks if c.shard.index == shard.index)
        try:
            rows = open_shard(shard).metadata.num_rows
        except BatchscoreError:
            rows = 0
        own = records.pop(shard.path, [])
        intact = len([r for r in own if r["chunk"] not in damaged])
        status = shard_status(shard.path, own, damaged, rows=rows, chunks=intact + chunks)
        if shard.index in todo.passing:  # read by the diff: its counts are the rows'
            passing = todo.passing[shard.index]
            status.rows_done, status.rows_written = rows - to_score, passing - to_score
        if shard.path in failing:
            status.problems.append(failing[shard.path])
        if status.state == "pending":  # no missing or damaged file to say instead
            status.state = rows_state(
                # failing now (unreadable), or failed by the last run and still to score
                failed=shard.path in failing or (shard.path in failed and to_score > 0),
                to_score=to_score,
                passing=todo.passing.get(shard.index),
            )
        found.append(status)
    for path, own in sorted(records.items()):  # files of inputs renamed or gone since
        status = shard_status(path, own, damaged, chunks=len(own))
        if status.problems:  # their rows are matched by id; a damaged file is named
            status.rows_done = status.rows_written = 0
            found.append(status)
    return found, todo


def stopped_by_ids(
    job: Job, committed: dict[str, dict[str, Any]], damaged: dict[str, str]
) -> list[ShardStatus]:
    """By rows, when ids repeat or are missing: no diff can be made, and the next run stops
    before it scores or retires anything (exit 3), as the last one did. Each shard shows what
    its committed files hold, and fails until its ids name one row each."""
    records: dict[str, list[dict[str, Any]]] = {}
    for record in committed.values():
        records.setdefault(record["shard"]["path"], []).append(record)
    found = []
    for shard in find_shards(job.input):
        try:
            rows = open_shard(shard).metadata.num_rows
        except BatchscoreError:
            rows = 0
        own = records.get(shard.path, [])
        status = shard_status(shard.path, own, damaged, rows=rows, chunks=len(own))
        if status.state == "pending":  # no missing or damaged file to say instead
            status.state = "failed"
        found.append(status)
    return found


def rows_state(*, failed: bool, to_score: int, passing: int | None) -> str:
    """By rows, a shard's state when none of its committed files is missing or damaged."""
    if failed:
        return "failed"
    if not to_score:
        return "done"
    return "pending" if to_score == passing else "partial"
