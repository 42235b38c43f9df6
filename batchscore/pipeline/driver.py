"""The driver: the recipe that wires the stages for one job, explicitly.

    reader thread:  chunk rows -> where -> task.encode -> batches     (stages.windows, ahead)
    model thread:   batches -> model -> output rows in input order     (scoring.Scorer)
    writer thread:  rows -> temp Parquet -> publish -> commit record   (output.committer, behind)

The middle stage is the engine's (`batchscore.engines`): this process, or model actors on a
Ray cluster that score whole chunks; deciding the pending work and committing stay here.

A shard that cannot be read fails alone: its open chunk is dropped, the other shards commit,
and the run ends with `InputDataError` so the next run retries it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from batchscore.engines import open_engine
from batchscore.errors import InputDataError
from batchscore.job.sections import Job
from batchscore.models.locate import locate
from batchscore.models.tasks import check_outputs, input_kinds
from batchscore.observe.progress import Progress
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.claim import check_claim
from batchscore.output.committer import Committer
from batchscore.output.contents import file_metadata, output_schema
from batchscore.output.fingerprint import identity
from batchscore.output.lock import hold_lock
from batchscore.output.pending import Pending, pending_work
from batchscore.output.verdict import bad_share_error, mark_complete
from batchscore.pipeline.executor import resolve_device
from batchscore.pipeline.run import Run
from batchscore.pipeline.shards import find_shards
from batchscore.pipeline.stages import Scored
from batchscore.pipeline.threads import Sink
from batchscore.precision.choose import recorded_decision, settle
from batchscore.precision.table import check_precision
from batchscore.storage.retry import Retry

log = logging.getLogger("batchscore")


def run_job(
    job: Job,
    *,
    restart: bool = False,
    progress: str = "off",
    accept_quality: bool = False,
    metrics_file: Path | None = None,
) -> dict[str, Any]:
    """Score every row of the job not yet committed; return the run report.

    Raises `LockHeldError` when another run holds the job, `OutputConflictError` when the output
    folder holds another job's output or other settings', `QualityGateError` when the precision
    fails its gate (unless ``accept_quality``), `BadRowsError` when the job's rows with an error
    exceed `[output].max_bad_share`, and `InputDataError` (after committing every other shard)
    when some shard could not be read. The run report is written whatever happens (unless the
    run found nothing to do), and so are the Prometheus metrics in ``metrics_file``.
    """
    check_outputs(job)  # an id or keep column named like an output column (exit 2)
    if job.engine == "local":  # refuse a device or precision this machine lacks before any work
        check_precision(job.model.precision, resolve_device(job.model.device))
    if accept_quality:
        job = dataclasses.replace(job, quality=dataclasses.replace(job.quality, accept=True))
    retry = Retry()  # transient I/O errors, in and out, retried and counted for the report
    ckpt = Checkpoint(job.output.path, retry)
    ckpt.store.check()  # a file, a read-only or unwritable place: before anything is written
    with hold_lock(ckpt.lock_path, job.name, ckpt.output):
        run = Run(job, ckpt, retry)
        try:
            with run:
                model_path = locate(job.model)
                who = identity(job, model_path)
                check_claim(ckpt, who, restart)
                run.claimed = True
                todo = find_pending(job, ckpt, run, fingerprint=who.fingerprint)
                run.failures = todo.failures
                if todo.chunks:
                    run.failures += score_pending(
                        job,
                        ckpt,
                        todo,
                        run,
                        model_path=model_path,
                        claim=who.record(),
                        progress=progress,
                    )
                judge(job, ckpt, todo, run.failures)
        finally:
            if metrics_file is not None:
                run.write_metrics(metrics_file)
        return run.report


def find_pending(job: Job, ckpt: Checkpoint, run: Run, *, fingerprint: str) -> Pending:
    """Clean up after an interrupted run, then find the chunks still to score."""
    ckpt.prepare()
    for garbage in ckpt.sweep():
        log.info("removed %s, left by an interrupted run", garbage)
    todo = pending_work(
        job.input,
        kinds=input_kinds(job.model.task, job.input, job.task),
        chunk_rows=job.output.chunk_rows,
        shards=find_shards(job.input, run.retry),
        ckpt=ckpt,
        fingerprint=fingerprint,
    )
    stats = run.stats
    stats.chunks_already_done, stats.rows_already_done = todo.done_chunks, todo.done_rows
    stats.chunks_pending, stats.chunks_redone = len(todo.chunks), len(todo.redone)
    run.context.update(redone=todo.redone, gone_shards=todo.gone)
    if todo.chunks or todo.failures:
        ckpt.drop_success()  # incomplete from now until a run ends with every row committed
    return todo


def score_pending(
    job: Job,
    ckpt: Checkpoint,
    todo: Pending,
    run: Run,
    *,
    model_path: Path,
    claim: dict[str, Any],
    progress: str,
) -> list[dict[str, str]]:
    """Settle what the job leaves to measurement, then stream every pending chunk through the
    engine and the committer; return the shards that failed on the way.

    ``claim`` is the job record the first commit writes. The run's context receives what the
    report should say about the model: where it ran, the precision in force and the measured
    decisions behind it.
    """
    stats = run.stats
    tuning = time.perf_counter()
    recorded = recorded_decision(ckpt, job)
    job, decision, gated = settle(job, model_path, recorded)
    stats.tuning_s = time.perf_counter() - tuning
    run.context["settled"] = decision or recorded
    engine = open_engine(job)
    try:
        loaded = time.perf_counter()
        task = engine.load(model_path, stats, len(todo.chunks), gated)
        gated = None  # the engine holds what it adopted; let the rest go
        stats.load_s = time.perf_counter() - loaded
        run.context.update(device=engine.device, precision=engine.precision)
        if engine.quantization:
            run.context["int8"] = engine.quantization
        committer = Committer(
            job.output,
            ckpt,
            schema=output_schema(job, todo.carried, task.columns),
            stats=stats,
            claim=claim,
            decision=decision or recorded,
            metadata=file_metadata(job, claim, engine.precision),
            todo=todo,
        )
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
    return committer.failures


def judge(job: Job, ckpt: Checkpoint, todo: Pending, failures: list[dict[str, str]]) -> None:
    """The run's verdict: too many bad rows in the whole job (exit 3), or shards that failed
    (exit 3, after every other shard committed); otherwise the output is complete."""
    limit = job.output.max_bad_share
    too_many = bad_share_error(todo.bad_by_shard, total=todo.total_rows, limit=limit, ckpt=ckpt)
    if too_many is not None:
        raise too_many
    if failures:
        raise InputDataError(
            f"{len(failures)} shard(s) failed and were not committed; the other shards "
            "were. Fix or remove them and run again to retry:\n  "
            + "\n  ".join(f["error"] for f in failures)
        )
    mark_complete(ckpt, job.name)
