"""The local engine: one model in this process, fed by the reader thread (see the driver)."""

from __future__ import annotations

from pathlib import Path

from batchscore.committer import Scored
from batchscore.config import Job
from batchscore.driver import Scorer, windows
from batchscore.executor import Executor
from batchscore.models import Task
from batchscore.pipeline import Sink, prefetch
from batchscore.reader import Chunk
from batchscore.report import Progress, RunStats
from batchscore.tuning import Trial, load


class LocalEngine:
    """Reader thread -> this thread's model -> the committer's sink, window by window."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.executor = Executor(job.model)  # checks device and precision before any work
        self.device, self.precision = str(self.executor.device), self.executor.precision
        self.task: Task | None = None
        self.quantization = ""

    @property
    def busy_s(self) -> float:
        return self.executor.busy_s

    def load(
        self, model_path: Path, stats: RunStats, chunks: int = 1, loaded: Trial | None = None
    ) -> Task:
        if loaded is not None and loaded.task is not None:  # the gate's model, already prepared
            self.executor, self.task = loaded.executor, loaded.task
            self.executor.busy_s = 0.0  # the run's model time starts now
        else:
            self.task = load(self.job, model_path, self.executor)
        self.quantization = self.executor.quantization
        return self.task

    def score(
        self, chunks: list[Chunk], sink: Sink[Scored], bar: Progress, stats: RunStats
    ) -> None:
        scorer = Scorer(self.job, self.task, self.executor, stats, bar)
        for window in prefetch(windows(self.job, chunks, self.task), depth=2):
            if window.error is not None:
                sink.put(Scored(window.chunk, error=window.error))
            else:
                sink.put(scorer(window))

    def close(self) -> None:
        """Nothing to release: the model goes with this process."""
