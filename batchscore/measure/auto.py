"""``precision = "auto"``: fp32 first, then only what can pay for itself on this job.

The quality gate needs fp32's results on the job's first rows whatever precision is chosen, so
fp32 scores them first. That pass is the run's own work (the run adopts its model and its
results when fp32 stays) and it times fp32 on this machine, now, whatever else the machine is
doing. A faster precision is then tried only where what it is expected to save on the rest of
this job exceeds what trying it costs (its load, int8's whole calibration and its own pass over
the sample), and trying it keeps measuring within a tenth of the job's time however it turns
out (`batchscore.measure.spend`), the one with the most to gain first. Before it is tried its
speed is a guess, as a multiple of fp32's: the ratio this machine measured for the model before
(`batchscore.measure.cache`), else what the device's units promise (`Precision.speedup`). Once
tried, it is judged by the gate and by its measured speed, and what it measured (its speed, its
load) replaces the guesses for the rest of the choice.

A few hundred rows are therefore scored in fp32 with nothing measured beyond the gate's own
pass; a large job tries bf16 or int8 and keeps the one that is faster and passes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchscore.errors import ModelError, QualityGateError
from batchscore.job.sections import Job
from batchscore.measure.budget import model_shape
from batchscore.measure.cache import Evidence, Measured
from batchscore.measure.gate import Trial, trial
from batchscore.measure.load import trial_budget
from batchscore.measure.rounds import Gated, first_rows, gate_in_rounds
from batchscore.measure.spend import Ledger, Prospect, next_to_try, weigh
from batchscore.models.tasks import generates
from batchscore.output.settled import Chosen
from batchscore.precision.int8 import search_passes
from batchscore.precision.table import available, precision
from batchscore.runtime.device import resolve_device

# the lines of the choice are said again in the run's precision line: here with -v only
DETAIL = {"detail": True}
log = logging.getLogger("batchscore")
OPENVINO_GAIN = 1.2  # OpenVINO's fp32 over torch's, per token (1.14-1.3x, BENCHMARKS.md)
SEARCH_LAYERS = 64  # Linear layers int8's search is weighed for where the config does not say


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
    gates: dict[str, Gated] = field(default_factory=dict)  # how the gate concluded on each


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
    name: str,
    sample_tokens: float,
    *,
    fp32: float,
    speedup: float,
    runtime: str,
    layers: int | None,
    known: Measured | None,
    worst: bool = False,
) -> float:
    """Seconds ``name``'s calibration is expected to take on the gate's sample (none for a
    precision that needs none); ``worst``: the most it can take.

    As measured here before, where it was; else counted from the passes it runs (see
    `batchscore.precision.int8`), each over half the sample in torch (``fp32`` is the
    reference's padded tokens/s on ``runtime``): the fp32 pass that records each Linear's inputs
    and the all-int8 pass with each layer's float twin beside it always run; the search
    (`search_passes` mixed passes) and the all-float pass run only where the all-int8 pass
    misses the target. Whether it will is not known before it runs: expected, the search is a
    coin's toss (half its passes); at worst it runs whole, and the all-float pass after it.
    What a candidate is expected to save is weighed against the expected cost; whether trying
    it fits the spending rule, against the worst (`batchscore.measure.spend`)."""
    if not precision(name).calibrated:
        return 0.0
    if known is not None and known.calibrate_s:
        return known.calibrate_s * sample_tokens / 1000
    torch_fp32 = fp32 / OPENVINO_GAIN if runtime == "openvino" else fp32
    int8 = torch_fp32 * speedup
    half = sample_tokens / 2
    always = 2 / torch_fp32 + 1 / int8  # the fp32 pass; the int8 pass and its float twins
    search = search_passes(layers or SEARCH_LAYERS) * 2 / (torch_fp32 + int8)  # mixed passes
    if worst:
        return half * (always + search + 1 / torch_fp32)  # and the all-float one
    return half * (always + search / 2)


def prospects(
    names: list[str],
    device: Any,
    *,
    reference: Trial,
    sample_tokens: float,
    known: dict[str, Measured],
    layers: int | None,
) -> list[Prospect]:
    """Each candidate as it is expected to run, before it is tried: what this machine
    measured for it before, else the device's promise, fp32's load as just measured and the
    whole calibration."""
    found = []
    for name in names:
        was = known.get(name)
        speedup = was.speedup if was else guessed_speedup(name, device, reference)

        def calibration(worst: bool, name: str = name, speedup: float = speedup) -> float:
            return calibration_s(
                name,
                sample_tokens,
                fp32=reference.tokens_per_s,
                speedup=speedup,
                runtime=reference.runtime,
                layers=layers,
                known=known.get(name),
                worst=worst,
            )

        load = was.load_s if was else reference.load_s
        found.append(
            Prospect(name, speedup, load, calibration(False), calibration(True), was is None)
        )
    return found


def choose_auto(
    job: Job,
    model_path: Path,
    table: pa.Table,
    *,
    rows: int | None,
    known: dict[str, Measured],
    unusable: dict[str, str],
    evidence: dict[str, Evidence] | None = None,
    whole: bool = False,
) -> Auto:
    """Score the sample's first round in fp32, then try faster precisions while one pays for
    itself within the spending rule (`batchscore.measure.spend`), the most promising first,
    each gated in rounds (`batchscore.measure.rounds`).

    ``rows``: how many rows the run will score (None: only the sample). ``known``: this
    machine's earlier measurements by precision; ``unusable``: precisions this model cannot run
    at all, and why (int8 without a Linear layer to quantize): neither is tried.
    ``evidence``: what the gate saw of each precision on this job before; ``whole``: the job
    needs every sample row scored.
    """
    device = resolve_device(job.model.device)
    budget = trial_budget(job)
    evidence = evidence or {}
    candidates = [p for p in available(device) if precision(p).gated and p not in unusable]
    if generates(job.model, model_path):
        candidates = [p for p in candidates if precision(p).generates]
    warm = any(name in evidence for name in candidates)
    first = first_rows(job.quality, table.num_rows, warm=warm, whole=whole)
    reference = trial(
        job, model_path, "fp32", table=table, max_tokens=budget, timed=False, rows=first
    )
    left_rows = max((rows if rows is not None else reference.rows) - reference.rows, 0)
    sample_tokens = reference.tokens_per_row * reference.rows
    shape = model_shape(model_path)
    waiting = prospects(
        candidates,
        device,
        reference=reference,
        sample_tokens=reference.tokens_per_row * table.num_rows,  # int8 calibrates on half
        known=known,
        layers=shape.linear_layers if shape else None,
    )
    ledger = Ledger(
        fp32_speed=reference.tokens_per_s,
        own_s=reference.load_s + reference.cold_s,
        sample_tokens=sample_tokens,
        left_tokens=left_rows * reference.tokens_per_row,
    )
    best = reference
    lines = [reference.describe()]
    tried: dict[str, Trial] = {}
    gates: dict[str, Gated] = {}
    unusable = dict(unusable)
    overrun = 0.0  # the most a trial cost over the worst case it was admitted on
    while waiting:
        weighed, others = next_to_try(waiting, ledger)
        if weighed is None:
            break
        waiting = [w.prospect for w in others]
        name, worst = weighed.prospect.name, ledger.cost_s(weighed.prospect, worst=True)
        started = time.perf_counter()
        try:
            candidate = trial(
                job, model_path, name, table=table, max_tokens=budget, timed=False, rows=first
            )
        except (QualityGateError, ModelError) as exc:
            # the gate: int8's calibration could not keep the promise; the model: int8 found no
            # Linear layer, the model's nature, kept so later jobs do not try again
            gate = isinstance(exc, QualityGateError)
            lines.append(
                f"{name}: {'fails the quality gate' if gate else 'cannot run this model'} ({exc})"
            )
            log.info("precision auto: %s", lines[-1], extra=DETAIL)
            if not gate:
                unusable[name] = str(exc)
            spent = time.perf_counter() - started
            overrun = max(overrun, spent - worst)
            ledger = ledger.after(won=False, cost_s=spent)
            continue
        widened = reference.cold_s  # fp32's further rounds are this trial's cost too
        gates[name] = gate_in_rounds(
            reference, candidate, table, job.quality, evidence=evidence.get(name), whole=whole
        )
        tried[name] = candidate
        lines.append(candidate.describe())
        log.info("quality gate: %s", lines[-1], extra=DETAIL)
        won = candidate.agreement.passed and candidate.tokens_per_s > best.tokens_per_s
        cost = candidate.load_s + candidate.cold_s + reference.cold_s - widened
        calibrated_over = candidate.calibrate_s - weighed.prospect.calibrate_max_s
        overrun = max(overrun, cost - worst, calibrated_over)
        ledger = ledger.after(
            won=won,
            speedup=candidate.tokens_per_s / max(reference.tokens_per_s, 1e-9),
            cost_s=cost,
            calibrate_s=candidate.calibrate_s,
        )
        if won:
            if best is not reference:
                best.unload()
            best = candidate
        else:
            candidate.unload()
        # what this run measured replaces the guesses: a load here took this long
        waiting = [measured_load(p, candidate.load_s - candidate.calibrate_s) for p in waiting]
    for weighed in sorted((weigh(p, ledger) for p in waiting), key=lambda w: -w.net_s):
        lines.append(weighed.describe())
        log.info("precision auto: %s", lines[-1], extra=DETAIL)
    if best is not reference:
        reference.unload()
    why = (
        f"for {left_rows + reference.rows:,} rows, the fastest that passes the quality gate "
        "of fp32 and what could pay for itself: " + "; ".join(lines)
    )
    record = Chosen(
        best.precision,
        why,
        trials=tuple(lines),
        speeds={n: round(t.tokens_per_s, 1) for n, t in {"fp32": reference, **tried}.items()},
        measured={
            "sample_rows": best.rows,
            "agreement": best.agreement.metrics if best.agreement else None,
            **({"gate": gates[best.precision].record()} if best.precision in gates else {}),
            # what measuring may take, took, and took beyond its trials' worst cases: the
            # rule keeps spent_s <= budget_s + overrun_s (docs/precision.md)
            "spending": {
                "budget_s": round(ledger.budget_s, 3),
                "spent_s": round(ledger.sunk_s, 3),
                "overrun_s": round(overrun, 3),
            },
        },
    )
    return Auto(
        best, record, {n: measured(t, reference) for n, t in tried.items()}, unusable, gates
    )


def measured_load(prospect: Prospect, load_s: float) -> Prospect:
    """``prospect`` with a load guessed from one this run measured (unless its own was known)."""
    if not prospect.guessed:
        return prospect
    return dataclasses.replace(prospect, load_s=max(prospect.load_s, load_s))
