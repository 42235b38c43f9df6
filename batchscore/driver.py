"""The driver: wires reader -> tokenizer -> sampler -> executor -> writer for one job, explicitly.

    reader thread:  chunk rows -> where -> windows -> task.encode -> batches   (prefetch, ahead)
    main thread:    batches -> model (executor) -> output rows in input order (scoring)
    writer thread:  rows -> temp Parquet -> publish -> commit record          (committer, behind)

The middle stage is the engine's (`batchscore.engines`): this process, or model actors on a
Ray cluster that score whole chunks; planning and committing stay here either way.

A shard that cannot be read fails alone: its open chunk is dropped, the other shards commit,
and the run ends with `InputDataError` so the next run retries it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
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
from batchscore.engines import open_engine
from batchscore.errors import BatchscoreError, InputDataError, JobError, WriteError
from batchscore.executor import Executor, check_precision, resolve_device
from batchscore.lock import hold_lock
from batchscore.metrics import write_metrics
from batchscore.models import Encoded, Task, input_kinds
from batchscore.models.locate import locate, model_identity
from batchscore.pipeline import Sink
from batchscore.plan import plan_run
from batchscore.reader import Chunk, find_shards, read_windows
from batchscore.report import Progress, RunStats
from batchscore.rowfilter import RowFilter
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
    read: int | None = None  # input rows covered, before `where`; None: the table's rows
    kept: np.ndarray | None = None  # with `where`: the shard row of each table row

    def row(self, r: int) -> int:
        """The shard row of the window's row ``r``, for messages."""
        return self.offset + r if self.kept is None else int(self.kept[r])


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
        # only when set, so outputs made before the key existed still resume
        **({"where": job.input.where} if job.input.where is not None else {}),
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
    rows_filter = RowFilter(job.input.where) if job.input.where is not None else None
    needs = rows_filter.columns if rows_filter else ()
    columns = tuple(dict.fromkeys([*job.input.carried, *task.inputs, *needs]))
    max_tokens = job.batching.max_tokens
    failed: set[int] = set()
    for chunk in chunks:
        if chunk.shard.index in failed:
            continue
        offset = chunk.start
        try:
            for table in read_windows(chunk, columns, job.batching.window_rows):
                read, kept = table.num_rows, None
                if rows_filter is not None:
                    positions = rows_filter.keep(table)
                    table, kept = table.take(positions), offset + positions
                encoded = task.encode(table)
                units, same_as = distinct(encoded)
                window = Window(
                    chunk, offset, table, encoded, [], max_tokens, units, same_as, None, read, kept
                )
                if encoded.errors and job.output.on_error == "fail":
                    row, message = min(encoded.errors.items())
                    raise InputDataError(f"{chunk.shard.path}: row {window.row(row)}, {message}")
                window.batches = plan(job, encoded, units, max_tokens, task.bucketing)
                yield window
                offset += read
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
            error = InputDataError(f"{chunk.shard.path}: row {window.row(row)}, {message}")
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
        return Scored(chunk, table, self.rejected(window, errors), read=window.read)

    def rejected(self, window: Window, errors: dict[int, str]) -> pa.Table | None:
        """Rows recorded with an error, listed for `_batchscore/rejected/`."""
        if not errors:
            return None
        rows = sorted(errors)
        listing = {
            "shard": [window.chunk.shard.path] * len(rows),
            "row": [window.row(r) for r in rows],
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


def score_chunk(job: Job, chunk: Chunk, task: Task, scorer: Scorer) -> list[Scored]:
    """Every window of one chunk, scored: the unit of work a remote engine's worker returns.

    The list ends at the first failed window (the shard's error), as the local stream does.
    """
    parts = []
    for window in windows(job, [chunk], task):
        part = Scored(window.chunk, error=window.error) if window.error else scorer(window)
        parts.append(part)
        if part.error is not None:
            break
    return parts


def run_job(
    job: Job,
    restart: bool = False,
    progress: str = "off",
    accept_quality: bool = False,
    metrics_file: Path | None = None,
) -> dict[str, Any]:
    """Score every row of the job not yet committed; return the run report.

    Raises `LockHeldError` when another run holds the job, `OutputConflictError` when the output
    was made with other settings, `QualityGateError` when the precision fails its gate (unless
    ``accept_quality``), and `InputDataError` (after committing every other shard) when some
    shard could not be read. The run report is written whatever happens, and so are the
    Prometheus metrics in ``metrics_file`` when one is given.
    """
    if job.engine == "local":  # refuse a device or precision this machine lacks before any work
        check_precision(job.model, resolve_device(job.model.device))
    ckpt = Checkpoint(job.output.path)
    with hold_lock(ckpt.lock_path, job.name, ckpt.output):
        start, stats = time.perf_counter(), RunStats()
        failures: list[dict[str, str]] = []
        outcome, report = "failed", None
        context: dict[str, Any] = {
            "engine": job.engine,
            "device": job.model.device,
            "precision": job.model.precision,
        }
        try:
            model_path = locate(job.model)
            ckpt.claim(job.name, fingerprint_parts(job, model_path), restart)
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
                    output=job.output.path,
                    failed_shards=failures,
                    version=__version__,
                    **context,
                )
                # Microseconds too: two runs in one second (and one process) keep two reports.
                second, fraction = divmod(stats.started, 1)
                stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(second))
                stamp += f".{int(fraction * 1e6):06d}Z"
                ckpt.save_report(f"{stamp}-{os.getpid()}.json", report)
        except KeyboardInterrupt:
            outcome = "interrupted"
            raise
        finally:
            if metrics_file is not None:
                if report is None:  # failed before scoring began
                    stats.wall_s = time.perf_counter() - start
                    report = stats.report(job=job.name, outcome=outcome)
                try:
                    write_metrics(metrics_file, report, ckpt)
                except WriteError as exc:
                    if sys.exc_info()[0] is None:
                        raise
                    log.error("%s", exc)  # the run's own error is the one to report
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
    """Plan, settle what the job leaves to measurement, then stream every pending chunk through
    the engine and the committer; return the failed shards.

    ``context`` receives what the run report should say about the model: where it ran, the
    precision in force and the measured decisions behind it.
    """
    for garbage in ckpt.sweep():
        log.info("removed %s, left by an interrupted run", garbage)
    kinds = input_kinds(job.model.task, job.input, job.task)
    todo = plan_run(job.input, kinds, job.output.chunk_rows, find_shards(job.input), ckpt)
    stats.chunks_already_done, stats.rows_already_done = todo.done_chunks, todo.done_rows
    if not todo.chunks:
        return todo.failures
    tuning = time.perf_counter()
    recorded = ckpt.settled()
    job, decision, gated = settle(job, model_path, recorded, accept_quality)
    if decision:
        ckpt.settle(decision)
    stats.tuning_s = time.perf_counter() - tuning
    context["settled"] = decision or recorded
    engine = open_engine(job)
    try:
        loaded = time.perf_counter()
        task = engine.load(model_path, stats, len(todo.chunks), gated)
        gated = None  # the engine holds what it adopted; let the rest go
        stats.load_s = time.perf_counter() - loaded
        context.update(device=engine.device, precision=engine.precision)
        if engine.quantization:
            context["int8"] = engine.quantization
        committer = Committer(job.output, ckpt, output_schema(job, todo.carried, task), stats)
        bar = Progress(sum(c.rows for c in todo.chunks), progress)
        sink: Sink[Scored] = Sink(committer, depth=2)
        try:
            engine.score(todo.chunks, sink, bar, stats)
        finally:
            bar.close()
            try:
                sink.close()
            finally:
                committer.abort()
    finally:
        engine.close()
        stats.model_busy_s = engine.busy_s
    return todo.failures + committer.failures
