"""What a job leaves to measurement, decided once per output folder before anything is scored.

- The quality gate: a precision other than fp32 scores the job's first distinct rows (repeats
  passed over: `batchscore.pipeline.stages.sample_rows`) next to fp32 and is refused when the
  two agree less than `[quality]` demands (see `batchscore.measure.gate`).
- ``precision = "auto"``: fp32 scores those rows first (the run keeps its results), and a faster
  precision the device runs natively is tried only where it can pay for itself on this job
  (see `batchscore.measure.auto`); the fastest that passes the gate is chosen.
- ``precision = "int8"``: which Linear layers may run in int8 is measured on those rows too,
  every time the model loads (see `batchscore.measure.load`); the gate then judges the result.
- ``max_tokens = "auto"``: the budget comes from the model's shape, probed once on a GPU
  (see `batchscore.measure.budget`).
- ``[embed].quantize = "int8"`` (or "uint8") without ``ranges``: each dimension's range is
  measured on those rows' vectors, at the chosen precision (see `batchscore.models.embed`).

The decision is recorded in the output folder, so a resumed run reuses it and one output never
mixes precisions; the run report carries it, reasons included. What a precision measured is
kept per machine (`batchscore.measure.cache`), so the next job weighs it by measurement
rather than by the device's guess.
"""

from __future__ import annotations

import dataclasses
import logging
from importlib.metadata import version
from pathlib import Path

import pyarrow as pa

from batchscore.errors import BookkeepingError, OutputConflictError, QualityGateError
from batchscore.job.ranges import Ranges
from batchscore.job.runtimes import OPENVINO, openvino_wanted
from batchscore.job.sections import Job
from batchscore.measure.auto import choose_auto, measured
from batchscore.measure.budget import choose_budget
from batchscore.measure.cache import DecisionCache, Entry, cache_key
from batchscore.measure.choose import choose_precision
from batchscore.measure.gate import Trial, trial
from batchscore.measure.load import job_sample, trial_budget
from batchscore.measure.rounds import evidence_key, kept_evidence, new_evidence, rounds
from batchscore.models.embed import calibrates, measured_ranges
from batchscore.models.tasks import generates
from batchscore.observe.progress import stage
from batchscore.output.checkpoint import Checkpoint, Damaged
from batchscore.output.contents import footer_precision, footer_ranges
from batchscore.output.manifest import footers
from batchscore.output.settled import Budget, Chosen, Decision
from batchscore.precision.table import available
from batchscore.runtime.device import resolve_device
from batchscore.storage.layout import SETTLED
from batchscore.work.units import Shard

log = logging.getLogger("batchscore")


def decide(
    job: Job,
    model_path: Path,
    recorded: Decision | None,
    sample: pa.Table | None = None,
    *,
    shards: list[Shard] | None = None,
    cache: DecisionCache | None = None,
    model_files: str = "",
    rows: int | None = None,
) -> tuple[Job, Decision | None, Trial | None]:
    """The job with "auto" settings made concrete and its precision gated.

    ``recorded`` is an earlier decision for this output, reused as is. Returns the concrete
    job, the new decision to record (None when there was nothing to decide) and the chosen
    trial, whose loaded model (and results for the sample) the local engine adopts instead of
    loading it again. ``sample``: the rows to measure on (in-memory data); by default the job's
    first distinct rows, read from ``shards`` (the input as the run listed it). ``rows``: how
    many rows the run will score, which decides whether a faster precision can repay trying it
    (None: the sample's). ``cache`` keeps what this machine measured (``model_files``: the
    model's digest, part of the key).
    """
    if recorded:
        check_recorded(job, recorded)
        if calibrates(job.options) and recorded.ranges is None:
            return calibrate(job, model_path, recorded, sample, shards)
        return concrete(job, recorded), None, None
    needs_budget = job.batching.max_tokens == "auto"
    wanted = job.model.precision
    if not decides(job):
        return job, None, None
    table = sample if sample is not None else job_sample(job, shards)
    if table.num_rows == 0:
        decision = nothing_to_measure(job)
        return concrete(job, decision), decision, None
    key = machine_key(job, model_files)
    entry = (cache.get(key) if cache is not None else None) or Entry()
    budget = trial_budget(job)
    seen = kept_evidence(entry, job)
    whole = calibrates(job.options)  # its ranges are measured on every sample row
    if wanted == "auto":
        first = rounds(job, table, seen, whole)
        what = f"quality gate: scoring {first} in fp32, then what can pay for itself"
        with stage(what, "quality gate done"):
            auto = choose_auto(
                job,
                model_path,
                table,
                rows=rows,
                known=entry.measured,
                unusable=entry.unusable,
                evidence=seen,
                whole=whole,
            )
        chosen, verdict = auto.chosen, auto.record
        if cache is not None:
            cache.learn(key, auto.measured, auto.unusable)
            cache.note(key, new_evidence(job, auto.gates, seen))
    elif wanted == "fp32":  # the budget or ranges to settle: the run adopts this model and results
        chosen = trial(job, model_path, "fp32", table=table, max_tokens=budget, timed=False)
        verdict = Chosen("fp32", "fp32 is the reference")
    else:
        what = f"quality gate: scoring {rounds(job, table, seen, whole)} in fp32 and {wanted}"
        try:
            with stage(what, "quality gate done"):
                gated = choose_precision(
                    job, model_path, table, evidence=seen.get(wanted), whole=whole
                )
        except QualityGateError:  # refused: the next run of the job scores the whole gate
            if cache is not None:
                cache.note(key, {evidence_key(job, wanted): None})
            raise
        chosen = gated.chosen
        speeds = {"fp32": gated.reference.tokens_per_s, wanted: chosen.tokens_per_s}
        verdict = dataclasses.replace(
            gated.record, speeds={n: round(v, 1) for n, v in speeds.items()}
        )
        if cache is not None:
            cache.learn(key, {wanted: measured(chosen, gated.reference)})
            if gated.gated is not None:
                cache.note(key, new_evidence(job, {wanted: gated.gated}, seen))
    budget_choice = None
    if needs_budget:
        budget_choice = choose_budget(
            chosen,
            model_path,
            table,
            max_length=job.model.max_length,
            batching=job.batching,
            generates=generates(job.model, model_path),
        )
        log.info("max_tokens = auto: %s", budget_choice.why)
    ranges = measured_ranges(chosen.task) if calibrates(job.options) else None
    decision = Decision(verdict, budget_choice, ranges)
    return concrete(job, decision), decision, chosen


def learn(
    cache: DecisionCache | None,
    job: Job,
    decision: Decision | None,
    *,
    model_files: str,
    padded_tokens: int,
    busy_s: float,
) -> None:
    """After a run at a faster precision whose gate timed fp32 beside it, keep the run's own
    ratio to fp32: measured over the job's batches, far longer than the gate's pass, so a ratio
    the cache holds from a busy moment is corrected by the next run that sees otherwise."""
    if cache is None or decision is None or busy_s < 1.0:
        return
    name, fp32 = decision.precision.precision, decision.precision.speeds.get("fp32")
    key = machine_key(job, model_files)
    kept = cache.get(key)
    before = kept.measured.get(name) if kept is not None else None
    if name == "fp32" or not fp32 or before is None:
        return
    speedup = round(padded_tokens / busy_s / fp32, 3)
    if abs(speedup - before.speedup) > 0.02 * before.speedup:
        log.debug("precision %s: %.2fx fp32 in this run, %.2fx kept", name, speedup, before.speedup)
        cache.learn(key, {name: dataclasses.replace(before, speedup=speedup)})


def calibrate(
    job: Job,
    model_path: Path,
    recorded: Decision,
    sample: pa.Table | None,
    shards: list[Shard] | None,
) -> tuple[Job, Decision | None, Trial | None]:
    """A folder settled with no row to measure on (`nothing_to_measure`) whose job quantizes
    to int8 or uint8: its ranges are measured now, on the first rows there are, at the
    precision it settled on, and recorded with the rest of its decision at the next commit."""
    settled = concrete(job, recorded)
    table = sample if sample is not None else job_sample(job, shards)
    if table.num_rows == 0:  # still nothing: no row will be scored either
        return settled, None, None
    precision = settled.model.precision
    with stage(f"measuring each dimension's range on {table.num_rows} rows", "ranges measured"):
        chosen = trial(
            settled,
            model_path,
            precision,
            table=table,
            max_tokens=trial_budget(settled),
            timed=False,
        )
    decision = dataclasses.replace(recorded, ranges=measured_ranges(chosen.task))
    return concrete(job, decision), decision, chosen


def nothing_to_measure(job: Job) -> Decision:
    """The decision for a job none of whose rows passes `where` (or whose shards are empty):
    no row is scored, so there is nothing to gate or time; "auto" settles on fp32."""
    name = "fp32" if job.model.precision == "auto" else job.model.precision
    why = "no input row to measure on (every shard empty, or none passes [input].where)"
    budget = Budget(trial_budget(job), why) if job.batching.max_tokens == "auto" else None
    return Decision(Chosen(name, why), budget)


def machine_key(job: Job, model_files: str) -> str:
    """What a cached decision depends on (see `batchscore.measure.cache`): a precision's speed
    depends on the runtime it loads on, so OpenVINO's version and the precisions it runs are
    part of it where it runs (a decision timed with bf16 on torch is not bf16 on OpenVINO's)."""
    device = resolve_device(job.model.device)
    cpu = device.type == "cpu"
    ported = [p for p in OPENVINO.precisions if openvino_wanted(job.model, cpu=cpu, precision=p)]
    runtime = f"openvino {version('openvino')} ({', '.join(ported)})" if ported else ""
    return cache_key(
        model_files=model_files,
        task=job.model.task,
        max_length=job.model.max_length,
        device=device,
        runtime=runtime,
    )


def recorded_decision(ckpt: Checkpoint, job: Job) -> Decision | None:
    """The decision an earlier run recorded for this output, as its committed data files prove
    it (`proven_decision`; None when there is none to keep to). A record rebuilt or corrected
    from the footers is said (a warning naming the file and what differed) and written back."""
    files = [record["file"] for record in ckpt.committed().values()]
    decision, said = proven_decision(ckpt, job, files)
    if said:
        log.warning("%s", said)
        ckpt.settle(decision)
    return decision


def proven_decision(ckpt: Checkpoint, job: Job, files: list[str]) -> tuple[Decision | None, str]:
    """The folder's decision as the footers of its committed data ``files`` prove it, and what
    the record got wrong ('' when nothing): `run` keeps to it, `status` reports it.

    Every data file's footer names the precision it was scored at and the ranges its vectors
    were quantized with, so the footers, not ``settled.json``, are the proof of how committed
    rows were made; the record is a note of it. A damaged or missing record is rebuilt from
    them. An edited one (its precision or ranges changed by hand) is answered the same way:
    the footers' are taken and the record written back, with a warning naming the file and
    what differed. Refusing instead would stop a scheduled run only for a person to delete
    the record, after which the next run recovers it from the footers all the same; and
    following the edit would write a second precision or int8 scale beside the first, which
    no reader of the folder could tell apart. A change of precision or ranges is a new output
    (``--restart``). Footers that disagree with each other prove nothing: `BookkeepingError`
    (exit 10), and the run stops rather than add to a folder that already mixes two.
    """
    if not ckpt.claimed():
        return None, ""
    where = ckpt.store.where(SETTLED)
    try:
        recorded, record = ckpt.settled(), where  # ``record``: the record, as messages name it
    except Damaged as exc:
        recorded, record = None, str(exc)
    missing = recorded is None and record == where
    if missing:
        if not decides(job):
            return None, ""  # nothing was ever recorded for this job: nothing is missing
        record = f"{where}: missing"
    written = footers(ckpt.store, files)
    precision = footer_precision(written, record)
    ranges = footer_ranges(written, record)
    if recorded is None:
        if precision is None and missing:
            return None, ""  # nothing committed says otherwise: it is measured anew
        if precision is None:
            raise BookkeepingError(
                f"{record}; the data files do not prove one precision. Run with --restart to "
                "start over, or point [output].path at a new folder"
            )
        how = "missing" if missing else "damaged"
        why = f"recovered from the data files' footers (the recorded decision was {how})"
        auto = job.batching.max_tokens == "auto"  # only speed depends on it
        budget = Budget(trial_budget(job), why) if auto else None
        return Decision(Chosen(precision, why), budget, ranges), f"{record}; {why}"
    wrong = []
    chosen, kept = recorded.precision, recorded.ranges
    if precision is not None and precision != chosen.precision:
        wrong.append(f"precision {chosen.precision} recorded, {precision} in the data files")
        why = f"taken back from the data files' footers (the record said {chosen.precision})"
        chosen = dataclasses.replace(chosen, precision=precision, why=why)
    if calibrates(job.options) and ranges is not None and ranges != kept:
        wrong.append(f"ranges {ranges_difference(kept, ranges)}")
        kept = ranges
    if not wrong:
        return recorded, ""
    said = (
        f"{where}: {'; '.join(wrong)}. The footers of the {len(files)} committed data file(s) "
        "prove how their rows were made, and one output never mixes two: theirs are kept, and "
        "recorded again by the next run that scores (new ranges or a new precision need "
        "--restart)"
    )
    return dataclasses.replace(recorded, precision=chosen, ranges=kept), said


def decides(job: Job) -> bool:
    """Whether `settle` records a decision for this job: anything left to measure."""
    wanted, budget = job.model.precision, job.batching.max_tokens
    return wanted != "fp32" or budget == "auto" or calibrates(job.options)


def ranges_difference(recorded: Ranges | None, found: Ranges) -> str:
    """Where a record's ranges first differ from the footers', briefly (not 768 numbers)."""
    if recorded is None:
        return "missing from the record, named in the data files"
    if len(recorded[0]) != len(found[0]):
        return f"of {len(recorded[0])} dimensions recorded, {len(found[0])} in the data files"
    for bound, name in ((0, "minimum"), (1, "maximum")):
        for dim, (ours, theirs) in enumerate(zip(recorded[bound], found[bound], strict=True)):
            if ours != theirs:
                return (
                    f"at dimension {dim} (from 0): {name} {ours!r} recorded, {theirs!r} in the "
                    "data files"
                )
    return "unlike the data files'"


def concrete(job: Job, decision: Decision) -> Job:
    """Apply a decision's precision, budget and ranges (and an accepted gate failure) to the
    job: every load of the job (the run's, a Ray actor's) then quantizes with those ranges."""
    model = dataclasses.replace(job.model, precision=decision.precision.precision)
    batching, quality, options = job.batching, job.quality, job.options
    if decision.ranges is not None and calibrates(options):
        options = dataclasses.replace(options, ranges=decision.ranges)
    if decision.batching is not None:
        batching = dataclasses.replace(batching, max_tokens=decision.batching.max_tokens)
    if decision.precision.accepted:
        quality = dataclasses.replace(quality, accept=True)
    return dataclasses.replace(
        job, model=model, batching=batching, quality=quality, options=options
    )


def check(
    job: Job, model_path: Path, *, cache: DecisionCache | None, model_files: str, refresh: bool
) -> tuple[Chosen, bool, Entry | None]:
    """`batchscore check`: the gate on the job's rows, without recording or scoring; for "auto",
    every precision the device runs natively, each timed. What was kept for this model before
    is returned beside it (None with ``refresh``, which forgets it), and the measurement
    replaces it."""
    table = job_sample(job)
    quality = dataclasses.replace(job.quality, accept=True)  # measure, whatever it shows
    batching = dataclasses.replace(job.batching, max_tokens=trial_budget(job))  # not timed here
    measuring = dataclasses.replace(job, quality=quality, batching=batching)
    key = machine_key(job, model_files)
    before = cache.get(key) if cache is not None and not refresh else None
    gated = choose_precision(measuring, model_path, table)
    if cache is not None:
        tried = {n: measured(t, gated.reference) for n, t in gated.tried.items() if t.rows}
        if refresh:
            cache.put(key, Entry(tried))
        else:
            cache.learn(key, tried)
    chosen = gated.chosen
    passed = chosen.agreement is None or chosen.agreement.passed
    return gated.record, passed, before


def check_recorded(job: Job, decision: Decision) -> None:
    """A folder settled at a precision this device cannot run (int8 resumed on a GPU, fp16
    back on a CPU) is the folder's conflict with this machine, not a job key's mistake."""
    name = decision.precision.precision
    if job.engine != "local":  # Ray's actors may sit on other machines: they check for themselves
        return
    device = resolve_device(job.model.device)
    if name not in available(device):
        raise OutputConflictError(
            f"{job.output.path}: its first run settled on precision {name}, and this machine's "
            f"{device} does not run {name} (it runs {', '.join(available(device))}); one output "
            f"never mixes precisions, so resume it where {name} runs, or run with --restart to "
            "score it all again here"
        )
