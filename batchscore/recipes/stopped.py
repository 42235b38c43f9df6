"""Metrics for a run that stopped before its record existed.

A run's record (`recipes.run_record.Run`) writes the run's metrics however the run ends. A run can
also stop before it has one: an id or keep column named like an output column, a precision
this machine lacks, an output folder it cannot write. The metrics file must still say the run
failed, with the last success time the README's alert reads (0 for a job that has never
succeeded), or the alert would watch a file that never changes. Another run holding the job's
lock is no failure: that run writes them.

A run can stop earlier still, at a job file that does not load (`--set` included): there is no
job, so no name and no output folder to read the last success from. The metrics file it writes
says the run failed, under the job label and with the last success time the earlier metrics
file held (the file's own stem's label, and 0, where there is none): the series the alert
watches goes on, and `batchscore_last_run_success` no longer says 1.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from batchscore.errors import BatchscoreError, LockHeldError
from batchscore.job.parse import load_job
from batchscore.job.sections import Job
from batchscore.observe.metrics import earlier_file, write_metrics
from batchscore.output.checkpoint import Checkpoint

log = logging.getLogger("batchscore")


def stamp(path: Path) -> tuple[int, int] | None:
    """A file's inode and modification time (None: no file): a replaced file has new ones."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns


@contextlib.contextmanager
def metrics_however_it_stops(job: Job, path: Path | None) -> Iterator[None]:
    """Around a run: if it raises a `BatchscoreError` without having written ``path`` (it
    stopped before its record), write the metrics of a failed run there, then re-raise."""
    before = stamp(path) if path is not None else None
    try:
        yield
    except BatchscoreError as exc:
        if path is not None and not isinstance(exc, LockHeldError) and stamp(path) == before:
            write_stopped(job, path)
        raise


def write_stopped(job: Job, path: Path) -> None:
    """Metrics of a run that failed at once: nothing scored, the last success from the output's
    run reports. A file that cannot be written is a warning: the run's error is the one to
    report."""
    report = {"job": job.name, "outcome": "failed", "started": time.time(), "wall_s": 0.0}
    try:
        earlier = list(Checkpoint(job.output.path).reports())
    except (BatchscoreError, OSError):
        earlier = []
    try:
        write_metrics(path, report, earlier)
    except BatchscoreError as exc:
        log.warning("%s", exc)


def job_or_stopped(source: str, overrides: list[str], metrics: Path | None) -> Job:
    """The job file ``source`` loaded with ``overrides`` (`batchscore.job.parse.load_job`),
    for a run; one that does not load raises its error, after writing the metrics of a
    failed run to ``metrics`` (if given), as every run writes them."""
    try:
        return load_job(source, overrides)
    except BatchscoreError:
        if metrics is not None:
            write_unloaded(source, metrics)
        raise


def write_unloaded(source: str | Path, path: Path) -> None:
    """Metrics of a run whose job file ``source`` did not load (see the module's note). A file
    that cannot be written is a warning: the job file's error is the one to report."""
    job, success_at = earlier_file(path)
    report = {
        "job": job if job is not None else Path(source).stem,
        "outcome": "failed",
        "started": time.time(),
        "wall_s": 0.0,
    }
    try:
        write_metrics(path, report, [], success_at=success_at)
    except BatchscoreError as exc:
        log.warning("%s", exc)
