"""Measuring what a job leaves to measurement: which precision ("auto", gated against fp32 on
the job's rows) and which token budget (``max_tokens = "auto"``, timed on those rows).

See `batchscore.precision.settle` for when these run, what is recorded and what is cached.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore.errors import QualityGateError
from batchscore.job.sections import Job
from batchscore.models.tasks import generates
from batchscore.pipeline.executor import resolve_device
from batchscore.pipeline.stages import batches
from batchscore.pipeline.static import is_out_of_memory
from batchscore.precision.gate import Trial, judge, trial
from batchscore.precision.load import trial_budget
from batchscore.precision.table import available, precision

log = logging.getLogger("batchscore")
BUDGETS = {"cpu": (2048, 4096, 8192, 16384), "cuda": (8192, 16384, 32768, 65536, 131072)}


def choose_precision(job: Job, model_path: Path, table: pa.Table) -> tuple[Trial, dict[str, Any]]:
    """Gate the job's precision (or, for "auto", pick the fastest that passes); say why.

    At most two models are loaded at a time: the best so far and the one being measured.
    """
    accept = job.quality.accept
    wanted = job.model.precision
    auto = wanted == "auto"
    budget = trial_budget(job)
    reference = trial(job, model_path, "fp32", table=table, max_tokens=budget, timed=auto)
    if wanted == "fp32":
        return reference, {"precision": "fp32", "why": "fp32 is the reference"}
    device = resolve_device(job.model.device)
    candidates = [p for p in available(device) if precision(p).gated] if auto else [wanted]
    if auto and generates(job.model, model_path):
        candidates = [p for p in candidates if precision(p).generates]
    best, measured = reference, [reference.describe()]
    speeds = {"fp32": timing(reference)}
    for name in candidates:
        # One precision to gate: the reference's model, its columns kept, can become it.
        reuse = None if auto else reference
        try:
            candidate = trial(
                job, model_path, name, table=table, max_tokens=budget, timed=auto, reuse=reuse
            )
        except QualityGateError as exc:  # its calibration could not keep the promise
            if not auto:
                raise
            measured.append(f"{name}: fails the quality gate ({exc})")
            log.info("quality gate: %s", measured[-1])
            continue
        candidate.agreement = judge(reference, candidate, job.quality)
        measured.append(candidate.describe())
        log.info("quality gate: %s", candidate.describe())
        if candidate.agreement.passed:
            speeds[name] = timing(candidate)
        if not auto or (candidate.agreement.passed and candidate.rows_per_s > best.rows_per_s):
            best.unload()
            best = candidate
        else:
            candidate.unload()
    record: dict[str, Any] = {"trials": measured, "sample_rows": table.num_rows}
    if auto:
        record["speeds"] = speeds
    if auto:
        why = "the fastest that passes the quality gate, of: " + "; ".join(measured)
    elif best.agreement.passed:
        why = f"{wanted} passes the quality gate: {best.agreement.describe()}"
    elif accept:
        why = f"{wanted} FAILS the quality gate, accepted: {best.agreement.describe()}"
    else:
        raise QualityGateError(
            f"[model].precision = {wanted!r} fails the quality gate on the first "
            f"{table.num_rows} rows: {best.agreement.describe()}. Use another precision, "
            "relax [quality], or pass --accept-quality to score anyway"
        )
    agreement = best.agreement.metrics if best.agreement else None
    record.update(precision=best.precision, agreement=agreement, why=why)
    if accept and best.agreement and not best.agreement.passed:
        record["accepted"] = True  # every later load of this output calibrates the same way
    return best, record


def timing(trial: Trial) -> dict[str, float]:
    """What a later run needs to weigh a precision against fp32 for its own number of rows:
    its speed, and what gating it costs (the load, calibration included, and one pass)."""
    return {
        "rows_per_s": round(trial.rows_per_s, 2),
        "load_s": round(trial.load_s, 3),
        "cold_s": round(trial.cold_s, 3),
    }


def choose_budget(job: Job, chosen: Trial, table: pa.Table) -> dict[str, Any]:
    """Time each candidate budget on the sample's rows (repeated to fill it); keep the fastest."""
    task, executor = chosen.task, chosen.executor
    encoded = task.encode(table)
    sizes = encoded.lengths + encoded.reserve
    if not len(sizes):
        return {"max_tokens": trial_budget(job), "why": "no rows to measure; default budget"}
    budgets = [b for b in BUDGETS[executor.device.type] if b >= sizes.max()]
    speeds: dict[int, float] = {}
    for budget in budgets:
        copies = int(np.ceil(2 * budget / sizes.sum()))
        units = np.tile(np.arange(len(sizes)), copies)
        cut = batches(encoded, units, budget, max_rows=job.batching.max_rows, sort=task.bucketing)
        try:
            executor.run(lambda b=cut[0]: task.forward(encoded, b))  # warm-up, and OOM probe
            start = time.perf_counter()
            tokens = 0
            for b in cut:
                executor.run(lambda b=b: task.forward(encoded, b))
                tokens += int(encoded.lengths[b].sum())
                if tokens >= budget:
                    break
            speeds[budget] = tokens / (time.perf_counter() - start)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            executor.release_memory()
            break  # larger budgets will not fit either
    best = max(speeds.values())
    choice = min(b for b, s in speeds.items() if s >= 0.98 * best)  # near-ties: less memory
    shown = ", ".join(f"{b}: {s:,.0f} tokens/s" for b, s in speeds.items())
    return {"max_tokens": choice, "why": f"fastest that fits ({shown})"}
