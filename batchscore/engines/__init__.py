"""Engines: where the model runs, chosen by the job's ``engine`` key from a table.

The driver plans, commits and reports; an engine only turns pending chunks into `Scored`
windows and hands them to the committer's sink, so every engine writes the same output and
checkpoints, and any engine resumes any other's run.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from batchscore.committer import Scored
    from batchscore.config import Job
    from batchscore.pipeline import Sink
    from batchscore.reader import Chunk
    from batchscore.report import Progress, RunStats
    from batchscore.tuning import Trial

# engine -> "module:class"; modules are imported on use, so Ray loads only for engine = "ray"
ENGINES = {
    "local": "batchscore.engines.local:LocalEngine",
    "ray": "batchscore.engines.ray:RayEngine",
}


class Engine(Protocol):
    """What the driver asks of an engine."""

    device: str  # where the model runs, for the report
    precision: str
    quantization: str  # what int8 did at load ("" at other precisions)
    busy_s: float  # model time, summed over every model replica

    def load(
        self, model_path: Path, stats: RunStats, chunks: int, loaded: Trial | None = None
    ) -> Any:
        """Load the model (once per replica, for ``chunks`` pending chunks at most); return the
        task, or anything with its `columns`. ``loaded``: the model the quality gate already
        loaded at the job's precision, for an engine that runs in this process to adopt."""
        ...

    def score(
        self, chunks: list[Chunk], sink: Sink[Scored], bar: Progress, stats: RunStats
    ) -> None:
        """Score every chunk, putting its windows into ``sink`` (each chunk's in row order)."""
        ...

    def close(self) -> None:
        """Release workers; safe to call when nothing was loaded."""
        ...


def open_engine(job: Job) -> Engine:
    """The engine the job names."""
    module, cls = ENGINES[job.engine].split(":")
    return getattr(importlib.import_module(module), cls)(job)
