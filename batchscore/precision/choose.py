"""What a job leaves to measurement, decided once per output folder before anything is scored.

- The quality gate: a precision other than fp32 scores the job's first rows next to fp32 and is
  refused when the two agree less than `[quality]` demands (see `batchscore.precision.gate`).
- ``precision = "auto"``: every precision the device runs natively is timed on those rows, and
  the fastest one that passes the gate is chosen.
- ``precision = "int8"``: which Linear layers may run in int8 is measured on those rows too,
  every time the model loads (see `batchscore.precision.load`); the gate then judges the result.
- ``max_tokens = "auto"``: batch budgets are timed on those rows (with the chosen precision),
  and the fastest that fits in memory is chosen.

The decision is recorded in the output folder, so a resumed run reuses it and one output never
mixes precisions; the run report carries it, reasons included.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from batchscore.errors import BookkeepingError, QualityGateError
from batchscore.job.sections import Job
from batchscore.models.tasks import generates
from batchscore.observe.progress import stage
from batchscore.output.checkpoint import Checkpoint, Damaged
from batchscore.output.manifest import written_for
from batchscore.pipeline.executor import resolve_device
from batchscore.pipeline.scoring import is_out_of_memory
from batchscore.pipeline.stages import batches, sample_rows
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
    for name in candidates:
        try:
            candidate = trial(job, model_path, name, table=table, max_tokens=budget, timed=auto)
        except QualityGateError as exc:  # its calibration could not keep the promise
            if not auto:
                raise
            measured.append(f"{name}: fails the quality gate ({exc})")
            log.info("quality gate: %s", measured[-1])
            continue
        candidate.agreement = judge(reference, candidate, job.quality)
        measured.append(candidate.describe())
        log.info("quality gate: %s", candidate.describe())
        if not auto or (candidate.agreement.passed and candidate.rows_per_s > best.rows_per_s):
            best.unload()
            best = candidate
        else:
            candidate.unload()
    record: dict[str, Any] = {"trials": measured, "sample_rows": table.num_rows}
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


def settle(
    job: Job, model_path: Path, recorded: dict[str, Any] | None, sample: pa.Table | None = None
) -> tuple[Job, dict[str, Any] | None, Trial | None]:
    """The job with "auto" settings made concrete and its precision gated.

    ``recorded`` is an earlier decision for this output, reused as is. Returns the concrete job,
    the new decision to record (None when there was nothing to decide) and the chosen trial,
    whose loaded model the local engine adopts instead of loading (and calibrating) it again.
    ``sample``: the rows to measure on (in-memory data); by default the job's first rows.
    """
    if recorded:
        return concrete(job, recorded), None, None
    needs_budget = job.batching.max_tokens == "auto"
    if job.model.precision == "fp32" and not needs_budget:
        return job, None, None
    table = sample if sample is not None else sample_rows(job, job.quality.sample_rows)
    wanted = job.model.precision
    what = "fp32 and every faster precision" if wanted == "auto" else f"fp32 and {wanted}"
    with stage(f"quality gate: scoring {table.num_rows} rows in {what}", "quality gate done"):
        chosen, decision = choose_precision(job, model_path, table)
    decision = {"precision": decision}
    if needs_budget:
        with stage("max_tokens = auto: timing batch budgets", "budgets timed"):
            decision["batching"] = choose_budget(job, chosen, table)
        log.info("max_tokens = auto: %s", decision["batching"]["why"])
    return concrete(job, decision), decision, chosen


def recorded_decision(ckpt: Checkpoint, job: Job) -> dict[str, Any] | None:
    """The decision an earlier run recorded for this output (None when the folder is not
    claimed: an unclaimed folder decided nothing). A damaged record is rebuilt from what the
    data files' footers prove (the precision every committed file was scored at), or the run
    stops rather than score the rest at another precision."""
    if not ckpt.claimed():
        return None
    try:
        return ckpt.settled()
    except Damaged as damage:
        files = [r["file"] for r in ckpt.committed().values()]
        found = {written_for(ckpt.store, f).get("batchscore.precision") for f in files}
        if len(found) != 1 or None in found:
            raise BookkeepingError(
                f"{damage}; the data files do not prove one precision. Run with --restart to "
                "start over, or point [output].path at a new folder"
            ) from None
        why = "recovered from the data files' footers (the recorded decision was damaged)"
        decision: dict[str, Any] = {"precision": {"precision": found.pop(), "why": why}}
        if job.batching.max_tokens == "auto":  # only speed depends on it
            decision["batching"] = {"max_tokens": trial_budget(job), "why": why}
        log.warning("%s; %s", damage, why)
        ckpt.settle(decision)
        return decision


def concrete(job: Job, decision: dict[str, Any]) -> Job:
    """Apply a decision's precision and budget (and an accepted gate failure) to the job."""
    model = dataclasses.replace(job.model, precision=decision["precision"]["precision"])
    batching, quality = job.batching, job.quality
    if "batching" in decision:
        batching = dataclasses.replace(batching, max_tokens=decision["batching"]["max_tokens"])
    if decision["precision"].get("accepted"):
        quality = dataclasses.replace(quality, accept=True)
    return dataclasses.replace(job, model=model, batching=batching, quality=quality)


def check(job: Job, model_path: Path) -> tuple[dict[str, Any], bool]:
    """`batchscore check`: measure the gate on the job's rows without recording or scoring."""
    table = sample_rows(job, job.quality.sample_rows)
    quality = dataclasses.replace(job.quality, accept=True)  # measure, whatever it shows
    chosen, decision = choose_precision(
        dataclasses.replace(job, quality=quality), model_path, table
    )
    return decision, chosen.agreement is None or chosen.agreement.passed
