"""The local engine: one model in this process, fed by the reader thread."""

from __future__ import annotations

from pathlib import Path

from batchscore.job.sections import Job
from batchscore.models.base import Task
from batchscore.observe.progress import Progress
from batchscore.observe.report import RunStats
from batchscore.output.pending import Chunk
from batchscore.pipeline.executor import Executor
from batchscore.pipeline.known import Known
from batchscore.pipeline.scoring import Scorer
from batchscore.pipeline.stages import Scored, windows
from batchscore.pipeline.threads import Sink, prefetch
from batchscore.precision.gate import Trial
from batchscore.precision.load import load_at


class LocalEngine:
    """Reader thread -> this thread's model -> the committer's sink, window by window."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.executor = Executor(job.model)  # checks device and precision before any work
        self.device, self.precision = str(self.executor.device), self.executor.precision
        self.task: Task | None = None
        self.quantization = ""
        self.runtime = "torch"
        self.known: Known | None = None  # the adopted gate model's results for the first rows

    @property
    def busy_s(self) -> float:
        return self.executor.busy_s

    def load(
        self, model_path: Path, stats: RunStats, chunks: int = 1, loaded: Trial | None = None
    ) -> Task:
        if loaded is not None and loaded.task is not None:  # the gate's model, already prepared
            self.executor, self.task, self.known = loaded.executor, loaded.task, loaded.known
            self.executor.busy_s = 0.0  # the run's model time starts now
        else:
            self.task = load_at(self.job, model_path, self.executor)
        self.quantization, self.runtime = self.executor.quantization, self.executor.runtime
        return self.task

    def score(
        self, chunks: list[Chunk], sink: Sink[list[Scored]], bar: Progress, stats: RunStats
    ) -> None:
        scorer = Scorer(self.job, self.task, self.executor, stats=stats, progress=bar)
        known, self.known = self.known, None  # for this pass over the chunks alone
        for window in prefetch(windows(self.job, chunks, self.task, known), depth=2):
            scorer(window, sink.put)  # the parts (one per chunk) it completes, a few at a time

    def close(self) -> None:
        """Nothing to release: the model goes with this process."""
