"""The local engine: one model in this process, fed by the reader thread.

The reader starts when the model starts loading: a job over thousands of small shards has its
first window read and tokenized by the time the weights are in (the quality gate's model, when
the run adopts it, is ready at once).

The task's encoding (its tokenizer and config) is built on this thread before the reader
starts, so every module the reader needs is imported by then. Two threads importing
transformers at once can each meet the other's half-initialised modules (Python hands a
concurrent circular import a partial module rather than deadlock): "cannot import name
'AutoConfig'", at random, on a busy machine.
"""

from __future__ import annotations

import threading
from pathlib import Path

from batchscore.job.sections import Job
from batchscore.measure.gate import Trial
from batchscore.measure.load import load_at
from batchscore.models.base import Encoding, Task
from batchscore.models.tasks import encoding, input_kinds
from batchscore.observe.progress import Progress
from batchscore.observe.run_stats import RunStats
from batchscore.pipeline.known import Known
from batchscore.pipeline.pace import Pace
from batchscore.pipeline.scoring import Scorer
from batchscore.pipeline.stages import windows
from batchscore.runtime.executor import Executor
from batchscore.threads import Prefetch, Sink
from batchscore.work.units import Chunk, Scored, Shard, Window


class LocalEngine:
    """Reader thread -> this thread's model -> the committer's sink, window by window."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.kinds = input_kinds(job.model.task, job.input, job.options)  # the columns it reads
        self.executor = Executor(job.model)  # checks device and precision before any work
        self.device, self.precision = str(self.executor.device), self.executor.precision
        self.task: Task | None = None
        self.quantization = ""
        self.runtime = "torch"
        self.reading: Prefetch[Window] | None = None  # windows, read from `load` on
        # the model's pace, by which the reader sizes windows to commit on time (commit_s)
        self.pace = Pace(job.output.commit_s, first=job.batching.max_rows)

    @property
    def busy_s(self) -> float:
        return self.executor.busy_s

    def load(
        self,
        model_path: Path,
        stats: RunStats,
        chunks: list[Chunk],
        loaded: Trial | None = None,
        *,
        shards: list[Shard] | None = None,
    ) -> Task:
        if loaded is not None and loaded.task is not None:  # the gate's model, already prepared
            self.executor, self.task, known = loaded.executor, loaded.task, loaded.known
            self.executor.busy_s = 0.0  # the run's model time starts now
            self.pace.took(loaded.rows, loaded.seconds)  # the gate timed it: the first window
            self.reading = self.read(chunks, self.task, known)
        else:  # the first windows are read while the model loads
            reads = self.encoding(model_path)  # here, so the reader imports nothing
            self.reading = self.read(chunks, reads)
            self.task = load_at(self.job, model_path, self.executor, shards=shards)
        self.quantization, self.runtime = self.executor.quantization, self.executor.runtime
        return self.task

    def encoding(self, model_path: Path) -> Encoding:
        """The task's own encoding (its tokenizer and config: no weights needed), so reading
        need not wait for the model."""
        job = self.job
        return encoding(model_path, model=job.model, options=job.options, inp=job.input)

    def read(
        self, chunks: list[Chunk], task: Encoding, known: Known | None = None
    ) -> Prefetch[Window]:
        """The reader thread: ``chunks``' windows, encoded and cut, two ahead of the model."""
        job = self.job
        read = windows(
            chunks,
            task,
            inp=job.input,
            kinds=self.kinds,
            batching=job.batching,
            on_error=job.output.on_error,
            known=known,
            pace=self.pace,
        )
        self.pace.stop = threading.Event()  # this reader's: one waiting for the pace stops too
        return Prefetch(read, depth=2, stop=self.pace.stop)

    def score(
        self, chunks: list[Chunk], sink: Sink[list[Scored]], bar: Progress, stats: RunStats
    ) -> None:
        job = self.job
        scorer = Scorer(
            self.task,
            self.executor,
            inp=job.input,
            batching=job.batching,
            on_error=job.output.on_error,
            stats=stats,
            progress=bar,
            pace=self.pace,
        )
        reading, self.reading = self.reading, None  # read from `load` on, for these chunks
        if reading is None:
            reading = self.read(chunks, self.task)
        for window in reading:
            scorer(window, sink.put)  # the parts (one per chunk) it completes, a few at a time

    def close(self) -> None:
        """Stop reading, if the run ended before it did; the model goes with this process."""
        if self.reading is not None:
            self.reading.close()
            self.reading = None
