"""The driver: the recipe that wires the stages for one job, explicitly.

    reader thread:  chunk rows -> where -> task.encode -> batches  (pipeline.stages.windows, ahead)
    model thread:   batches -> model -> output rows in input order  (pipeline.scoring.Scorer)
    writer thread:  rows -> temp Parquet -> publish -> commit record  (output.committer, behind)

The middle stage is the engine's (`batchscore.engines`): this process, or model actors on a
Ray cluster that score whole chunks; deciding the pending work and committing stay here.

A shard that cannot be read fails alone: its open chunk is dropped, the other shards commit,
and the run ends with `ShardsFailedError` so the next run retries it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchscore.engines import Engine, open_engine
from batchscore.errors import ShardsFailedError
from batchscore.job.sections import Job
from batchscore.measure.cache import DecisionCache
from batchscore.measure.settle import learn, recorded_decision, settle
from batchscore.models.fingerprint import identity
from batchscore.models.source.locate import locate
from batchscore.models.tasks import check_outputs, input_kinds
from batchscore.observe.logs import run_context
from batchscore.observe.progress import Progress, stage
from batchscore.observe.report import RunStats
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.claim import check_claim
from batchscore.output.committer import Committer
from batchscore.output.contents import file_metadata, output_schema
from batchscore.output.lock import hold_lock
from batchscore.output.pending import Pending, pending_work
from batchscore.output.settled import Decision
from batchscore.output.verdict import bad_share_error, mark_complete
from batchscore.precision.table import check_precision
from batchscore.recipes.run import Run
from batchscore.runtime.device import device_reason, resolve_device, torch_threads
from batchscore.storage.layout import report_name
from batchscore.storage.retry import Retry
from batchscore.threads import Sink
from batchscore.work.shards import find_shards
from batchscore.work.units import Chunk, Scored

log = logging.getLogger("batchscore")


def run_job(
    job: Job,
    *,
    restart: bool = False,
    progress: str = "off",
    accept_quality: bool = False,
    metrics_file: Path | None = None,
    cache: DecisionCache | None = None,
    process_started: float | None = None,
) -> dict[str, Any]:
    """Score every row of the job not yet committed; return the run report.

    Raises `LockHeldError` when another run holds the job, `OutputConflictError` when the output
    folder holds another job's output or other settings', `QualityGateError` when the precision
    fails its gate (unless ``accept_quality``), `BadRowsError` when the job's rows with an error
    exceed `[output].max_bad_share`, and `ShardsFailedError` (after committing every other
    shard, with the report) when some shard could not be read. The run report is written
    whatever happens (unless the run found nothing to do), and so are the Prometheus metrics in
    ``metrics_file``. ``cache`` keeps what "auto" measured on this machine (see
    `batchscore.measure.cache`); None measures in every new output folder.
    ``process_started``: when the process began, for a command whose process is the run's
    (the report's "start-up" phase).
    """
    check_outputs(job)  # an id or keep column named like an output column (exit 2)
    if job.engine == "local":  # refuse a device or precision this machine lacks before any work
        check_precision(job.model.precision, resolve_device(job.model.device))
    if accept_quality:
        job = dataclasses.replace(job, quality=dataclasses.replace(job.quality, accept=True))
    retry = Retry()  # transient I/O errors, in and out, retried and counted for the report
    ckpt = Checkpoint(job.output.path, retry)
    ckpt.store.check()  # a file, a read-only or unwritable place: before anything is written
    started = time.time()
    run_id = Path(report_name(started, os.getpid())).stem  # every log record of the run has it
    with hold_lock(ckpt.lock_path, job.name, ckpt.output), run_context(job=job.name, run_id=run_id):
        run = Run(job, ckpt, retry, stats=RunStats(started=started), run_id=run_id)
        if process_started is not None:
            run.stats.phases["start-up"] = max(started - process_started, 0.0)
        log.info(
            "run %s of %s started",
            run_id,
            job.name,
            extra={
                "event": "start",
                "detail": True,
                "source": str(job.source),
                "output": job.output.path,
            },
        )
        try:
            with run:
                model_path = locate(job.model)
                who = identity(job, model_path)
                check_claim(ckpt, who, restart)
                run.claimed = True
                todo = find_pending(job, ckpt, run, fingerprint=who.fingerprint)
                run.failures = todo.failures
                run.stats.phases["preparing"] = time.perf_counter() - run.start
                if todo.chunks:
                    run.failures += score_pending(
                        job,
                        ckpt,
                        todo,
                        run,
                        model_path=model_path,
                        claim=who.record(),
                        progress=progress,
                        cache=cache,
                    )
                judge(job, ckpt, todo, run.failures)
        except ShardsFailedError as exc:
            exc.report = run.report
            raise
        finally:
            if metrics_file is not None:
                run.write_metrics(metrics_file)
        return run.report


def find_pending(job: Job, ckpt: Checkpoint, run: Run, *, fingerprint: str) -> Pending:
    """Clean up after an interrupted run, then find the chunks still to score.

    Every step on the way that deletes or moves a file (the clean-up, a shard's retirement,
    un-committing a chunk) removes `_SUCCESS` before it starts (see `Checkpoint.remove`); a
    run with nothing to delete and nothing to score leaves it, and one with work removes it
    before it scores, as it adds rows to the data files."""
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
    log.debug(
        "%d chunk(s) to score, %d already committed (%d rows)",
        len(todo.chunks),
        todo.done_chunks,
        todo.done_rows,
    )
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
    cache: DecisionCache | None,
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
    model_files = claim["parts"]["model_files"]
    job, decision, gated = settle(
        job,
        model_path,
        recorded,
        cache=cache,
        model_files=model_files,
        rows=sum(c.rows for c in todo.chunks),
    )
    stats.tuning_s = time.perf_counter() - tuning
    settled = decision or recorded
    run.context["settled"] = settled.to_json() if settled is not None else None
    engine = open_engine(job)
    try:
        loaded = time.perf_counter()
        what = f"loading the model {job.model.name or job.model.path} ({engine.device}, "
        done = "model loaded" if gated is None else "model ready (the quality gate loaded it)"
        with stage(f"{what}{job.model.precision})", done, event="model loaded"):
            task = engine.load(model_path, stats, todo.chunks, gated)
        # the gate's model and its pass, where the engine adopted them, are the run's own
        # loading and scoring, not measuring (see `batchscore.observe.phases`)
        adopted_load = adopted_pass = 0.0
        if gated is not None and task is gated.task:
            adopted_load, adopted_pass = gated.load_s - gated.calibrate_s, gated.cold_s
        gated = None  # the engine holds what it adopted; let the rest go
        run.heap.more()  # the model lives as long as the run
        stats.load_s = time.perf_counter() - loaded
        stats.phases["measuring"] = max(stats.tuning_s - adopted_load - adopted_pass, 0.0)
        stats.phases["loading"] = stats.load_s + adopted_load
        run.context.update(device=engine.device, precision=engine.precision, runtime=engine.runtime)
        if engine.quantization:
            run.context["int8"] = engine.quantization
        explain(job, engine, decision=decision, recorded=recorded)
        committer = Committer(
            job.output,
            ckpt,
            schema=output_schema(job, todo.carried, task.columns),
            stats=stats,
            claim=claim,
            decision=decision or recorded,
            metadata=file_metadata(job, claim, engine.precision),
            todo=todo,
            on_commit=shard_events(todo, stats),
        )
        bar = Progress(sum(c.rows for c in todo.chunks), progress, busy=lambda: engine.busy_s)
        sink: Sink[list[Scored]] = Sink(committer, depth=2)  # windows
        scoring = time.perf_counter()
        try:
            engine.score(todo.chunks, sink, bar, stats)
            stats.phases["scoring"] = time.perf_counter() - scoring + adopted_pass
            learn(
                cache,
                job,
                decision,
                model_files=model_files,
                padded_tokens=stats.padded_tokens,
                busy_s=engine.busy_s,
            )
        finally:
            bar.close()
            stats.timeline, stats.first_batch_at = bar.timeline.to_json(), bar.first_batch_at
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
        raise ShardsFailedError(
            f"{len(failures)} shard(s) failed and were not committed; the other shards "
            "were. Fix or remove them and run again to retry:\n  "
            + "\n  ".join(f["error"] for f in failures),
            None,  # the run report, once it is written
        )
    mark_complete(ckpt, job.name)


def explain(
    job: Job, engine: Engine, *, decision: Decision | None, recorded: Decision | None
) -> None:
    """Say which precision, budget and device the run uses and why (the precision as an
    event; the rest at debug level, for ``-v``)."""
    settled = decision or recorded
    if settled is not None:
        why = settled.precision.why + ("" if decision else " (recorded by an earlier run)")
    else:
        why = "the job's [model].precision; fp32 is the reference, so there is nothing to gate"
    log.info(
        "precision %s: %s",
        engine.precision,
        why,
        extra={"event": "precision chosen", "precision": engine.precision, "detail": not decision},
    )
    budget = "the job's [batching].max_tokens"
    if settled is not None and settled.batching is not None:
        budget = settled.batching.why
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
            log.info(
                "shard committed: %s (%d rows)",
                path,
                rows,
                extra={"event": "shard committed", "detail": True, "shard": path, "rows": rows},
            )

    return committed
