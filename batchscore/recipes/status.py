"""`batchscore status`: done, pending and failed work per shard, from commit records and footers.

Nothing is scored and no model is loaded (its files are located and hashed, as a run's start
does, to judge the folder against the job's settings). Each committed data file is checked
against its record (size and Parquet footer, never its data), so a missing or damaged file shows
here; a shard that left the input is listed as gone, with where its output is kept. The output
is complete when every shard is done with this job's settings, nothing is damaged, the data
files hold the current input only, and their footers agree on one precision and one int8 scale
(the check `run` makes of `settled.json`, `batchscore.measure.settle.proven_decision`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from batchscore.errors import BatchscoreError, BookkeepingError, IncompleteError, ModelError
from batchscore.job.sections import Job
from batchscore.measure.settle import proven_decision
from batchscore.models.fingerprint import identity
from batchscore.models.source.locate import locate
from batchscore.models.tasks import input_kinds
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.claim import refusal
from batchscore.output.diff import rows_line
from batchscore.output.manifest import problems
from batchscore.output.pieces import whole_chunks
from batchscore.output.retire import MOVING, retirements
from batchscore.output.todo import to_do
from batchscore.storage.layout import GONE, shard_of
from batchscore.work.shards import find_shards, open_shard
from batchscore.work.units import chunks_of

IN_PLACE = f"is still in the data files: the next run moves it to {GONE}/"


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


def job_status(job: Job) -> dict[str, Any]:
    """Per-shard progress plus the last run's report, as plain data."""
    ckpt = Checkpoint(job.output.path)
    restarting = ckpt.restarting()
    committed = {} if restarting else ckpt.committed()
    damaged = problems(ckpt.store, committed)
    last = last_report(ckpt)
    failed = {f["shard"] for f in last.get("failed_shards", [])} if last else set()
    shards, live, increments = [], set(), None
    if job.input.by_rows:  # by rows, shards are not the unit: the diff says what is to do
        shards, increments = rows_by_shard(job, ckpt, committed, damaged)
    for shard in [] if job.input.by_rows else find_shards(job.input):
        live.add(shard.key)
        records = [r for key, r in committed.items() if shard_of(key) == shard.key]
        try:
            rows = open_shard(shard).metadata.num_rows
            chunks = len(chunks_of(shard, rows, job.output.chunk_rows))
        except BatchscoreError:
            rows, chunks = 0, 0
        status = shard_status(shard.path, records, damaged, rows=rows, chunks=chunks)
        valid = [r for r in records if r["shard"] == shard.identity and r["chunk"] not in damaged]
        if not status.problems:  # a missing or damaged file says so, whatever else holds
            if len(valid) < len(records):
                status.state = "changed"
            elif shard.path in failed:
                status.state = "failed"
            elif chunks and len(whole_chunks(valid)) == chunks:
                status.state = "done"
            else:
                status.state = "partial" if valid else "pending"
        shards.append(status)
    paths = {s.shard for s in shards}  # a gone shard's path may be input again, new
    gone = [] if job.input.by_rows else gone_shards(ckpt, committed, damaged, live=paths, keys=live)
    current = [s for s in shards if s.state != "gone"]
    refused, model_error = judge(ckpt, job)
    retiring = any(plan["state"] == MOVING for _, plan in retirements(ckpt))
    intact = [r["file"] for key, r in committed.items() if key not in damaged]
    settled = ""
    if refused is None and not restarting:
        try:  # what `run` keeps to: the footers' decision, or a refusal when they disagree
            settled = proven_decision(ckpt, job, intact)[1]
        except BookkeepingError as exc:
            refused = str(exc)
    return {
        "job": job.name,
        "output": job.output.path,
        "shards": [asdict(s) for s in shards + gone],
        "rows": sum(s.rows for s in current),
        "rows_done": sum(s.rows_done for s in current),
        "bad_rows": sum(s.bad_rows for s in current),
        "rows_written": sum(s.rows_written for s in current),
        "complete": all(s.state == "done" for s in current)
        and not ckpt.damaged
        and not any(s.kept is None for s in gone)
        and refused is None
        and model_error is None
        and not restarting
        and not retiring
        and not (increments and increments["to_retire"]),
        "where": job.input.where,  # what dropped rows_done - rows_written rows
        "increments": increments,  # by rows: the diff's counts (rows to score, to retire)
        "refused": refused,
        "model_error": model_error,
        "settled": settled or None,  # the record the footers disprove: the next run rewrites it
        "restarting": restarting,
        "retiring": retiring,  # a move to gone/ was cut off: the next start finishes it
        "damaged_bookkeeping": sorted(ckpt.damaged.values()),
        "last_run": last,
    }


def rows_by_shard(
    job: Job, ckpt: Checkpoint, committed: dict[str, dict[str, Any]], damaged: dict[str, str]
) -> tuple[list[ShardStatus], dict[str, int]]:
    """By rows: each shard's rows committed and still to score, from the diff a run would make
    (read only), and the diff's counts (`batchscore.output.diff.RowDiff.counts`). A shard's
    chunks are the committed files whose records name it and the chunks its rows to score
    would make; a committed file missing or damaged is named, as by shard, and its rows
    counted as to score. Rows `where` drops are done (none is to score), never written."""
    kinds = input_kinds(job.model.task, job.input, job.task)
    todo = to_do(
        job.input,
        kinds=kinds,
        chunk_rows=job.output.chunk_rows,
        shards=find_shards(job.input),
        ckpt=ckpt,
        fingerprint="",  # a dry run checks no room for new files
        forget=False,
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
                failed=shard.path in failing,
                to_score=to_score,
                passing=todo.passing.get(shard.index),
            )
        found.append(status)
    for path, own in sorted(records.items()):  # files of inputs renamed or gone since
        status = shard_status(path, own, damaged, chunks=len(own))
        if status.problems:  # their rows are matched by id; a damaged file is named
            status.rows_done = status.rows_written = 0
            found.append(status)
    return found, todo.increments or {}


def rows_state(*, failed: bool, to_score: int, passing: int | None) -> str:
    """By rows, a shard's state when none of its committed files is missing or damaged."""
    if failed:
        return "failed"
    if not to_score:
        return "done"
    return "pending" if to_score == passing else "partial"


def judge(ckpt: Checkpoint, job: Job) -> tuple[str | None, str | None]:
    """Why a run of this job, with these settings, would refuse the folder (None: it would
    not): the check `run` makes at its start, by the same fingerprint; and, instead, why the
    model cannot be judged (a file of it missing or unreadable: the run's exit 4)."""
    try:
        return refusal(ckpt, identity(job, locate(job.model))), None
    except ModelError as exc:
        return None, str(exc)


def gone_shards(
    ckpt: Checkpoint,
    committed: dict[str, dict[str, Any]],
    damaged: dict[str, str],
    *,
    live: set[str],
    keys: set[str],
) -> list[ShardStatus]:
    """Shards no longer input (by path ``live`` and key ``keys``): those whose output is still
    in the data files (``kept`` None), then those a run moved out (the newest move of each)."""
    left: dict[str, list[dict[str, Any]]] = {}
    for key, record in committed.items():
        if shard_of(key) not in keys:
            left.setdefault(record["shard"]["path"], []).append(record)
    found = []
    for path, records in sorted(left.items()):
        status = shard_status(path, records, damaged, gone=True)
        status.problems.append(IN_PLACE)
        found.append(status)
    moved: dict[str, ShardStatus] = {}
    for rel, plan in retirements(ckpt):
        for shard in plan["shards"]:
            if shard["shard"] not in live and shard["shard"] not in left:
                kept = ckpt.store.where(rel.removesuffix(".json"))
                moved[shard["shard"]] = ShardStatus(
                    **shard, state="gone", rows=shard["rows_done"], kept=kept
                )
    return found + [moved[path] for path in sorted(moved)]


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


def last_report(ckpt: Checkpoint) -> dict[str, Any] | None:
    """The newest run report, or None before the first run."""
    return next(ckpt.reports(), None)


def headline(status: dict[str, Any]) -> str:
    """One line: rows committed of rows, and whether the output is complete."""
    return f"{status['rows_done']:,} of {status['rows']:,} rows committed" + (
        " - complete" if status["complete"] else ""
    )


def check_complete(status: dict[str, Any], job: str) -> None:
    """Raise `IncompleteError` naming what keeps the output from being complete, if anything;
    `ModelError` when a file of the model is missing or unreadable, as a run would."""
    if status["complete"]:
        return
    if status["model_error"]:  # what a run would stop at first: the model's error, exit 4
        problem = status["model_error"]
        raise ModelError(f"{job}: cannot judge the output against the model: {problem}")
    states: dict[str, int] = {}
    for shard in status["shards"]:
        if shard["state"] != "done" and not (shard["state"] == "gone" and shard["kept"]):
            states[shard["state"]] = states.get(shard["state"], 0) + 1
    why = [f"{count} shard(s) {state}" for state, count in sorted(states.items())]
    if status["refused"]:
        why.append(f"a run would refuse the folder: {status['refused']}")
    if status["restarting"]:
        why.append("a --restart was cut off")
    if status["retiring"]:
        why.append(f"a move to {GONE}/ was cut off")
    why += status["damaged_bookkeeping"]
    raise IncompleteError(
        f"{job}: not complete ({headline(status)}): {'; '.join(why) or 'see status'}"
    )


def format_status(status: dict[str, Any]) -> str:
    """A fixed-width table for people; `--json` gives scripts the same data."""
    lines = [f"{'state':<8} {'chunks':>9} {'rows':>21}  shard"]
    for s in status["shards"]:
        chunks = f"{s['chunks_done']}/{s['chunks']}"
        rows = f"{s['rows_done']:,}/{s['rows']:,}"
        lines.append(f"{s['state']:<8} {chunks:>9} {rows:>21}  {s['shard']}")
        notes = [*s["problems"], *([f"kept in {s['kept']}"] if s["kept"] else [])]
        lines += [f"{'':<8} {'':>9} {'':>21}    {note}" for note in notes]
    bad = f", {status['bad_rows']:,} of them with an error" if status["bad_rows"] else ""
    dropped = status["rows_done"] - status["rows_written"]
    if dropped and status["where"]:
        bad += f"; {status['rows_written']:,} written, {dropped:,} dropped by [input].where"
    lines.append(
        f"{status['rows_done']:,} of {status['rows']:,} rows committed{bad}"
        + (" - complete" if status["complete"] else "")
    )
    lines += [
        f"{problem}; the next run scores its chunk again"
        for problem in status["damaged_bookkeeping"]
    ]
    gone = [s for s in status["shards"] if s["state"] == "gone"]
    if gone:
        rows = sum(s["rows_written"] for s in gone)
        moved = all(s["kept"] for s in gone)
        where = f"moved out of the data files, kept under {GONE}/" if moved else IN_PLACE
        lines.append(f"{len(gone)} shard(s) no longer input: their output ({rows:,} rows) {where}")
    if status["increments"]:
        lines.append(rows_line(status["increments"]))
    if status["restarting"]:
        lines.append("a --restart was cut off: the next run finishes it, then scores every row")
    if status["retiring"]:
        lines.append(f"a move to {GONE}/ was cut off: the next run finishes it")
    if status["refused"]:
        lines.append(f"not complete for this job: {status['refused']}")
    if status["model_error"]:
        lines.append(f"cannot judge the output against the model: {status['model_error']}")
    if status["settled"]:
        lines.append(status["settled"])
    last = status["last_run"]
    if last:
        lines.append(
            f"last run: {last['rows']:,} rows in {last['wall_s']:.1f} s "
            f"({last['rows_per_s']:,.1f} rows/s, {last['tokens_per_s']:,.0f} tokens/s)"
        )
    return "\n".join(lines)
