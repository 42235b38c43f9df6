"""The driver: the recipe that wires the stages for one job, explicitly.

    reader thread:  chunk rows -> where -> task.encode -> batches  (pipeline.stages.windows, ahead)
    model thread:   batches -> model -> output rows in input order  (pipeline.scoring.Scorer)
    writer thread:  rows -> temp Parquet -> publish -> commit record  (output.committer, behind)

A run, in order (`run_job`): claim the output folder; recover from a killed run, plan what is
pending and carry the plan out (`output.apply`); measure what the job leaves to measurement
(`measure.decide`); load the model on the engine; score every pending chunk through it into
the committer; finish with the verdict. Each step is a phase of the run's wall time
(`observe.phases`).

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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchscore.engines import Engine, open_engine
from batchscore.errors import ShardsFailedError
from batchscore.job.sections import Job
from batchscore.measure.cache import DecisionCache, open_cache
from batchscore.measure.decide import decide, learn, recorded_decision
from batchscore.measure.gate import Trial
from batchscore.models.fingerprint import identity
from batchscore.models.source.locate import locate
from batchscore.models.tasks import check_outputs, footer_metadata, input_kinds
from batchscore.observe.logs import run_context
from batchscore.observe.progress import Progress, stage
from batchscore.observe.run_stats import RunStats
from batchscore.output.apply import apply, recover
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.claim import Identity, check_claim
from batchscore.output.committer import Committer
from batchscore.output.contents import file_metadata, output_schema
from batchscore.output.format_table import open_format
from batchscore.output.lock import hold_lock
from batchscore.output.pending import Pending
from batchscore.output.settled import Decision
from batchscore.output.survey import Survey
from batchscore.output.todo import to_do
from batchscore.output.verdict import bad_share_error, mark_complete
from batchscore.precision.table import check_precision
from batchscore.recipes.choices import explain
from batchscore.recipes.run_record import Run
from batchscore.recipes.stopped import metrics_however_it_stops
from batchscore.runtime.device import resolve_device
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
    environ: Mapping[str, str] | None = None,
    process_started: float | None = None,
) -> dict[str, Any]:
    """Score every row of the job not yet committed; return the run report.

    Raises `LockHeldError` when another run holds the job, `OutputConflictError` when the output
    folder holds another job's output or other settings', `QualityGateError` when the precision
    fails its gate (unless ``accept_quality``), `BadRowsError` when the job's rows with an error
    exceed `[output].max_bad_share`, and `ShardsFailedError` (after committing every other
    shard, with the report) when some shard could not be read. The run report is written
    whatever happens (unless the run found nothing to do), and so are the Prometheus metrics in
    ``metrics_file``, even for a run that stopped before it began (`recipes.stopped`).
    ``environ``: the environment the front door passes in, where the cache folder of what
    "auto" measured on this machine is found (`batchscore.measure.cache`); None keeps none, and
    every new output folder measures. ``process_started``: when the process began, for a
    command whose process is the run's (the report's "start-up" phase).
    """
    with metrics_however_it_stops(job, metrics_file):
        check_outputs(job)  # an id or keep column named like an output column (exit 2)
        if job.engine == "local":  # refuse a device or precision this machine lacks first
            check_precision(job.model.precision, resolve_device(job.model.device))
        if accept_quality:
            job = dataclasses.replace(job, quality=dataclasses.replace(job.quality, accept=True))
        cache = open_cache(environ, job.quality.cache_dir)
        retry = Retry()  # transient I/O errors, in and out, retried and counted for the report
        ckpt = Checkpoint(job.output.path, retry)
        ckpt.store.check()  # a file, a read-only or unwritable place: before anything is written
        ckpt.format = open_format(job, ckpt.store, environ)  # a folder, or a table's log too
        started = time.time()
        run_id = Path(report_name(started, os.getpid())).stem  # every log record of the run has it
        with (
            hold_lock(ckpt.lock_path, job.name, ckpt.output),
            run_context(job=job.name, run_id=run_id),
        ):
            run = Run(job, ckpt, retry, stats=RunStats(started=started), run_id=run_id)
            if process_started is not None:
                run.clock.add("start-up", max(started - process_started, 0.0))
            say_started(job, run_id)
            try:
                with run:
                    steps(job, run, restart=restart, progress=progress, cache=cache)
            except ShardsFailedError as exc:
                exc.report = run.report
                raise
            finally:
                if metrics_file is not None:
                    run.write_metrics(metrics_file)
            return run.report


def steps(job: Job, run: Run, *, restart: bool, progress: str, cache: DecisionCache | None) -> None:
    """The run, step by step, each step a phase of its wall time (`observe.phases`)."""
    with run.clock.phase("preparing"):
        model_path, who = claim_output(job, run, restart=restart)
        todo = list_pending(job, run, fingerprint=who.fingerprint)
    if todo.chunks:
        decided = measure(job, todo, run, model_path=model_path, who=who, cache=cache)
        with opened(decided.job, run.stats) as engine:
            task = load(engine, decided, todo, run, model_path=model_path)
            run.failures += score(
                engine,
                decided,
                todo,
                run,
                task=task,
                who=who,
                model_path=model_path,
                progress=progress,
                cache=cache,
            )
    finish(job, run.ckpt, todo, run.failures)


def say_started(job: Job, run_id: str) -> None:
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


def claim_output(job: Job, run: Run, *, restart: bool) -> tuple[Path, Identity]:
    """The model, and the job's identity for the output folder, claimed by this job (or
    refused, exit 5); with ``restart``, what batchscore wrote there goes first."""
    model_path = locate(job.model)
    who = identity(job, model_path)
    check_claim(run.ckpt, who, restart)
    run.claimed = True
    return model_path, who


def list_pending(job: Job, run: Run, *, fingerprint: str) -> Pending:
    """Recover from an interrupted run, list the input (once: what else the run reads of it
    comes from this listing), plan the work, then carry the plan out (`output.apply`).

    Every step on the way that deletes or moves a file (the clean-up, a shard's retirement,
    un-committing a chunk) removes `_SUCCESS` before it starts (see `Checkpoint.remove`); a
    run with nothing to delete and nothing to score leaves it, and one with work removes it
    before it scores, as it adds rows to the data files."""
    ckpt = run.ckpt
    recovered = recover(ckpt)
    survey = Survey(
        inp=job.input,
        kinds=input_kinds(job.model.task, job.input, job.options),
        chunk_rows=job.output.chunk_rows,
        shards=tuple(find_shards(job.input, run.retry)),
        fingerprint=fingerprint,
        label=run.run_id,
    )
    todo = apply(ckpt, to_do(ckpt, survey), recovered=recovered)
    run.failures = todo.failures
    stats = run.stats
    stats.chunks_already_done, stats.rows_already_done = todo.done_chunks, todo.done_rows
    stats.chunks_pending, stats.chunks_redone = len(todo.chunks), len(todo.redone)
    run.context.update(redone=todo.redone, gone_shards=todo.gone)
    if todo.increments is not None:  # by rows: what the diff found, and what it retired
        run.context.update(increments=todo.increments, retired=todo.retired)
        stats.rows_retired = todo.increments["to_retire"] if todo.retired else 0
    log.debug(
        "%d chunk(s) to score, %d already committed (%d rows)",
        len(todo.chunks),
        todo.done_chunks,
        todo.done_rows,
    )
    if todo.chunks or todo.failures:
        ckpt.drop_success()  # incomplete from now until a run ends with every row committed
    return todo


@dataclass
class Decided:
    """What the run decided before loading: the job with "auto" made concrete, the decision
    it records (None: nothing new), the one an earlier run recorded, and the quality gate's
    trial, whose model an engine in this process adopts."""

    job: Job
    decision: Decision | None
    recorded: Decision | None
    gated: Trial | None

    @property
    def standing(self) -> Decision | None:
        """The decision the output is made under: this run's, else the recorded one."""
        return self.decision or self.recorded


def measure(
    job: Job,
    todo: Pending,
    run: Run,
    *,
    model_path: Path,
    who: Identity,
    cache: DecisionCache | None,
) -> Decided:
    """Settle what the job leaves to measurement, on the sample read from the run's own
    listing of the input; the run's context receives the decision behind the run."""
    with run.clock.phase("measuring") as measuring:
        recorded = recorded_decision(run.ckpt, job)
        concrete, decision, gated = decide(
            job,
            model_path,
            recorded,
            shards=todo.shards,
            cache=cache,
            model_files=who.parts["model_files"],
            rows=sum(c.rows for c in todo.chunks),
        )
    run.stats.tuning_s = measuring.seconds
    decided = Decided(concrete, decision, recorded, gated)
    standing = decided.standing
    run.context["settled"] = standing.to_json() if standing is not None else None
    return decided


@contextmanager
def opened(job: Job, stats: RunStats) -> Iterator[Engine]:
    """The job's engine, closed however the run goes; its model time is the run's, with the
    gate's pass it adopted."""
    engine = open_engine(job)
    try:
        yield engine
    finally:
        engine.close()
        stats.model_busy_s = engine.busy_s + stats.gate_busy_s


def load(engine: Engine, decided: Decided, todo: Pending, run: Run, *, model_path: Path) -> Any:
    """Load the model on the engine (the quality gate's, where the engine adopts it) and say
    how the run scores: where it runs, the precision in force and the decision behind it."""
    job, gated = decided.job, decided.gated
    with run.clock.phase("loading") as loading:
        what = f"loading the model {job.model.name or job.model.path} ({engine.device}, "
        done = "model loaded" if gated is None else "model ready (the quality gate loaded it)"
        with stage(f"{what}{job.model.precision})", done, event="model loaded"):
            task = engine.load(model_path, run.stats, todo.chunks, gated, shards=todo.shards)
        # the gate's model and its pass, where the engine adopted them, are the run's own
        # loading and scoring, not measuring (see `batchscore.observe.phases`)
        adopted_load = adopted_pass = 0.0
        if gated is not None and task is gated.task:
            adopted_load, adopted_pass = gated.load_s - gated.calibrate_s, gated.cold_s
            if gated.known is not None:  # its batches are the run's: their units are not run again
                run.stats.adopt(gated.known.lengths, gated.known.batches, busy_s=adopted_pass)
        gated = decided.gated = None  # the engine holds what it adopted; let the rest go
        run.heap.more()  # the model lives as long as the run
    run.stats.load_s = loading.seconds + adopted_load
    run.stats.tuning_s = max(run.stats.tuning_s - adopted_load - adopted_pass, 0.0)
    run.clock.move(adopted_load, "measuring", "loading")
    run.clock.move(adopted_pass, "measuring", "scoring")
    run.context.update(device=engine.device, precision=engine.precision, runtime=engine.runtime)
    if engine.quantization:
        run.context["int8"] = engine.quantization
    explain(
        job,
        engine,
        decision=decided.decision,
        recorded=decided.recorded,
        asked=run.job.model.precision,
    )
    return task


def score(
    engine: Engine,
    decided: Decided,
    todo: Pending,
    run: Run,
    *,
    task: Any,
    who: Identity,
    model_path: Path,
    progress: str,
    cache: DecisionCache | None,
) -> list[dict[str, str]]:
    """Stream every pending chunk through the engine and the committer (whose first commit
    writes ``who``'s job record); return the shards that failed on the way. A run at a faster
    precision keeps its measured speed in ``cache`` (`measure.decide.learn`). Every data
    file's footer says what the task says of its output (a classifier's label names)."""
    job, stats = decided.job, run.stats
    claim = who.record()
    described = footer_metadata(model_path, model=job.model, options=job.options)
    committer = Committer(
        job.output,
        run.ckpt,
        schema=output_schema(
            todo.carried, task.columns, job.output.on_error, row_hash=job.input.by_rows
        ),
        stats=stats,
        claim=claim,
        decision=decided.standing,
        metadata=file_metadata(job, claim, engine.precision, described),
        todo=todo,
        on_commit=shard_events(todo, stats),
    )
    bar = Progress(sum(c.rows for c in todo.chunks), progress, busy=lambda: engine.busy_s)
    sink: Sink[list[Scored]] = Sink(committer, depth=2)  # windows
    try:
        with run.clock.phase("scoring"):
            engine.score(todo.chunks, sink, bar, stats)
        learn(
            cache,
            job,
            decided.decision,
            model_files=who.parts["model_files"],
            padded_tokens=stats.padded_tokens - stats.gate_padded_tokens,  # the engine's own
            busy_s=engine.busy_s,
        )
    finally:
        bar.close()
        stats.timeline, stats.first_batch_at = bar.timeline.to_json(), bar.first_batch_at
        try:
            sink.close()
        finally:
            committer.abort()
    return committer.failures


def finish(job: Job, ckpt: Checkpoint, todo: Pending, failures: list[dict[str, str]]) -> None:
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


def shard_events(todo: Pending, stats: RunStats) -> Callable[[Chunk, dict[str, Any], bool], None]:
    """The committer's callback: count each chunk (and piece of one) against its shard, and
    say when a shard's last pending chunk is committed."""
    left = Counter(c.shard.path for c in todo.chunks)

    def committed(chunk: Chunk, record: dict[str, Any], done: bool) -> None:
        path = chunk.shard.path
        stats.committed(path, record["rows"], record["bad_rows"], record["filtered"])
        left[path] -= done  # a piece of a chunk leaves the rest of it to commit
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
