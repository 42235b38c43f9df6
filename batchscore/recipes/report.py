"""A job's past runs, as `batchscore report` draws them: the run reports in the output folder,
and the status of its shards."""

from __future__ import annotations

from typing import Any

from batchscore.errors import JobError
from batchscore.job.sections import Job
from batchscore.observe.figures import page_numbers, pick_run
from batchscore.output.checkpoint import Checkpoint
from batchscore.recipes.status import job_status


def report_numbers(job: Job) -> dict[str, Any]:
    """The report page's numbers for the job's newest run that did something."""
    chosen = pick_run(Checkpoint(job.output.path).reports())
    if chosen is None:
        raise JobError(f"{job.source}: no run report in {job.output.path} yet; run the job first")
    return page_numbers(chosen, job_status(job))
