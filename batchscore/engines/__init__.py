"""Engines: where the model runs, chosen by the job's ``engine`` key from a table.

The driver finds the pending work, commits and reports; an engine only turns pending chunks
into `Scored` windows and hands them to the committer's sink, so every engine writes the same
output and checkpoints, and any engine resumes any other's run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from batchscore.engines.local import LocalEngine
from batchscore.engines.ray import RayEngine
from batchscore.job.sections import Job
from batchscore.measure.gate import Trial
from batchscore.observe.progress import Progress
from batchscore.observe.run_stats import RunStats
from batchscore.threads import Sink
from batchscore.work.units import Chunk, Scored, Shard


class Engine(Protocol):
    """What the driver asks of an engine."""

    device: str  # where the model runs, for the report
    precision: str
    quantization: str  # what int8 did at load ("" at other precisions)
    runtime: str  # what the model runs on: "torch", or "openvino" (its encoder compiled)
    busy_s: float  # model time, summed over every model replica

    def load(
        self,
        model_path: Path,
        stats: RunStats,
        chunks: list[Chunk],
        loaded: Trial | None = None,
        *,
        shards: list[Shard] | None = None,
    ) -> Any:
        """Load the model (once per replica, as many as ``chunks``, the pending ones, can keep
        busy); return the task, or anything with its `columns`. An engine may start reading
        ``chunks`` meanwhile; `score` gets the same list. ``loaded``: the model the quality
        gate already loaded at the job's precision, for an engine that runs in this process to
        adopt. ``shards``: the input as the run listed it, where int8's calibration rows are
        read in this process."""
        ...

    def score(
        self, chunks: list[Chunk], sink: Sink[list[Scored]], bar: Progress, stats: RunStats
    ) -> None:
        """Score every chunk; a window's parts go into ``sink`` as lists (one or a few handoffs
        per window), so the writer takes many at a step. Each chunk's parts arrive in row order."""
        ...

    def close(self) -> None:
        """Release workers; safe to call when nothing was loaded."""
        ...


# engine -> its class; Ray itself is imported only when a Ray engine starts
ENGINES: dict[str, type[Engine]] = {"local": LocalEngine, "ray": RayEngine}


def open_engine(job: Job) -> Engine:
    """The engine the job names."""
    return ENGINES[job.engine](job)
