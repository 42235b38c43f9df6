"""`batchscore plan`'s time estimate, and the plan as a whole (`plan`, what the CLI calls).

The rate comes from this machine: the last run of the job that scored rows at the same
precision (padded tokens per second of its scoring wall time, so reading, writing and their
overlap are in it), or, when there is none, a short timed sample: the model loaded at the job's
precision scores ~`TIMED_ROWS` rows drawn at random from those to score, after a warm-up batch
(padded tokens per second of model time; reading and writing overlap with it in a run). Either
way it is an estimate.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore.errors import OverLimitError
from batchscore.job.sections import Job
from batchscore.models.locate import locate
from batchscore.output.checkpoint import Checkpoint
from batchscore.pipeline.executor import Executor, resolve_device
from batchscore.pipeline.plan import SAMPLE_ROWS, plan_job
from batchscore.pipeline.sampler import padded_tokens
from batchscore.pipeline.stages import batches
from batchscore.precision.load import load_at, trial_budget
from batchscore.precision.settle import concrete
from batchscore.precision.table import check_precision

# The timed sample: rows drawn at random from those to score, and at most this much model time
# on them. Measured on a busy 2-core CPU, 128 rows (2-3 batches) gave rates 2x apart from one
# try to the next; 512 rows came within 10% of the run that followed.
TIMED_ROWS = 512
TIMED_S = 15.0


def plan(job: Job, *, sample_rows: int = SAMPLE_ROWS, timing: bool = True) -> dict[str, Any]:
    """The dry run: `plan_job`'s counts, and an estimated wall time (None, with the reason,
    when there is no earlier run and ``timing`` is off)."""
    model_path = locate(job.model)
    ckpt = Checkpoint(job.output.path)
    claimed = job  # as the run claims the output: before its "auto" settings are settled
    settled = ckpt.settled()
    notes = []
    if settled:  # what the next run will use: the recorded decision
        job = concrete(job, settled)
    elif job.model.precision != "fp32" or job.batching.max_tokens == "auto":
        notes.append(
            f"the run first measures the quality gate on {job.quality.sample_rows} rows "
            "(its time is not in the estimate)"
        )
    if job.batching.max_tokens == "auto":
        budget = trial_budget(job)
        notes.append(f'max_tokens = "auto" is not measured yet; planned with {budget}')
        job = dataclasses.replace(
            job, batching=dataclasses.replace(job.batching, max_tokens=budget)
        )
    if job.model.precision == "auto":
        notes.append('precision = "auto" is not measured yet: timed in fp32, the slowest choice')
        job = dataclasses.replace(job, model=dataclasses.replace(job.model, precision="fp32"))
    check_precision(job.model.precision, resolve_device(job.model.device))
    planned, rows = plan_job(job, model_path, sample_rows=sample_rows, claimed=claimed,
                             timing_rows=TIMED_ROWS if timing else 0)  # fmt: skip
    planned["estimate"] = estimate(job, model_path, planned, ckpt.reports(), timing_rows=rows)
    planned["notes"] = notes
    return planned


def usable(reports: Iterable[dict[str, Any]], precision: str) -> dict[str, Any] | None:
    """The newest run (newest first) that scored rows at ``precision`` on this engine locally."""
    for report in reports:
        scoring = report.get("wall_s", 0) - report.get("load_s", 0) - report.get("tuning_s", 0)
        if (
            report.get("padded_tokens", 0) > 0
            and scoring > 0
            and report.get("precision") == precision
            and report.get("engine", "local") == "local"
        ):
            return report
    return None


def estimate(
    job: Job,
    model_path: Path,
    planned: dict[str, Any],
    reports: Any,
    *,
    timing_rows: pa.Table | None,
) -> dict[str, Any]:
    """Seconds the run should take: model load plus padded tokens at this machine's rate (of
    the last run, or measured on ``timing_rows``; None: no timing)."""
    padding = planned["padding"]
    if not planned["chunks_to_score"]:
        return {"wall_s": 0.0, "basis": "nothing to score: every chunk is committed"}
    last = usable(reports, job.model.precision)
    if last is not None:
        scoring = last["wall_s"] - last["load_s"] - last["tuning_s"]
        rate, load_s = last["padded_tokens"] / scoring, last["load_s"]
        basis = (
            f"the last run ({last.get('run_id', '?')}) on {last.get('device', '?')} in "
            f"{last['precision']}: {rate:,.0f} padded tokens per second of wall time"
        )
    elif timing_rows is not None and timing_rows.num_rows:
        rate, load_s, rows = timed_sample(job, model_path, timing_rows)
        basis = (
            f"a timed sample on this machine ({rows} rows, {job.model.precision}): "
            f"{rate:,.0f} padded tokens per second of model time"
        )
    else:
        return {"wall_s": None, "basis": "no earlier run to go by, and timing is off"}
    found = {"load_s": round(load_s, 2), "rate": round(rate, 1), "basis": basis}
    efficiency = padding["efficiency"] or 1.0
    tokens = planned["tokens"]
    for key, count in (("wall_s", tokens["value"]), ("low_s", tokens.get("low")),
                       ("high_s", tokens.get("high"))):  # fmt: skip
        if count is not None:
            padded = padding["padded_tokens"] if key == "wall_s" else count / efficiency
            found[key] = round(load_s + padded / rate, 1)
    return found


def timed_sample(job: Job, model_path: Path, table: pa.Table) -> tuple[float, float, int]:
    """(padded tokens per second of model time, model load seconds, rows): the model at the
    job's precision scores ``table`` (rows drawn from those to score) once warmed up."""
    executor = Executor(job.model)
    start = time.perf_counter()
    task = load_at(job, model_path, executor, table)
    load_s = time.perf_counter() - start
    encoded = task.encode(table)
    units = np.arange(len(encoded.lengths))
    sort = job.batching.sort and task.bucketing
    cut = batches(
        encoded, units, job.batching.max_tokens, max_rows=job.batching.max_rows, sort=sort
    )
    if not cut:
        return 1.0, load_s, 0
    executor.run(lambda: task.forward(encoded, cut[0]))  # warm-up: first calls pay set-up costs
    before, padded = executor.busy_s, 0
    # in random order, so that stopping at TIMED_S leaves a fair share of short and long batches
    for i in np.random.default_rng(0).permutation(len(cut)):
        executor.run(lambda batch=cut[i]: task.forward(encoded, batch))
        padded += padded_tokens(encoded.lengths, [cut[i]])
        if executor.busy_s - before > TIMED_S:
            break
    seconds = max(executor.busy_s - before, 1e-9)
    return padded / seconds, load_s, table.num_rows


def check_limits(
    result: dict[str, Any], job: str, *, max_wall_s: float | None, max_tokens: int | None
) -> None:
    """Raise `OverLimitError` (exit 12) when the plan is over a limit a scheduler gave."""
    over = []
    wall = result["estimate"].get("wall_s")
    if max_wall_s is not None and wall is not None and wall > max_wall_s:
        over.append(f"estimated {wall:,.0f} s > --max-wall-s {max_wall_s:,.0f}")
    if max_tokens is not None and result["tokens"]["value"] > max_tokens:
        over.append(f"{result['tokens']['value']:,} tokens > --max-tokens {max_tokens:,}")
    if over:
        raise OverLimitError(f"{job}: over the limit: {'; '.join(over)}")


def format_plan(p: dict[str, Any]) -> str:
    """The plan for people; ``--json`` gives scripts the same data."""
    tokens, padding, est = p["tokens"], p["padding"], p["estimate"]
    if tokens["exact"]:
        token_line = f"{tokens['value']:,} (exact: every row tokenized)"
    else:
        token_line = (
            f"~{tokens['value']:,} (95% interval {tokens['low']:,} to {tokens['high']:,}, "
            f"from a random sample of {tokens['sampled_rows']:,} rows)"
        )
    where = f" ({p['filtered']:,} dropped by [input].where)" if p["where"] else ""
    lines = [
        f"plan for {p['job']} (a dry run: only the tokenizer was loaded to count)",
        f"  input: {p['shards']} shard(s), {p['input_rows']:,} rows; {p['rows_committed']:,} rows "
        f"committed ({p['chunks_committed']} chunks), {p['chunks_to_score']} chunk(s) to score",
        f"  rows to score: {p['rows_to_score']:,}{where}",
        f"  tokens: {token_line}",
        f"  batches: {padding['batches']:,} under max_tokens {p['max_tokens']}; padded tokens "
        f"{padding['padded_tokens']:,}; padding efficiency {padding['efficiency']:.3f} "
        f"({'the run' if padding['exact'] else 'the sampled lengths'} through the sampler)",
    ]
    if est.get("wall_s") is None:
        lines.append(f"  ESTIMATE: none ({est['basis']})")
    else:
        spread = f" ({est['low_s']:,.0f} to {est['high_s']:,.0f} s)" if "low_s" in est else ""
        lines.append(f"  ESTIMATE: ~{est['wall_s']:,.0f} s wall time{spread}")
        if "load_s" in est:
            lines.append(f"    model load {est['load_s']:.1f} s; rate from {est['basis']}")
        else:
            lines.append(f"    {est['basis']}")
    lines += [f"  note: {n}" for n in p["notes"]]
    if p["conflict"]:
        lines.append(f"  warning: {p['conflict']}")
    lines += [f"  failing: {f['error']}" for f in p["failures"]]
    return "\n".join(lines)
