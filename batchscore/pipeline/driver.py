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
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchscore.engines import Engine, open_engine
from batchscore.errors import ShardsFailedError, WriteError
from batchscore.job.sections import Job
from batchscore.models.base import Task
from batchscore.models.locate import locate
from batchscore.models.tasks import input_kinds
from batchscore.observe.logs import run_context
from batchscore.observe.metrics import write_metrics
from batchscore.observe.progress import Progress, stage
from batchscore.observe.report import RunStats
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.committer import Committer
from batchscore.output.fingerprint import fingerprint_parts
from batchscore.output.layout import report_name
from batchscore.output.lock import hold_lock
from batchscore.output.pending import Chunk, Pending, pending_work
from batchscore.pipeline.executor import device_reason, resolve_device, torch_threads
from batchscore.pipeline.shards import find_shards
from batchscore.pipeline.stages import Scored
from batchscore.pipeline.threads import Sink
from batchscore.precision.choose import settle
from batchscore.precision.table import check_precision
from batchscore.version import __version__

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
    was made with other settings, `QualityGateError` when the precision fails its gate (unless
    ``accept_quality``), and `InputDataError` (after committing every other shard) when some
    shard could not be read. The run report is written whatever happens, and so are the
    Prometheus metrics in ``metrics_file`` when one is given.
    """
    if job.engine == "local":  # refuse a device or precision this machine lacks before any work
        check_precision(job.model.precision, resolve_device(job.model.device))
    if accept_quality:
        job = dataclasses.replace(job, quality=dataclasses.replace(job.quality, accept=True))
    ckpt = Checkpoint(job.output.path)
    started = time.time()
    name = report_name(started, os.getpid())
    run_id = Path(name).stem  # the report's name: every log record of the run carries it
    with hold_lock(ckpt.lock_path, job.name, ckpt.output), run_context(job=job.name, run_id=run_id):
        start, stats = time.perf_counter(), RunStats(started=started)
        log.info("run %s of %s started", run_id, job.name, extra={"event": "start", "detail": True,
                 "source": str(job.source), "output": job.output.path})  # fmt: skip
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
                failures = run_pending(
                    job,
                    ckpt,
                    model_path=model_path,
                    stats=stats,
                    progress=progress,
                    context=context,
                )
                outcome = "ok" if not failures else "shards failed"
            except KeyboardInterrupt:
                outcome = "interrupted"
                raise
            finally:
                stats.wall_s = time.perf_counter() - start
                report = stats.report(
                    job=job.name,
                    run_id=run_id,
                    outcome=outcome,
                    output=job.output.path,
                    failed_shards=failures,
                    version=__version__,
                    **context,
                )
                ckpt.save_report(name, report)
                log.info("run finished: %s", outcome, extra={"event": "run finished",
                         "detail": True, "outcome": outcome, "report": report})  # fmt: skip
        except KeyboardInterrupt:
            outcome = "interrupted"
            raise
        finally:
            if metrics_file is not None:
                if report is None:  # failed before scoring began
                    stats.wall_s = time.perf_counter() - start
                    report = stats.report(job=job.name, outcome=outcome)
                try:
                    write_metrics(metrics_file, report, ckpt.reports())
                except WriteError as exc:
                    if sys.exc_info()[0] is None:
                        raise
                    log.error("%s", exc)  # the run's own error is the one to report
        if failures:
            raise ShardsFailedError(
                f"{len(failures)} shard(s) failed and were not committed; the other shards "
                "were. Fix or remove them and run again to retry:\n  "
                + "\n  ".join(f["error"] for f in failures),
                report,
            )
        return report


def run_pending(
    job: Job,
    ckpt: Checkpoint,
    *,
    model_path: Path,
    stats: RunStats,
    progress: str,
    context: dict[str, Any],
) -> list[dict[str, str]]:
    """Find the pending chunks, settle what the job leaves to measurement, then stream every
    pending chunk through the engine and the committer; return the failed shards.

    ``context`` receives what the run report should say about the model: where it ran, the
    precision in force and the measured decisions behind it.
    """
    for garbage in ckpt.sweep():
        log.info("removed %s, left by an interrupted run", garbage)
    todo = pending_work(
        job.input,
        kinds=input_kinds(job.model.task, job.input, job.task),
        chunk_rows=job.output.chunk_rows,
        shards=find_shards(job.input),
        ckpt=ckpt,
    )
    stats.chunks_already_done, stats.rows_already_done = todo.done_chunks, todo.done_rows
    log.debug("%d chunk(s) to score, %d already committed (%d rows)", len(todo.chunks),
              todo.done_chunks, todo.done_rows)  # fmt: skip
    if not todo.chunks:
        return todo.failures
    tuning = time.perf_counter()
    recorded = ckpt.settled()
    job, decision, gated = settle(job, model_path, recorded)
    if decision:
        ckpt.settle(decision)
    stats.tuning_s = time.perf_counter() - tuning
    context["settled"] = decision or recorded
    engine = open_engine(job)
    try:
        loaded = time.perf_counter()
        what = f"loading the model {job.model.name or job.model.path} ({engine.device}, "
        done = "model loaded" if gated is None else "model ready (the quality gate loaded it)"
        with stage(f"{what}{job.model.precision})", done, event="model loaded"):
            task = engine.load(model_path, stats, len(todo.chunks), gated)
        gated = None  # the engine holds what it adopted; let the rest go
        stats.load_s = time.perf_counter() - loaded
        context.update(device=engine.device, precision=engine.precision)
        if engine.quantization:
            context["int8"] = engine.quantization
        explain(job, engine, decision=decision, recorded=recorded)
        schema = output_schema(job, todo.carried, task)
        committer = Committer(job.output, ckpt, schema, stats, on_commit=shard_events(todo, stats))
        rows = sum(c.rows for c in todo.chunks)
        bar = Progress(rows, progress, busy=lambda: engine.busy_s)
        sink: Sink[Scored] = Sink(committer, depth=2)
        try:
            engine.score(todo.chunks, sink, bar, stats)
        finally:
            bar.close()
            stats.timeline = bar.timeline.to_json()
            try:
                sink.close()
            finally:
                committer.abort()
    finally:
        engine.close()
        stats.model_busy_s = engine.busy_s
    return todo.failures + committer.failures


def explain(job: Job, engine: Engine, *, decision: Any, recorded: Any) -> None:
    """Say which precision, budget and device the run uses and why (the precision as an
    event; the rest at debug level, for ``-v``)."""
    settled = decision or recorded or {}
    if "precision" in settled:
        why = settled["precision"]["why"] + ("" if decision else " (recorded by an earlier run)")
    else:
        why = "the job's [model].precision; fp32 is the reference, so there is nothing to gate"
    log.info("precision %s: %s", engine.precision, why, extra={"event": "precision chosen",
             "precision": engine.precision, "detail": not decision})  # fmt: skip
    budget = settled.get("batching", {}).get("why", "the job's [batching].max_tokens")
    log.debug("max_tokens %s: %s", job.batching.max_tokens, budget)
    log.debug("device %s: %s", engine.device, device_reason(job.model.device))
    if job.engine == "local" and engine.device == "cpu":
        threads = "[model].threads" if job.model.threads else "the cores this process may use"
        log.debug("torch threads %d: %s", torch_threads(), threads)


def shard_events(todo: Pending, stats: RunStats) -> Callable[[Chunk, dict[str, Any]], None]:
    """The committer's callback: count each chunk against its shard, and say when a shard's
    last pending chunk is committed."""
    left = Counter(c.shard.path for c in todo.chunks)

    def committed(chunk: Chunk, record: dict[str, Any]) -> None:
        path = chunk.shard.path
        stats.committed(path, record["rows"], record["bad_rows"], record["filtered"])
        left[path] -= 1
        log.debug("chunk %s committed: %s rows %d-%d", chunk.key, path, chunk.start, chunk.stop)
        if not left[path]:
            rows = stats.shards[path]["rows"]
            log.info("shard committed: %s (%d rows)", path, rows, extra={"event": "shard committed",
                     "detail": True, "shard": path, "rows": rows})  # fmt: skip

    return committed


def output_schema(job: Job, carried: pa.Schema, task: Task) -> pa.Schema:
    """Carried columns (their first shard's types), the task's columns, then `error` if skipping."""
    fields = [*carried, *task.columns]
    if job.output.on_error == "skip":
        fields.append(pa.field("error", pa.string()))
    return pa.schema(fields)
