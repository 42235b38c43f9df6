"""`batchscore status`: done, pending and failed work per shard, from commit records and footers.

Nothing is scored and no model is loaded (its files are located and hashed, as a run's start
does, to judge the folder against the job's settings). Each committed data file is checked
against its record (size and Parquet footer, never its data), so a missing or damaged file shows
here; a shard that left the input is listed as gone, with where its output is kept. The output
is complete when every shard is done with this job's settings, nothing is damaged, the data
files hold the current input only, their footers agree on one precision and one int8 scale
(the check `run` makes of `settled.json`, `batchscore.measure.decide.proven_decision`), and the
job's rows with an error are within `[output].max_bad_share` (the gate a run ends with).

Status gives the folder the verdict a run would: where a run would refuse the folder (other
settings, exit 5; a job record nothing proves, exit 10) or stop at the model (exit 4), status
says so, then exits with that status, `--check` too (`check_judged`); a folder it can judge
that is not complete is `--check`'s exit 13 (`check_complete`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from batchscore.errors import (
    BatchscoreError,
    BookkeepingError,
    IncompleteError,
    ModelError,
    OutputConflictError,
    WriteError,
)
from batchscore.job.sections import Job
from batchscore.measure.decide import proven_decision
from batchscore.models.fingerprint import identity
from batchscore.models.source.locate import locate
from batchscore.observe.run_stats import speeds
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.claim import refusal_error
from batchscore.output.diff import DuplicateIdError, rows_line
from batchscore.output.format_table import open_format
from batchscore.output.manifest import problems
from batchscore.output.neighbours import TAKEN, check_columns, taken_over
from batchscore.output.pieces import whole_chunks
from batchscore.output.retire import MOVING, retirements
from batchscore.output.verdict import bad_share_error
from batchscore.recipes.shard_states import ShardStatus, rows_by_shard, shard_status, stopped_by_ids
from batchscore.storage.layout import GONE, shard_of
from batchscore.work.shards import find_shards, open_shard
from batchscore.work.units import chunks_of

IN_PLACE = f"is still in the data files: the next run moves it to {GONE}/"


def job_status(job: Job, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Per-shard progress plus the last run's report, as plain data (``environ``: the front
    door's, whose object-store variables the output's format may read)."""
    ckpt = Checkpoint(job.output.path)
    ckpt.format = open_format(job, ckpt.store, environ)  # read, never written, here
    restarting = ckpt.restarting()
    committed = {} if restarting else ckpt.committed()
    taken = taken_over(ckpt, committed)  # a table's files another writer took over
    damaged = problems(ckpt.store, {k: r for k, r in committed.items() if k not in taken})
    last = last_report(ckpt)
    failed = {f["shard"] for f in last.get("failed_shards", [])} if last else set()
    # first what a run would refuse the folder for: a folder another job's settings made is
    # never diffed as this job's (by rows, its files lack the row hashes the diff reads)
    refusing, model_error = judge(ckpt, job)
    by_rows = job.input.by_rows and refusing is None
    shards, live, increments, stopped = [], set(), None, None
    bad_by_shard: dict[str, int] = {}
    total = 0  # the job's input rows: the bad-row gate's base, as the run counts it
    if by_rows:  # by rows, shards are not the unit: the diff says what is to do
        try:
            shards, todo = rows_by_shard(job, ckpt, committed, damaged, failed=failed)
            increments, bad_by_shard = todo.increments or {}, todo.bad_by_shard
            total = todo.total_rows
        except DuplicateIdError as exc:  # the input's, not the folder's: shown, not raised
            shards, stopped = stopped_by_ids(job, committed, damaged), str(exc)
    for shard in [] if by_rows else find_shards(job.input):
        live.add(shard.key)
        records = [r for key, r in committed.items() if shard_of(key) == shard.key]
        try:
            rows = open_shard(shard).metadata.num_rows
            chunks = len(chunks_of(shard, rows, job.output.chunk_rows))
        except BatchscoreError:
            rows, chunks = 0, 0
        status = shard_status(shard.path, records, damaged, rows=rows, chunks=chunks)
        valid = [r for r in records if r["shard"] == shard.identity and r["chunk"] not in damaged]
        bad_by_shard[shard.path] = sum(r.get("bad_rows", 0) for r in valid)
        total += rows
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
    gone = [] if by_rows else gone_shards(ckpt, committed, damaged, live=paths, keys=live)
    current = [s for s in shards if s.state != "gone"]
    refused = None if refusing is None else str(refusing)
    refused_exit = None if refusing is None else refusing.exit_code
    retiring = any(plan["state"] == MOVING for _, plan in retirements(ckpt))
    intact = [r["file"] for key, r in committed.items() if key not in damaged]
    settled = ""
    if refused is None and not restarting:
        try:  # what `run` keeps to: the footers' decision, or a refusal when they disagree
            settled = proven_decision(ckpt, job, intact)[1]
        except BookkeepingError as exc:
            refused, refused_exit = str(exc), exc.exit_code
    too_many = None
    if refused is None and model_error is None:
        limit = job.output.max_bad_share
        over = bad_share_error(bad_by_shard, total=total, limit=limit, ckpt=ckpt)
        too_many = None if over is None else str(over)
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
        and too_many is None
        and not restarting
        and not retiring
        and not (increments and increments["to_retire"])
        and stopped is None,
        "where": job.input.where,  # what dropped rows_done - rows_written rows
        "increments": increments,  # by rows: the diff's counts (rows to score, to retire)
        "taken_over": handed_to_table(committed, taken),
        "stopped": stopped,  # by rows: why the next run stops before scoring (its ids)
        "refused": refused,
        "refused_exit": refused_exit,  # the exit status a run refuses the folder with
        "model_error": model_error,
        "bad_rows_over": too_many,  # the job's bad rows over [output].max_bad_share: run fails
        "settled": settled or None,  # the record the footers disprove: the next run rewrites it
        "restarting": restarting,
        "retiring": retiring,  # a move to gone/ was cut off: the next start finishes it
        "damaged_bookkeeping": sorted(ckpt.damaged.values()),
        "last_run": last,
    }


def handed_to_table(committed: dict[str, dict[str, Any]], taken: set[str]) -> dict | None:
    """The committed chunks whose files another writer took over in a Delta table (None:
    none): their rows are the table's now, which is no damage (`output.neighbours`)."""
    if not taken:
        return None
    by = sorted({committed[k].get(TAKEN, "not yet seen by a run") for k in taken})
    rows = sum(committed[k]["rows"] for k in taken)
    return {"chunks": len(taken), "rows": rows, "by": by}


def judge(ckpt: Checkpoint, job: Job) -> tuple[BatchscoreError | None, str | None]:
    """The error a run of this job, with these settings, would refuse the folder with (None:
    it would not): the checks `run` makes at its start, by the same fingerprint, and of a
    Delta table's columns; and, instead, why the model cannot be judged (a file of it missing
    or unreadable: the run's exit 4)."""
    try:
        refused = refusal_error(ckpt, identity(job, locate(job.model)))
    except ModelError as exc:
        return None, str(exc)
    if refused is None:
        try:
            check_columns(ckpt)
        except WriteError as exc:
            refused = exc
    return refused, None


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


def last_report(ckpt: Checkpoint) -> dict[str, Any] | None:
    """The newest run report, or None before the first run."""
    return next(ckpt.reports(), None)


def headline(status: dict[str, Any]) -> str:
    """One line: rows committed of rows, and whether the output is complete."""
    return f"{status['rows_done']:,} of {status['rows']:,} rows committed" + (
        " - complete" if status["complete"] else ""
    )


# the errors a run refuses a folder with, by their exit status (`refused_exit`)
REFUSALS: dict[int, type[BatchscoreError]] = {
    OutputConflictError.exit_code: OutputConflictError,
    BookkeepingError.exit_code: BookkeepingError,
    WriteError.exit_code: WriteError,  # a Delta table that no longer takes batchscore's files
}


def check_judged(status: dict[str, Any], job: str) -> None:
    """Raise what a run of the job would stop at before scoring anything, where status found
    it: the model's error (exit 4), or the folder refused (exit 5: other settings or another
    job's output; exit 10: a job record nothing proves), with the run's own message. Status
    and `status --check` then exit as `run` does."""
    if status["model_error"]:  # what a run would stop at first: the model's error, exit 4
        problem = status["model_error"]
        raise ModelError(f"{job}: cannot judge the output against the model: {problem}")
    if status["refused"]:
        raise REFUSALS.get(status["refused_exit"], OutputConflictError)(status["refused"])


def verdict(status: dict[str, Any], job: str, *, check: bool) -> None:
    """The status command's exit: as a run's where a run would stop before scoring anything
    (`check_judged`), and with ``check`` 13 unless the output is complete (`check_complete`)."""
    if check:
        check_complete(status, job)
    else:
        check_judged(status, job)


def check_complete(status: dict[str, Any], job: str) -> None:
    """Raise `IncompleteError` naming what keeps the output from being complete, if anything;
    first what a run would stop at (`check_judged`), with the run's exit status."""
    if status["complete"]:
        return
    check_judged(status, job)
    states: dict[str, int] = {}
    for shard in status["shards"]:
        if shard["state"] != "done" and not (shard["state"] == "gone" and shard["kept"]):
            states[shard["state"]] = states.get(shard["state"], 0) + 1
    why = [f"{count} shard(s) {state}" for state, count in sorted(states.items())]
    if status["bad_rows_over"]:
        why.append(f"a run fails the bad-row gate: {status['bad_rows_over']}")
    if status["stopped"]:
        why.append(f"the next run stops before scoring: {status['stopped']}")
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
    if status["taken_over"]:
        taken = status["taken_over"]
        lines.append(
            f"{taken['chunks']} committed chunk(s) ({taken['rows']:,} rows) handed to the Delta "
            f"table: another writer rewrote their files ({'; '.join(taken['by'])}), and their "
            "rows are the table's as it left them"
        )
    if status["stopped"]:
        lines.append(f"by rows: the next run stops before scoring: {status['stopped']}")
    if status["restarting"]:
        lines.append("a --restart was cut off: the next run finishes it, then scores every row")
    if status["retiring"]:
        lines.append(f"a move to {GONE}/ was cut off: the next run finishes it")
    if status["refused"]:
        lines.append(f"not complete for this job: {status['refused']}")
    if status["bad_rows_over"]:
        lines.append(f"not complete: a run fails the bad-row gate: {status['bad_rows_over']}")
    if status["model_error"]:
        lines.append(f"cannot judge the output against the model: {status['model_error']}")
    if status["settled"]:
        lines.append(status["settled"])
    last = status["last_run"]
    if last:
        lines.append(
            f"last run: {last['rows']:,} rows in {last['wall_s']:.1f} s "
            f"({last['rows_per_s']:,.1f} rows/s, {speeds(last)})"
        )
    return "\n".join(lines)
