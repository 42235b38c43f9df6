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
from batchscore.executor import Executor, check_precision, resolve_device
from batchscore.fsio import write_json
from batchscore.lock import hold_lock
from batchscore.models import Encoded, Task, input_kinds, load_task
from batchscore.models.locate import locate, model_identity
from batchscore.pipeline import Sink, prefetch
from batchscore.plan import plan_run
from batchscore.reader import Chunk, find_shards, read_windows
from batchscore.report import Progress, RunStats
from batchscore.sampler import first_of_each, plan_batches
from batchscore.scoring import Budget, assemble, count, cut, run_window
from batchscore.tuning import settle

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
    units: np.ndarray | None = None  # the units to score: each distinct input once
    same_as: np.ndarray | None = None  # unit -> the identical unit scored for it, if any repeat
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


def plan(
    job: Job, encoded: Encoded, units: np.ndarray, max_tokens: int, bucketing: bool
) -> list[np.ndarray]:
    """Cut a window's units into batches; a row longer than the budget is a job error."""
    sizes = (encoded.lengths + encoded.reserve)[units]
    if sizes.size and sizes.max() > max_tokens:
        raise JobError(
            f"[batching].max_tokens = {max_tokens} cannot hold a row of {sizes.max()} tokens; "
            "raise it, or lower [model].max_length"
        )
    b = job.batching
    return [units[i] for i in plan_batches(sizes, max_tokens, b.max_rows, b.sort and bucketing)]


def distinct(encoded: Encoded) -> tuple[np.ndarray, np.ndarray | None]:
    """The units worth scoring: identical token ids are scored once, since every task's result
    depends on its input alone (seeded sampling seeds each row from its prompt). Returns them,
    and unit -> its scored twin when any repeat."""
    units = np.arange(len(encoded.lengths))
    if encoded.ids is None:
        return units, None
    first, same_as = first_of_each([ids.tobytes() for ids in encoded.ids])
    return (first, same_as) if len(first) < len(units) else (units, None)


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
                units, same_as = distinct(encoded)
                batches = plan(job, encoded, units, max_tokens, task.bucketing)
                yield Window(chunk, offset, table, encoded, batches, max_tokens, units, same_as)
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
            sizes = encoded.lengths + encoded.reserve
            sort = self.job.batching.sort and self.task.bucketing
            batches = cut(sizes, window.units, max_tokens, self.job.batching.max_rows, sort)
        per_unit = rows / max(len(window.units), 1)
        outcome = run_window(
            encoded,
            batches,
            self.task,
            self.executor,
            self.budget,
            self.job.batching,
            self.progress,
            per_unit,
            window.same_as,
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
        count(self.stats, encoded, outcome.batches, rows, len(window.units))
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


def run_job(
    job: Job, restart: bool = False, progress: str = "off", accept_quality: bool = False
) -> dict[str, Any]:
    """Score every row of the job not yet committed; return the run report.

    Raises `LockHeldError` when another run holds the job, `OutputConflictError` when the output
    was made with other settings, `QualityGateError` when the precision fails its gate (unless
    ``accept_quality``), and `InputDataError` (after committing every other shard) when some
    shard could not be read. The run report is written whatever happens.
    """
    ckpt = Checkpoint(job.output_dir)
    with hold_lock(ckpt.lock_path, job.name):
        start, stats = time.perf_counter(), RunStats()
        device = resolve_device(job.model.device)
        check_precision(job.model, device)
        model_path = locate(job.model)
        ckpt.claim(job.name, fingerprint_parts(job, model_path), restart)
        context: dict[str, Any] = {"device": str(device), "precision": job.model.precision}
        failures: list[dict[str, str]] = []
        outcome = "failed"
        try:
            failures = score_pending(
                job, ckpt, model_path, stats, progress, accept_quality, context
            )
            outcome = "ok" if not failures else "shards failed"
        except KeyboardInterrupt:
            outcome = "interrupted"
            raise
        finally:
            stats.wall_s = time.perf_counter() - start
            report = stats.report(
                job=job.name,
                outcome=outcome,
                output=str(job.output_dir),
                failed_shards=failures,
                version=__version__,
                **context,
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
    model_path: Path,
    stats: RunStats,
    progress: str,
    accept_quality: bool,
    context: dict[str, Any],
) -> list[dict[str, str]]:
    """Plan, then stream every pending chunk through the stages; return the failed shards.

    ``context`` receives what the run report should say about the model: the precision in
    force and the measured decisions behind it.
    """
    for garbage in ckpt.sweep():
        log.info("removed %s, left by an interrupted run", garbage.name)
    kinds = input_kinds(job.model.task, job.input, job.task)
    todo = plan_run(job.input, kinds, job.output.chunk_rows, find_shards(job.input), ckpt)
    stats.chunks_already_done, stats.rows_already_done = todo.done_chunks, todo.done_rows
    if not todo.chunks:
        return todo.failures
    tuning = time.perf_counter()
    recorded = ckpt.settled()
    job, decision, trial = settle(job, model_path, recorded, accept_quality)
    if decision:
        ckpt.settle(decision)
    stats.tuning_s = time.perf_counter() - tuning
    context.update(precision=job.model.precision, settled=decision or recorded)
    loaded = time.perf_counter()
    if trial is not None:  # the model the decision was measured with is ready: reuse it
        task, executor = trial.task, trial.executor
        executor.busy_s = 0.0
    else:
        executor = Executor(job.model)
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
        stats.model_busy_s = executor.busy_s
        try:
            sink.close()
        finally:
            committer.abort()
    return todo.failures + committer.failures
