"""A Dagster asset whose materialization is a batchscore output folder brought up to date.

The asset runs the batchscore command line in a process of its own (the model's memory goes
with it), and reads each step by its exit status alone (docs/reliability.md, "Exit status"):

1. ``batchscore plan JOB --max-wall-s S``: 12 when the run would not fit the window; the asset
   is then not materialized this time, and the step succeeds (the gate held it back, as asked).
   Another non-zero status is the one the run would fail with at once (2, 4, 5, 10).
2. ``batchscore run JOB``: 0 once every row is committed. 75 (another run of the job holds its
   lock), 7 (reading failed transiently), 129 and 143 (stopped by a signal) ask for a retry,
   which Dagster makes after ``retry_wait_s``: the run resumes, and nothing committed is scored
   again. Any other status fails the step without retries (2 the job file, 3 shards or rows,
   4 the model, 5 the output folder...): trying again would meet it again.
3. ``batchscore status JOB --check --json``: 0 when the output is complete; the asset is
   materialized with its numbers (and the run's) as metadata. 13 fails the step.

``command`` is how batchscore is started (``["batchscore"]`` on PATH, or a virtual
environment's ``[".venv/bin/batchscore"]``). Materialize it from Python with
``dagster.materialize([embeddings], run_config=...)``, or in a Dagster project's definitions.
"""

# No `from __future__ import annotations`: Dagster reads the config class from the asset's
# signature at definition time, as an object.
import json
import subprocess
from typing import Any

import dagster as dg

OVER_LIMIT = 12  # plan: over --max-wall-s: not this time
RETRY_LATER = (75, 7, 129, 143)  # run: lock held, transient read, SIGHUP, SIGTERM
INCOMPLETE = 13  # status --check: the output is not complete


class BatchscoreJob(dg.Config):
    """Which job the asset keeps current, and how long a run may take."""

    job: str = "jobs/embed.toml"
    max_wall_s: float = 3600.0
    command: list[str] = ["batchscore"]  # noqa: RUF012 (a Config field: pydantic copies it)
    retries: int = 3
    retry_wait_s: float = 600.0


def batchscore(config: BatchscoreJob, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*config.command, *args], capture_output=True, text=True, check=False)


def failed(step: str, done: subprocess.CompletedProcess[str]) -> dg.Failure:
    """A failure that says the exit status and batchscore's own message (its last lines)."""
    said = "\n".join(done.stderr.strip().splitlines()[-5:])
    return dg.Failure(
        description=f"batchscore {step} exited {done.returncode}: {said}",
        metadata={"exit_code": done.returncode},
        allow_retries=False,
    )


def summary(stdout: str) -> dict[str, Any]:
    """The run's summary: with ``--log-format json``, its last line on stdout."""
    for line in reversed(stdout.strip().splitlines()):
        record = json.loads(line)
        if record.get("event") == "summary":
            return record
    return {}


@dg.asset(output_required=False)
def embeddings(context: dg.AssetExecutionContext, config: BatchscoreJob):
    """The job's output folder, every input row committed."""
    plan = batchscore(config, "plan", config.job, "--max-wall-s", str(config.max_wall_s))
    if plan.returncode == OVER_LIMIT:
        context.log.warning(f"{config.job}: over {config.max_wall_s} s; not run this time")
        return
    if plan.returncode != 0:
        raise failed("plan", plan)
    run = batchscore(config, "run", config.job, "--progress", "log", "--log-format", "json")
    context.log.info(run.stderr[-4000:])
    if run.returncode in RETRY_LATER:
        raise dg.RetryRequested(max_retries=config.retries, seconds_to_wait=config.retry_wait_s)
    if run.returncode != 0:
        raise failed("run", run)
    status = batchscore(config, "status", config.job, "--check", "--json")
    if status.returncode != 0:  # INCOMPLETE, or the folder refused since the run ended
        raise failed("status --check", status)
    numbers, figures = json.loads(status.stdout), summary(run.stdout)
    yield dg.MaterializeResult(
        metadata={
            "output": dg.MetadataValue.path(numbers["output"]),
            "rows": numbers["rows_done"],
            "bad_rows": numbers["bad_rows"],
            "rows_scored_now": figures.get("rows", 0),
            "rows_per_s": figures.get("rows_per_s", 0.0),
            "precision": str(figures.get("precision", "")),
        }
    )
