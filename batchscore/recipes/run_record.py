"""One run's record: its counters, what it learned about the model, how it ended, and the report
and metrics written however it ends (an error, Ctrl-C, SIGTERM)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from batchscore.errors import BadRowsError, InputDataError, MetricsError, WriteError
from batchscore.heap import Frozen
from batchscore.job.sections import Job
from batchscore.observe.metrics import write_metrics
from batchscore.observe.phases import Clock
from batchscore.observe.run_stats import RunStats
from batchscore.output.checkpoint import Checkpoint
from batchscore.storage.layout import report_name
from batchscore.storage.retry import Retry
from batchscore.version import __version__

log = logging.getLogger("batchscore")


def outcome_of(error: BaseException | None) -> str:
    """How a run ended, in the report's words."""
    if error is None:
        return "ok"
    if isinstance(error, KeyboardInterrupt):  # Ctrl-C, and SIGTERM / SIGHUP (see the CLI)
        return "interrupted"
    if isinstance(error, BadRowsError):
        return "too many bad rows"
    if isinstance(error, InputDataError):
        return "shards failed"
    return "failed"


class Run:
    """Used as ``with Run(job, ckpt) as run:`` around everything a run does.

    On the way out, however the block ends, the report is built; it is saved in the output
    folder once the run got as far as claiming it, unless the run found nothing to do. While
    the block runs, what the process holds is set aside from the garbage collector (`heap`).
    """

    def __init__(
        self, job: Job, ckpt: Checkpoint, retry: Retry, *, stats: RunStats, run_id: str
    ) -> None:
        self.job, self.ckpt, self.retry, self.run_id = job, ckpt, retry, run_id
        self.stats = stats
        self.clock = Clock(stats.phases)  # the run's phases, block by block
        self.start = time.perf_counter()
        self.outcome = "failed"
        self.failures: list[dict[str, str]] = []
        self.claimed = False  # the folder is this job's to write a report into
        self.report: dict[str, Any] | None = None
        self.context: dict[str, Any] = {
            "engine": job.engine,
            "device": job.model.device,
            "precision": job.model.precision,
        }
        self.heap = Frozen()

    def __enter__(self) -> Run:
        self.heap.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.heap.__exit__(kind, error, trace)
        self.outcome = outcome_of(error)
        self.stats.wall_s = time.perf_counter() - self.start
        self.stats.retries += self.retry.count
        self.report = self.stats.report(
            job=self.job.name,
            run_id=self.run_id,
            outcome=self.outcome,
            output=self.job.output.path,
            failed_shards=self.failures,
            version=__version__,
            **self.context,
        )
        changed = self.stats.chunks_pending or self.stats.rows_retired
        if self.claimed and (changed or self.outcome != "ok"):
            self.ckpt.save_report(report_name(self.stats.started, os.getpid()), self.report)
        log.info(
            "run finished: %s",
            self.outcome,
            extra={
                "event": "run finished",
                "detail": True,
                "outcome": self.outcome,
                "report": self.report,
            },
        )

    def write_metrics(self, path: Path) -> None:
        """Prometheus metrics for this run. A file that cannot be written is a warning when
        the run itself failed (its error is the one to report), and `MetricsError` (its own
        exit status, so cron notices) when the run succeeded."""
        try:
            write_metrics(path, self.report, self.ckpt.reports())
        except WriteError as exc:
            if self.outcome != "ok":
                log.error("%s", exc)
                return
            raise MetricsError(str(exc), report=self.report) from exc
