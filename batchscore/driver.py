"""The driver: wires reader -> tokenizer -> sampler -> executor -> writer for one job, explicitly.

    reader thread:  chunk rows -> windows -> task.encode -> sampler batches   (prefetch, ahead)
    main thread:    batches -> model (executor) -> output rows in input order (scoring)
    writer thread:  rows -> temp Parquet -> publish -> commit record          (committer, behind)

A shard that cannot be read fails alone: its open chunk is dropped, the other shards commit,
and the run ends with `InputDataError` so the next run retries it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore import __version__
from batchscore.checkpoint import Checkpoint
from batchscore.committer import Committer, Scored
from batchscore.config import Job
from batchscore.errors import BatchscoreError, InputDataError, JobError
from batchscore.executor import Executor
from batchscore.fsio import write_json
from batchscore.lock import hold_lock
from batchscore.models import Encoded, Task, input_kinds, load_task
from batchscore.models.locate import locate, model_identity
from batchscore.pipeline import Sink, prefetch
from batchscore.plan import plan_run
from batchscore.reader import Chunk, find_shards, read_windows
from batchscore.report import Progress, RunStats
from batchscore.sampler import plan_batches
from batchscore.scoring import Budget, assemble, count, cut, run_window

log = logging.getLogger("batchscore")


@dataclass
class Window:
    """Rows of one chunk between reader and model; `error` marks a shard that failed reading."""

    chunk: Chunk
    offset: int = 0  # shard row of the window's first row
    table: pa.Table | None = None
    encoded: Encoded | None = None
    batches: list[np.ndarray] = field(default_factory=list)
    planned_with: int = 0  # the max_tokens the batches were cut for
    error: BatchscoreError | None = None


def fingerprint_parts(job: Job, model_path: Path) -> dict[str, Any]:
    """Everything that decides the output; a change means committed chunks no longer match."""
    return {
        "task": job.model.task,
        "task_options": dataclasses.asdict(job.task),
        "model": job.model.name or job.model.path,
        "model_files": model_identity(model_path),
        "precision": job.model.precision,
        "max_length": job.model.max_length or "model default",
        "columns": {
            # pairs, not a mapping: the order of feature columns matters
            "inputs": list(input_kinds(job.model.task, job.input, job.task).items()),
            "carried": list(job.input.carried),
        },
        "on_error": job.output.on_error,
        "chunk_rows": job.output.chunk_rows,
    }


def plan(job: Job, encoded: Encoded, max_tokens: int, bucketing: bool) -> list[np.ndarray]:
    """Cut a window into batches; a row longer than the budget is a job error, said plainly."""
    sizes = encoded.lengths + encoded.reserve
    if sizes.size and sizes.max() > max_tokens:
        raise JobError(
            f"[batching].max_tokens = {max_tokens} cannot hold a row of {sizes.max()} tokens; "
            "raise it, or lower [model].max_length"
        )
    b = job.batching
    return plan_batches(sizes, max_tokens, b.max_rows, b.sort and bucketing)


def windows(job: Job, chunks: list[Chunk], task: Task) -> Iterator[Window]:
    """Reader + tokenizer + sampler for every pending chunk (runs in the reader thread)."""
    columns = tuple(dict.fromkeys([*job.input.carried, *task.inputs]))
    max_tokens = job.batching.max_tokens
    failed: set[int] = set()
    for chunk in chunks:
        if chunk.shard.index in failed:
            continue
        offset = chunk.start
        try:
            for table in read_windows(chunk, columns, job.batching.window_rows):
                encoded = task.encode(table)
                if encoded.errors and job.output.on_error == "fail":
                    row, message = min(encoded.errors.items())
                    raise InputDataError(f"{chunk.shard.path}: row {offset + row}, {message}")
                batches = plan(job, encoded, max_tokens, task.bucketing)
                yield Window(chunk, offset, table, encoded, batches, max_tokens)
                offset += table.num_rows
        except InputDataError as exc:
            failed.add(chunk.shard.index)
            yield Window(chunk, error=exc)


class Scorer:
    """The model's thread: turns a window of rows into output rows (see `batchscore.scoring`)."""

    def __init__(
        self, job: Job, task: Task, executor: Executor, stats: RunStats, progress: Progress
    ) -> None:
        self.job, self.task, self.executor = job, task, executor
        self.stats, self.progress = stats, progress
        self.budget = Budget(job.batching.max_tokens)
        self.skip = job.output.on_error == "skip"

    def __call__(self, window: Window) -> Scored:
        chunk, encoded, rows = window.chunk, window.encoded, window.table.num_rows
        max_tokens = self.budget.for_shard(chunk.shard.index)
        batches = window.batches
        if max_tokens < window.planned_with:  # an earlier out-of-memory shrank the budget
            units = np.arange(len(encoded.lengths))
            sizes = encoded.lengths + encoded.reserve
            sort = self.job.batching.sort and self.task.bucketing
            batches = cut(sizes, units, max_tokens, self.job.batching.max_rows, sort)
        per_unit = rows / max(len(encoded.lengths), 1)
        outcome = run_window(
            encoded,
            batches,
            self.task,
            self.executor,
            self.budget,
            self.job.batching,
            self.progress,
            per_unit,
        )
        if not len(encoded.lengths):
            self.progress.advance(rows, 0)
        errors = {**encoded.errors, **outcome.errors}
        if errors and not self.skip:
            row, message = min(errors.items())
            error = InputDataError(f"{chunk.shard.path}: row {window.offset + row}, {message}")
            return Scored(chunk, error=error)
        columns = {} if outcome.results is None else self.task.finish(encoded, outcome.results)
        table = assemble(
            window.table,
            self.job.input.carried,
            columns,
            self.task.columns,
            encoded.rows,
            errors,
            self.skip,
        )
        count(self.stats, encoded, outcome.batches, rows)
        return Scored(chunk, table, self.rejected(window, errors))

    def rejected(self, window: Window, errors: dict[int, str]) -> pa.Table | None:
        """Rows recorded with an error, listed for `_batchscore/rejected/`."""
        if not errors:
            return None
        rows = sorted(errors)
        listing = {
            "shard": [window.chunk.shard.path] * len(rows),
            "row": [window.offset + r for r in rows],
        }
        if self.job.input.id:
            listing["id"] = window.table.column(self.job.input.id).take(rows)
        listing["error"] = [errors[r] for r in rows]
        return pa.table(listing)


def output_schema(job: Job, carried: pa.Schema, task: Task) -> pa.Schema:
    """Carried columns (their first shard's types), the task's columns, then `error` if skipping."""
    fields = [*carried, *task.columns]
    if job.output.on_error == "skip":
        fields.append(pa.field("error", pa.string()))
    return pa.schema(fields)


def run_job(job: Job, restart: bool = False, progress: str = "off") -> dict[str, Any]:
    """Score every row of the job not yet committed; return the run report.

    Raises `LockHeldError` when another run holds the job, `OutputConflictError` when the output
    was made with other settings, and `InputDataError` (after committing every other shard)
    when some shard could not be read. The run report is written whatever happens.
    """
    ckpt = Checkpoint(job.output_dir)
    with hold_lock(ckpt.lock_path, job.name):
        start, stats = time.perf_counter(), RunStats()
        executor = Executor(job.model)
        model_path = locate(job.model)
        ckpt.claim(job.name, fingerprint_parts(job, model_path), restart)
        failures: list[dict[str, str]] = []
        outcome = "failed"
        try:
            failures = score_pending(job, ckpt, executor, model_path, stats, progress)
            outcome = "ok" if not failures else "shards failed"
        except KeyboardInterrupt:
            outcome = "interrupted"
            raise
        finally:
            stats.model_busy_s = executor.busy_s
            stats.wall_s = time.perf_counter() - start
            report = stats.report(
                job=job.name,
                outcome=outcome,
                output=str(job.output_dir),
                device=str(executor.device),
                precision=executor.precision,
                failed_shards=failures,
                version=__version__,
            )
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(stats.started))
            write_json(ckpt.runs_dir / f"{stamp}-{os.getpid()}.json", report)
        if failures:
            raise InputDataError(
                f"{len(failures)} shard(s) failed and were not committed; the other shards "
                "were. Fix or remove them and run again to retry:\n  "
                + "\n  ".join(f["error"] for f in failures)
            )
        return report


def score_pending(
    job: Job,
    ckpt: Checkpoint,
    executor: Executor,
    model_path: Path,
    stats: RunStats,
    progress: str,
) -> list[dict[str, str]]:
    """Plan, then stream every pending chunk through the stages; return the failed shards."""
    for garbage in ckpt.sweep():
        log.info("removed %s, left by an interrupted run", garbage.name)
    kinds = input_kinds(job.model.task, job.input, job.task)
    todo = plan_run(job.input, kinds, job.output.chunk_rows, find_shards(job.input), ckpt)
    stats.chunks_already_done, stats.rows_already_done = todo.done_chunks, todo.done_rows
    if not todo.chunks:
        return todo.failures
    loaded = time.perf_counter()
    task = load_task(model_path, job.model, job.task, job.input, executor)
    stats.load_s = time.perf_counter() - loaded
    committer = Committer(job.output, ckpt, output_schema(job, todo.carried, task), stats)
    bar = Progress(sum(c.rows for c in todo.chunks), progress)
    scorer = Scorer(job, task, executor, stats, bar)
    sink: Sink[Scored] = Sink(committer, depth=2)
    try:
        for window in prefetch(windows(job, todo.chunks, task), depth=2):
            if window.error is not None:
                sink.put(Scored(window.chunk, error=window.error))
            else:
                sink.put(scorer(window))
    finally:
        bar.close()
        try:
            sink.close()
        finally:
            committer.abort()
    return todo.failures + committer.failures
