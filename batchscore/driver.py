"""The driver: wires reader -> tokenizer -> sampler -> executor -> writer for one job, explicitly.

    reader thread:  chunk rows -> windows -> task.encode -> sampler batches   (prefetch, ahead)
    main thread:    batches -> model (executor) -> results in input order -> output table
    writer thread:  tables -> temp Parquet -> publish -> commit record        (Sink, behind)

A shard that cannot be read fails alone: its open chunk is dropped, the other shards commit,
and the run ends with `InputDataError` so the next run retries it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore import __version__
from batchscore.checkpoint import Checkpoint, part_name
from batchscore.config import Job
from batchscore.errors import InputDataError
from batchscore.executor import Executor
from batchscore.fsio import write_json
from batchscore.lock import hold_lock
from batchscore.models import Encoded, Task, input_kinds, load_task
from batchscore.models.locate import locate, model_identity
from batchscore.pipeline import Sink, prefetch
from batchscore.reader import (
    Chunk,
    Shard,
    check_columns,
    find_shards,
    open_shard,
    plan_chunks,
    read_windows,
)
from batchscore.report import Progress, RunStats
from batchscore.sampler import padded_tokens, plan_batches, restore
from batchscore.writer import ChunkWriter

log = logging.getLogger("batchscore")


@dataclass
class Window:
    """Rows of one chunk on their way through the pipeline; `error` marks a failed chunk."""

    chunk: Chunk
    table: pa.Table | None = None
    encoded: Encoded | None = None
    batches: list[np.ndarray] = dataclasses.field(default_factory=list)
    error: InputDataError | None = None


def fingerprint_parts(job: Job, model_path: Path) -> dict[str, Any]:
    """Everything that decides the output; a change means committed chunks no longer match."""
    columns: dict[str, Any] = {"text": job.input.text, "carried": list(job.input.carried)}
    if job.input.features:  # only when set, so the fingerprints of text jobs stay as they were
        columns["features"] = list(job.input.features)
    return {
        "task": job.model.task,
        "task_options": dataclasses.asdict(job.task),
        "model": job.model.name or job.model.path,
        "model_files": model_identity(model_path),
        "precision": job.model.precision,
        "max_length": job.model.max_length or "model default",
        "columns": columns,
        "chunk_rows": job.output.chunk_rows,
    }


def pending_chunks(
    job: Job, shards: list[Shard], ckpt: Checkpoint, stats: RunStats, failures: list[dict[str, str]]
) -> list[Chunk]:
    """Chunks still to score. A shard whose committed chunks all match it is not even opened;
    one whose footer or columns are unusable is added to ``failures`` and skipped."""
    committed = ckpt.committed()
    pending = []
    for shard in shards:
        prefix = f"{shard.index:05d}-"
        records = [r for key, r in committed.items() if key.startswith(prefix)]
        if records and any(r["shard"] != shard.identity for r in records):
            log.warning("%s changed since it was scored; scoring it again", shard.path)
            for r in records:
                ckpt.forget(r["chunk"])
                del committed[r["chunk"]]
            records = []
        if records and len(records) == records[0]["chunks"]:
            stats.chunks_already_done += len(records)
            stats.rows_already_done += sum(r["rows"] for r in records)
            continue
        try:
            pf = open_shard(shard)
            kinds = input_kinds(job.model.task, job.input, job.task)
            check_columns(shard, pf.schema_arrow, job.input.carried, kinds)
        except InputDataError as exc:
            failures.append({"shard": shard.path, "error": str(exc)})
            continue
        for chunk in plan_chunks(shard, pf.metadata.num_rows, job.output.chunk_rows):
            if chunk.key in committed:
                stats.chunks_already_done += 1
                stats.rows_already_done += chunk.rows
            else:
                pending.append(chunk)
    return pending


def windows(job: Job, chunks: list[Chunk], task: Task) -> Iterator[Window]:
    """Reader + tokenizer + sampler for every pending chunk (runs in the reader thread)."""
    failed: set[int] = set()
    columns = tuple(dict.fromkeys([*job.input.carried, *task.inputs]))
    b = job.batching
    for chunk in chunks:
        if chunk.shard.index in failed:
            continue
        offset = chunk.start
        try:
            for table in read_windows(chunk, columns, b.window_rows):
                encoded = task.encode(table)
                if encoded.errors:
                    row, message = min(encoded.errors.items())
                    raise InputDataError(f"{chunk.shard.path}: row {offset + row}, {message}")
                budget = encoded.lengths + encoded.reserve
                batches = plan_batches(budget, b.max_tokens, b.max_rows, b.sort and task.bucketing)
                yield Window(chunk, table, encoded, batches)
                offset += table.num_rows
        except InputDataError as exc:
            failed.add(chunk.shard.index)
            yield Window(chunk, error=exc)


class Committer:
    """The writer thread's work: append to the open chunk, publish and commit it once full."""

    def __init__(self, job: Job, ckpt: Checkpoint, stats: RunStats) -> None:
        self.job, self.ckpt, self.stats = job, ckpt, stats
        self.writer: ChunkWriter | None = None
        self.failures: list[dict[str, str]] = []

    def __call__(self, window: Window) -> None:
        chunk = window.chunk
        if window.error is not None:
            self.abort()
            self.failures.append({"shard": chunk.shard.path, "error": str(window.error)})
            return
        if self.writer is None:
            self.writer = ChunkWriter(
                self.ckpt.output, self.ckpt.tmp_dir, chunk.key, window.table.schema
            )
        self.writer.append(window.table)
        if self.writer.rows == chunk.rows:
            self.writer.publish(chunk.rows)
            self.writer = None
            self.ckpt.commit(
                {
                    "chunk": chunk.key,
                    "file": part_name(chunk.key),
                    "shard": chunk.shard.identity,
                    "chunks": chunk.of,
                    "start": chunk.start,
                    "stop": chunk.stop,
                    "rows": chunk.rows,
                    "committed_at": time.time(),
                }
            )
            self.stats.chunks_committed += 1

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()
            self.writer = None


def score(window: Window, task: Task, executor: Executor, job: Job, stats: RunStats,
          progress: Progress) -> Window:  # fmt: skip
    """Run the model over one window's batches and replace its table with the output rows."""
    encoded, rows = window.encoded, window.table.num_rows
    lengths = encoded.lengths
    outputs = []
    for batch in window.batches:
        outputs.append(executor.run(lambda batch=batch: task.forward(encoded, batch)))
        progress.advance(rows * len(batch) / max(len(lengths), 1), int(lengths[batch].sum()))
    if not window.batches:
        progress.advance(rows, 0)
    results = restore(window.batches, outputs, np.empty((0,), dtype=np.float32))
    columns = task.finish(encoded, results)
    carried = window.table.select(list(job.input.carried))
    for name, array in columns.items():
        carried = carried.append_column(name, array)
    stats.rows += rows
    stats.units += len(lengths)
    stats.tokens += int(lengths.sum())
    stats.padded_tokens += padded_tokens(lengths, window.batches)
    stats.batches += len(window.batches)
    stats.truncated += encoded.truncated
    return dataclasses.replace(window, table=carried, encoded=None, batches=[])


def run_job(job: Job, restart: bool = False, progress: str = "off") -> dict[str, Any]:
    """Score every row of the job not yet committed; return the run report.

    Raises `LockHeldError` when another run holds the job, `OutputConflictError` when the output
    was made with other settings, and `InputDataError` (after committing every other shard)
    when some shard could not be read.
    """
    ckpt = Checkpoint(job.output_dir)
    with hold_lock(ckpt.lock_path, job.name):
        start, stats = time.perf_counter(), RunStats()
        executor = Executor(job.model)
        model_path = locate(job.model)
        ckpt.claim(job.name, fingerprint_parts(job, model_path), restart)
        for garbage in ckpt.sweep():
            log.info("removed %s, left by an interrupted run", garbage.name)
        committer = Committer(job, ckpt, stats)
        chunks = pending_chunks(job, find_shards(job.input), ckpt, stats, committer.failures)
        if chunks:
            loaded = time.perf_counter()
            task = load_task(model_path, job.model, job.task, job.input, executor)
            stats.load_s = time.perf_counter() - loaded
            bar = Progress(sum(c.rows for c in chunks), progress)
            sink: Sink[Window] = Sink(committer, depth=2)
            try:
                for window in prefetch(windows(job, chunks, task), depth=2):
                    if window.error is None:
                        window = score(window, task, executor, job, stats, bar)
                    sink.put(window)
            finally:
                bar.close()
                try:
                    sink.close()
                finally:
                    committer.abort()
        stats.model_busy_s = executor.busy_s
        stats.wall_s = time.perf_counter() - start
        report = stats.report(
            job=job.name,
            output=str(job.output_dir),
            device=str(executor.device),
            precision=executor.precision,
            failed_shards=committer.failures,
            version=__version__,
        )
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(stats.started))
        write_json(ckpt.runs_dir / f"{stamp}-{os.getpid()}.json", report)
        if committer.failures:
            raise InputDataError(
                f"{len(committer.failures)} shard(s) failed and were not committed; the other "
                "shards were. Fix or remove them and run again to retry:\n  "
                + "\n  ".join(f["error"] for f in committer.failures)
            )
        return report
