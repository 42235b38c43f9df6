"""The command line: a thin shell that parses arguments, calls one recipe per verb, and reports.

The commands over a job file are here; those over a model (run-batch, models, fetch) are in
`batchscore.cli_models`, and join the group below. The commands raise the package's
exceptions; `batchscore.exits` wraps each command and turns an exception into one message and
its exit status (the table is `batchscore.errors.EXIT_CODES`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from batchscore.cli_models import fetch, models, run_batch
from batchscore.errors import MetricsError
from batchscore.exits import (
    PROGRESS,
    SET,
    Group,
    asked_format,
    chosen_progress,
    configured,
    data,
    deliver,
    reports_errors,
    say,
    settings,
    stopping_on_signals,
    version_option,
)
from batchscore.heap import paused
from batchscore.job.parse import load_job
from batchscore.job.sections import Job
from batchscore.observe.phases import process_start
from batchscore.observe.streams import guard, leave
from batchscore.version import __version__

log = logging.getLogger("batchscore")
JOB = click.argument("job", type=click.Path(dir_okay=False))


def load(job: str, overrides: tuple[str, ...]) -> Job:
    return load_job(job, list(overrides))


def console() -> None:
    """The `batchscore` command and `python -m batchscore`: a process of its own, so its
    start-up (interpreter, imports) is the run's first phase; `main` called from within another
    program (a test's runner) has no start-up of its own to count. Its stdout and stderr are
    guarded: a stream that fails never stops the work, and the exit status tells the truth
    about the work (`batchscore.observe.streams`)."""
    streams, json = guard(), asked_format(sys.argv[1:]) == "json"
    try:
        main(obj={"process_started": process_start(), "streams": streams})
    except SystemExit as done:
        leave(done, streams, json)
    leave(SystemExit(0), streams, json)


def process_started() -> float | None:
    """When this command's own process started, where `console` knows it."""
    obj = click.get_current_context().obj
    return obj.get("process_started") if isinstance(obj, dict) else None


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@version_option(__version__)
def main() -> None:
    """Score every row of Parquet shards with a PyTorch model, resumably.

    -v, -q and --log-format may come before the command or after it.

    \b
    Example:
        batchscore validate jobs/embed.toml
        batchscore run jobs/embed.toml
        batchscore run jobs/summarize.toml --log-format json --metrics-file batchscore.prom
    """
    configured(click.get_current_context())
    if spec := os.environ.get("BATCHSCORE_FAULTS"):  # the fault-injection tests' hook only
        from batchscore import faults

        faults.arm(spec)


@main.command()
@JOB
@SET
@click.option("--restart", is_flag=True, help="Discard committed output and start over.")
@click.option(
    "--accept-quality",
    is_flag=True,
    help="Score even if the precision fails its [quality] gate (the report says so).",
)
@PROGRESS
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default=None,
    help="Where the model runs: this process, or actors on a Ray cluster (overrides the job).",
)
@click.option(
    "--metrics-file",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write Prometheus textfile metrics here at the end of the run (atomically).",
)
@reports_errors
def run(
    job: str,
    overrides: tuple[str, ...],
    restart: bool,
    accept_quality: bool,
    progress: str,
    engine: str | None,
    metrics_file: str | None,
) -> None:
    """Score every row of JOB not yet committed, then print a summary (or that there was
    nothing to do, and how much is committed). With --log-format json the summary is one JSON
    object on stdout; with -q there is none.

    \b
    Example:
        batchscore run jobs/embed.toml
        batchscore run jobs/embed.toml --set model.precision=bf16 --restart
        batchscore run jobs/summarize.toml --engine ray --progress log
        batchscore run jobs/embed.toml -q --metrics-file embed.prom
    """
    with paused():  # keeps `--help` free of torch imports, and the imports free of collections
        from batchscore.observe.run_stats import key_figures, summary
        from batchscore.recipes.run import run_job
        from batchscore.recipes.stopped import job_or_stopped

    quiet = settings().quiet
    progress = chosen_progress(progress)
    if engine is not None:
        overrides = (*overrides, f'engine="{engine}"')
    metrics = Path(metrics_file) if metrics_file else None
    loaded = job_or_stopped(job, list(overrides), metrics)  # one that does not load: metrics too
    try:
        with stopping_on_signals():
            report = run_job(
                loaded,
                restart=restart,
                progress=progress,
                accept_quality=accept_quality,
                metrics_file=metrics,
                environ=os.environ,
                process_started=process_started(),
            )
    except MetricsError as exc:  # every row committed: say so, then why the exit status is not 0
        if not quiet:
            say(summary(exc.report), event="summary", **key_figures(exc.report))
        raise
    if not quiet:
        say(summary(report), event="summary", **key_figures(report))


@main.command()
@JOB
@SET
@reports_errors
def validate(job: str, overrides: tuple[str, ...]) -> None:
    """Check JOB's file, inputs, model and device without loading weights or scoring.

    A problem exits with the status `run` would meet it with: 2 for the job file, 4 for the
    model, 3 for a shard that cannot be read or lacks a column (7 when reading failed
    transiently); the message lists every problem found.

    \b
    Example:
        batchscore validate jobs/embed.toml
        batchscore validate jobs/embed.toml --set model.max_length=128
    """
    from batchscore.recipes.validate import preflight

    loaded = load(job, overrides)
    facts = preflight(loaded)
    text = "\n".join([*(f"  {fact}" for fact in facts), f"{job}: ok"])
    say(text, event="validated", message=f"{job}: ok", product=True, facts=facts)


@main.command()
@JOB
@SET
@click.option("--refresh", is_flag=True, help="Forget what this machine measured for the model.")
@click.option(
    "--export",
    "export",
    type=click.Path(dir_okay=False),
    help="Write what is measured for JOB's model and device to this file (a decisions.json).",
)
@reports_errors
def check(job: str, overrides: tuple[str, ...], refresh: bool, export: str | None) -> None:
    """Score a sample of JOB's rows in fp32 and at its precision, and report their agreement.

    With precision = "auto", every precision the device supports is timed and gated on JOB's
    rows, and what this machine measured before for the model is shown beside it; the
    measurement replaces it in the cache folder. --export writes it to a file that a build
    step can place as decisions.json in a container image's cache folder
    ($BATCHSCORE_CACHE_DIR), so fresh containers start from it. Exits 8 when the job's
    precision fails the gate.

    \b
    Example:
        batchscore check jobs/embed.toml --set model.precision=bf16
        batchscore check jobs/embed.toml --export decisions.json
    """
    with paused():
        from batchscore.recipes.check import check as check_job
        from batchscore.recipes.check import check_passed, format_check, verdict

    loaded = load(job, overrides)
    checked = check_job(loaded, environ=os.environ, refresh=refresh, export=export or None)
    say(
        format_check(checked, job),
        event="checked",
        message=verdict(checked, job),
        product=True,
        precision=checked.chosen.precision,
        passed=checked.passed,
        trials=list(checked.chosen.trials),
    )
    check_passed(checked, loaded, job)


@main.command()
@JOB
@SET
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option(
    "--check",
    is_flag=True,
    help="Exit 13 unless the output is complete for JOB as given (for a scheduler to gate on).",
)
@reports_errors
def status(job: str, overrides: tuple[str, ...], as_json: bool, check: bool) -> None:
    """Show what is done, pending and failed for JOB, from its checkpoints alone.

    With --check it exits 13 unless the output is complete for JOB with its settings as
    given: every shard done, nothing damaged, no removed shard's output left in the data
    files, the bad rows within [output].max_bad_share. Where a run would refuse the folder
    (5) or stop at the model (4), status exits as the run would, with or without --check.

    \b
    Example:
        batchscore status jobs/summarize.toml
        batchscore status jobs/summarize.toml --json
        batchscore status jobs/summarize.toml --check && echo complete
    """
    from batchscore.recipes.status import format_status, headline, job_status, verdict

    result = job_status(load(job, overrides), environ=os.environ)
    if as_json:
        deliver(data(result))
    else:
        text = format_status(result)
        say(text, event="status", message=headline(result), product=True, status=result)
    verdict(result, job, check=check)  # as a run's, where a run would stop at once


@main.command()
@JOB
@SET
@click.option(
    "-o", "--output", "out", default="report.html", show_default=True, help="Where to write it."
)
@click.option("--json", "as_json", is_flag=True, help="Print the page's numbers as JSON instead.")
@reports_errors
def report(job: str, overrides: tuple[str, ...], out: str, as_json: bool) -> None:
    """Draw JOB's last run (the newest that scored rows or failed) as one self-contained HTML
    page, with no network needed to open it: token lengths and the sampler's batch cuts,
    throughput and model busy over time, padding per bucket, rows per shard.

    \b
    Example:
        batchscore report jobs/embed.toml -o embed-report.html
        batchscore report jobs/embed.toml --json
    """
    from batchscore.observe.html import write_page
    from batchscore.recipes.report import report_numbers

    numbers = report_numbers(load(job, overrides))
    if as_json:
        deliver(data(numbers))
        return
    write_page(numbers, out)
    run = numbers["figures"]
    text = f"{out}: run {run.get('run_id')} of {numbers['job']}: {run.get('outcome')}"
    say(text, event="report written", path=out, run_id=run.get("run_id"))


@main.command()
@JOB
@SET
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option(
    "--sample-rows",
    type=click.IntRange(min=100),
    default=50_000,
    show_default=True,
    help="Tokenize every row up to this many; above it, estimate tokens from a random sample.",
)
@click.option("--no-timing", is_flag=True, help="Never load the model (no estimate without a run).")
@click.option("--max-wall-s", type=float, help="Exit 12 if the estimated wall time is longer.")
@click.option(
    "--max-tokens",
    type=int,
    help="Exit 12 if the job has more tokens to score in all (not [batching].max_tokens, "
    "the tokens of one batch).",
)
@reports_errors
def plan(job: str, overrides: tuple[str, ...], as_json: bool, **limits: Any) -> None:
    """A dry run of JOB: shards, rows after `where`, rows already committed, tokens, expected
    padding efficiency, and an ESTIMATED wall time on this machine: start-up, what the run will
    spend measuring (the quality gate, faster precisions worth trying, int8's calibration),
    the model's load and scoring (at the rate of the job's last run, or of a short timed sample
    of the model when there is none; only the tokenizer is loaded to count). Over --max-wall-s
    or --max-tokens it exits 12, for a scheduler to gate on.

    \b
    Example:
        batchscore plan jobs/embed.toml
        batchscore plan jobs/embed.toml --json --max-wall-s 3600 && batchscore run jobs/embed.toml
    """
    with paused():
        from batchscore.recipes.estimate import check_limits, format_plan, plan_job

    loaded = load(job, overrides)
    process = process_started()  # a run's start-up would end here, as this plan's does
    result = plan_job(
        loaded,
        sample_rows=limits.pop("sample_rows"),
        timing=not limits.pop("no_timing"),
        environ=os.environ,
        startup_s=time.time() - process if process is not None else None,
    )
    if as_json:
        deliver(data(result))
    else:
        say(format_plan(result), event="plan", product=True, plan=result)
    check_limits(result, job, **limits)


for command in (run_batch, models, fetch):
    main.add_command(command)
