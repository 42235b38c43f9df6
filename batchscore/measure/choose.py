"""Gating a precision against fp32 on the job's rows, and `batchscore check`'s full measurement.

A fixed precision (bf16, int8, ...) is gated: it scores the job's first rows next to fp32 and is
refused when the two agree less than `[quality]` demands. `batchscore check` with "auto" measures
every precision the device runs natively, each timed on a warm second pass, and shows the table.
A run's "auto" weighs what is worth trying instead (`batchscore.measure.auto`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from batchscore.errors import ModelError, QualityGateError
from batchscore.job.sections import Job
from batchscore.measure.cache import Evidence
from batchscore.measure.gate import Trial, judge, trial
from batchscore.measure.load import convertible, trial_budget
from batchscore.measure.rounds import Gated, first_rows, gate_in_rounds
from batchscore.models.tasks import generates
from batchscore.output.settled import Chosen
from batchscore.precision.table import available, precision
from batchscore.runtime.device import resolve_device

log = logging.getLogger("batchscore")
DETAIL = {"detail": True}  # each trial: the run's precision line says the outcome (-v: these)


@dataclass
class Choice:
    """A gated precision: the chosen trial (its model is the run's), the decision record, the
    fp32 reference and every other precision tried (their models let go, their figures kept)."""

    chosen: Trial
    record: Chosen
    reference: Trial
    tried: dict[str, Trial] = field(default_factory=dict)
    gated: Gated | None = None  # how the gate concluded on a fixed precision, in rounds


def choose_precision(
    job: Job,
    model_path: Path,
    table: pa.Table,
    *,
    evidence: Evidence | None = None,
    whole: bool = False,
) -> Choice:
    """Gate the job's precision in rounds (`batchscore.measure.rounds`; ``evidence``: what
    this machine kept for it on this job, ``whole``: every sample row needed), or, for "auto",
    time every one on the whole sample and pick the fastest that passes; say why.

    At most two models are loaded at a time: the best so far and the one being measured.
    """
    accept = job.quality.accept
    wanted = job.model.precision
    auto = wanted == "auto"
    budget = trial_budget(job)
    first = None
    if not auto:
        first = first_rows(job.quality, table.num_rows, warm=evidence is not None, whole=whole)
    reference = trial(
        job, model_path, "fp32", table=table, max_tokens=budget, timed=auto, rows=first
    )
    if wanted == "fp32":
        return Choice(reference, Chosen("fp32", "fp32 is the reference"), reference)
    device = resolve_device(job.model.device)
    candidates = [p for p in available(device) if precision(p).gated] if auto else [wanted]
    if auto and generates(job.model, model_path):
        candidates = [p for p in candidates if precision(p).generates]
    best, measured = reference, [reference.describe()]
    tried: dict[str, Trial] = {}
    gated = None
    for name in candidates:
        # One precision to gate: the reference's model, its columns kept, can become it
        # (int8), once it has scored the whole sample; else it stays loaded beside the
        # candidate, to score the gate's further rounds.
        reuse = None
        if not auto and convertible(name, compiled=reference.executor.compiled):
            reuse = reference
            reference.score(table.slice(reference.rows))
        try:
            candidate = trial(
                job,
                model_path,
                name,
                table=table,
                max_tokens=budget,
                timed=auto,
                reuse=reuse,
                rows=first,
            )
        except (QualityGateError, ModelError) as exc:  # calibration could not keep the
            if not auto:  # promise, or found no Linear layer to quantize: "auto" moves on
                raise
            measured.append(f"{name}: cannot run here ({exc})")
            log.info("quality gate: %s", measured[-1], extra=DETAIL)
            continue
        if auto:
            candidate.agreement = judge(reference, candidate, job.quality)
        else:
            gated = gate_in_rounds(
                reference, candidate, table, job.quality, evidence=evidence, whole=whole
            )
        tried[name] = candidate
        measured.append(candidate.describe())
        log.info("quality gate: %s", candidate.describe(), extra=DETAIL)
        if not auto or (candidate.agreement.passed and candidate.rows_per_s > best.rows_per_s):
            if best is not reference:
                best.unload()
            best = candidate
        else:
            candidate.unload()
    if auto:
        why = "the fastest that passes the quality gate, of: " + "; ".join(measured)
    elif best.agreement.passed:
        why = f"{wanted} passes the quality gate: {best.agreement.describe()}"
    elif accept:
        why = f"{wanted} FAILS the quality gate, accepted: {best.agreement.describe()}"
    else:
        raise QualityGateError(
            f"[model].precision = {wanted!r} fails the quality gate on the first "
            f"{best.rows} rows: {best.agreement.describe()}. Use another precision, "
            "relax [quality], or pass --accept-quality to score anyway"
        )
    if best is not reference:
        reference.unload()  # its columns are all the record needs; its model would stay on
    agreement = best.agreement.metrics if best.agreement else None
    record = Chosen(
        best.precision,
        why,
        trials=tuple(measured),
        # every later load of an accepted failure's output calibrates the same way
        accepted=bool(accept and best.agreement and not best.agreement.passed),
        measured={
            "sample_rows": best.rows,
            "agreement": agreement,
            **({"gate": gated.record()} if gated is not None else {}),
        },
    )
    return Choice(best, record, reference, tried, gated)
