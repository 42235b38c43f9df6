"""``precision = "auto"``: fp32 first, then only what can pay for itself on this job.

The quality gate needs fp32's results on the job's first rows whatever precision is chosen, so
fp32 scores them first. That pass is the run's own work (the run adopts its model and its
results when fp32 stays) and it times fp32 on this machine, now, whatever else the machine is
doing. A faster precision is then tried only while what it is expected to save on the rest of
this job exceeds what trying it costs: its load, int8's calibration and its own pass over the
sample. Before it is tried its speed is a guess, as a multiple of fp32's: the ratio this machine
measured for the model before (`batchscore.measure.cache`), else what the device's units
promise (`Precision.speedup`). Once tried, it is judged by the gate and by its measured speed.

A few hundred rows are therefore scored in fp32 with nothing measured beyond the gate's own
pass; a large job tries bf16 or int8 and keeps the one that is faster and passes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchscore.errors import ModelError, QualityGateError
from batchscore.job.sections import Job
from batchscore.measure.cache import Measured
from batchscore.measure.gate import Trial, judge, trial
from batchscore.measure.load import CALIBRATION_PASSES, trial_budget
from batchscore.models.tasks import generates
from batchscore.output.settled import Chosen
from batchscore.precision.table import available, precision
from batchscore.runtime.device import resolve_device

# the lines of the choice are said again in the run's precision line: here with -v only
DETAIL = {"detail": True}
log = logging.getLogger("batchscore")
OPENVINO_GAIN = 1.2  # OpenVINO's fp32 over torch's, per token (1.14-1.3x, BENCHMARKS.md)


def measured(candidate: Trial, reference: Trial) -> Measured:
    """A tried precision's measurement, relative to fp32's pass over the same rows."""
    tokens = candidate.tokens_per_row * candidate.rows
    return Measured(
        speedup=round(candidate.tokens_per_s / max(reference.tokens_per_s, 1e-9), 3),
        load_s=round(max(candidate.load_s - candidate.calibrate_s, 0.0), 3),
        calibrate_s=round(candidate.calibrate_s / max(tokens / 1000, 1e-9), 4),
    )


@dataclass
class Auto:
    """What "auto" chose and what it learned on the way."""

    chosen: Trial  # its model and its results for the sample are the run's
    record: Chosen  # the precision chosen, as the output folder records it
    measured: dict[str, Measured]  # every precision tried, for the cache
    unusable: dict[str, str]  # precisions this model cannot run at all, and why


@dataclass(frozen=True)
class Outlook:
    """One precision weighed before it is tried: seconds it is expected to save on the rest of
    the job against the current choice, and seconds trying it is expected to cost."""

    name: str
    speedup: float
    saving_s: float
    cost_s: float
    guessed: bool  # the speedup is the device's promise, not a measurement

    @property
    def worth_trying(self) -> bool:
        return self.saving_s > self.cost_s

    def describe(self) -> str:
        basis = "the device's guess" if self.guessed else "measured here before"
        return (
            f"{self.name}: not tried (at {self.speedup:.2f}x fp32, {basis}, it would save "
            f"~{self.saving_s:.1f} s on this job's other rows; trying it costs "
            f"~{self.cost_s:.1f} s)"
        )


def outlook(
    name: str,
    device: Any,
    *,
    reference: Trial,
    left_tokens: float,
    best_speed: float,
    known: Measured | None,
) -> Outlook:
    """Weigh ``name`` against the current best (``best_speed`` padded tokens/s) for the rest
    of the job (``left_tokens``), from fp32's ``reference`` pass over the sample."""
    guessed = known is None
    speedup = guessed_speedup(name, device, reference) if known is None else known.speedup
    speed = reference.tokens_per_s * speedup
    saving = left_tokens / max(best_speed, 1e-9) - left_tokens / max(speed, 1e-9)
    sample_tokens = reference.tokens_per_row * reference.rows
    load = reference.load_s if known is None else known.load_s
    fp32 = reference.tokens_per_s
    calibrate = calibration_s(name, sample_tokens, fp32=fp32, speed=speed, known=known)
    cost = load + calibrate + sample_tokens / speed
    return Outlook(name, speedup, saving, cost, guessed)


def guessed_speedup(name: str, device: Any, reference: Trial) -> float:
    """``name``'s speed over fp32 before it is tried: what the device's units promise, less
    OpenVINO's own gain where fp32 ran on OpenVINO and ``name`` would not (int8 without VNNI:
    1.05x OpenVINO's fp32 on MiniLM, where its promise against torch's fp32 is 1.4x)."""
    entry = precision(name)
    speedup = entry.speedup(device)
    if reference.runtime == "openvino" and not entry.openvino(device):
        speedup /= OPENVINO_GAIN
    return speedup


def calibration_s(
    name: str, sample_tokens: float, *, fp32: float, speed: float, known: Measured | None
) -> float:
    """Seconds ``name``'s calibration is expected to take on the gate's sample (none for a
    precision that needs none): as measured here before, or half the sample once in fp32
    (``fp32`` padded tokens/s) and `CALIBRATION_PASSES` times at ``speed``."""
    if not precision(name).calibrated:
        return 0.0
    if known is not None and known.calibrate_s:
        return known.calibrate_s * sample_tokens / 1000
    half = sample_tokens / 2
    return half / max(fp32, 1e-9) + CALIBRATION_PASSES * half / max(speed, 1e-9)


def choose_auto(
    job: Job,
    model_path: Path,
    table: pa.Table,
    *,
    rows: int | None,
    known: dict[str, Measured],
    unusable: dict[str, str],
) -> Auto:
    """Score the sample in fp32, then try each faster precision while it can pay for itself.

    ``rows``: how many rows the run will score (None: only the sample). ``known``: this
    machine's earlier measurements by precision; ``unusable``: precisions this model cannot run
    at all, and why (int8 without a Linear layer to quantize): neither is tried.
    """
    device = resolve_device(job.model.device)
    budget = trial_budget(job)
    reference = trial(job, model_path, "fp32", table=table, max_tokens=budget, timed=False)
    candidates = [p for p in available(device) if precision(p).gated and p not in unusable]
    if generates(job.model, model_path):
        candidates = [p for p in candidates if precision(p).generates]
    left_rows = max((rows if rows is not None else table.num_rows) - table.num_rows, 0)
    left_tokens = left_rows * reference.tokens_per_row
    best, best_speed = reference, reference.tokens_per_s
    lines = [reference.describe()]
    tried: dict[str, Trial] = {}
    unusable = dict(unusable)

    def guess(name: str) -> Outlook:
        return outlook(
            name,
            device,
            reference=reference,
            left_tokens=left_tokens,
            best_speed=best_speed,
            known=known.get(name),
        )

    for name in sorted(candidates, key=lambda n: -guess(n).speedup):
        weighed = guess(name)
        if not weighed.worth_trying:
            lines.append(weighed.describe())
            log.info("precision auto: %s", lines[-1], extra=DETAIL)
            continue
        try:
            candidate = trial(job, model_path, name, table=table, max_tokens=budget, timed=False)
        except QualityGateError as exc:  # int8's calibration could not keep the promise
            lines.append(f"{name}: fails the quality gate ({exc})")
            log.info("precision auto: %s", lines[-1], extra=DETAIL)
            continue
        except ModelError as exc:  # int8 found no Linear layer: the model's nature, kept
            lines.append(f"{name}: cannot run this model ({exc})")
            log.info("precision auto: %s", lines[-1], extra=DETAIL)
            unusable[name] = str(exc)
            continue
        candidate.agreement = judge(reference, candidate, job.quality)
        tried[name] = candidate
        lines.append(candidate.describe())
        log.info("quality gate: %s", lines[-1])
        if candidate.agreement.passed and candidate.tokens_per_s > best_speed:
            if best is not reference:
                best.unload()
            best, best_speed = candidate, candidate.tokens_per_s
        else:
            candidate.unload()
    if best is not reference:
        reference.unload()
    why = (
        f"for {left_rows + table.num_rows:,} rows, the fastest that passes the quality gate "
        "of fp32 and what could pay for itself: " + "; ".join(lines)
    )
    record = Chosen(
        best.precision,
        why,
        trials=tuple(lines),
        speeds={n: round(t.tokens_per_s, 1) for n, t in {"fp32": reference, **tried}.items()},
        measured={
            "sample_rows": table.num_rows,
            "agreement": best.agreement.metrics if best.agreement else None,
        },
    )
    return Auto(best, record, {n: measured(t, reference) for n, t in tried.items()}, unusable)
