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
mixes precisions; the run report carries it, reasons included. What "auto" timed is also kept
per machine (`batchscore.precision.cache`), so a new output folder pays only the gate.
"""

from __future__ import annotations

import dataclasses
import logging
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchscore.errors import BookkeepingError, QualityGateError
from batchscore.job.sections import Job
from batchscore.observe.progress import stage
from batchscore.output.checkpoint import Checkpoint, Damaged
from batchscore.output.manifest import written_for
from batchscore.pipeline.executor import resolve_device
from batchscore.pipeline.runtimes import ON_OPENVINO, openvino_wanted
from batchscore.pipeline.stages import sample_rows
from batchscore.precision.cache import DecisionCache, cache_key
from batchscore.precision.choose import choose_budget, choose_precision
from batchscore.precision.gate import Trial
from batchscore.precision.load import convertible, trial_budget

log = logging.getLogger("batchscore")


def settle(
    job: Job,
    model_path: Path,
    recorded: dict[str, Any] | None,
    sample: pa.Table | None = None,
    *,
    cache: DecisionCache | None = None,
    model_files: str = "",
    rows: int | None = None,
) -> tuple[Job, dict[str, Any] | None, Trial | None]:
    """The job with "auto" settings made concrete and its precision gated.

    ``recorded`` is an earlier decision for this output, reused as is. What "auto" times (which
    precision is fastest, which budget) comes from ``cache`` when this machine measured it
    before for this model (``model_files``: its digest), task and window; the gate still runs
    here, on this job's rows. Returns the concrete job, the new decision to record (None when
    there was nothing to decide) and the chosen trial, whose loaded model the local engine
    adopts instead of loading (and calibrating) it again. ``sample``: the rows to measure on
    (in-memory data); by default the job's first rows. ``rows``: how many rows the run will
    score, so that a cached "auto" weighs what gating a faster precision costs against what it
    saves on this many rows (a small job is done in fp32 before int8's gate would be).
    """
    if recorded:
        return concrete(job, recorded), None, None
    needs_budget = job.batching.max_tokens == "auto"
    if job.model.precision == "fp32" and not needs_budget:
        return job, None, None
    table = sample if sample is not None else sample_rows(job, job.quality.sample_rows)
    key = machine_key(job, model_files)
    cached = cache.get(key) if cache is not None else None
    if cached is not None:
        settled = from_cache(job, model_path, table, cached, rows=rows)
        if settled is not None:
            return settled
    wanted = job.model.precision
    what = "fp32 and every faster precision" if wanted == "auto" else f"fp32 and {wanted}"
    with stage(f"quality gate: scoring {table.num_rows} rows in {what}", "quality gate done"):
        chosen, decision = choose_precision(job, model_path, table)
    decision = {"precision": decision}
    if needs_budget:
        with stage("max_tokens = auto: timing batch budgets", "budgets timed"):
            decision["batching"] = choose_budget(job, chosen, table)
        log.info("max_tokens = auto: %s", decision["batching"]["why"])
    if cache is not None:
        remember(cache, key, decision, cached)
    return concrete(job, decision), decision, chosen


def machine_key(job: Job, model_files: str) -> str:
    """What a cached decision depends on (see `batchscore.precision.cache`): a precision's speed
    depends on the runtime it loads on, so OpenVINO's version and the precisions it runs are
    part of it where it runs (a decision timed with bf16 on torch is not bf16 on OpenVINO's)."""
    device = resolve_device(job.model.device)
    cpu = device.type == "cpu"
    ported = [name for name in ON_OPENVINO if openvino_wanted(job.model, cpu=cpu, precision=name)]
    runtime = f"openvino {version('openvino')} ({', '.join(ported)})" if ported else ""
    return cache_key(
        model_files=model_files, task=job.model.task, max_length=job.model.max_length,
        device=device, runtime=runtime,
    )  # fmt: skip


def fp32_on_openvino(job: Job) -> bool:
    """Whether this job's fp32 loads go to OpenVINO (see `batchscore.pipeline.runtimes`)."""
    cpu = resolve_device(job.model.device).type == "cpu"
    return openvino_wanted(job.model, cpu=cpu, precision="fp32")


def remember(
    cache: DecisionCache, key: str, decision: dict[str, Any], cached: dict[str, Any] | None
) -> None:
    """Keep what was timed: the fastest precision that passed (when "auto" chose one) and the
    budget timed for the chosen precision."""
    entry = dict(cached or {})
    chosen = decision["precision"]
    if chosen.get("why", "").startswith("the fastest"):
        entry.update(precision=chosen["precision"], trials=chosen["trials"])
        entry.update(speeds=chosen.get("speeds", {}), sample_rows=chosen.get("sample_rows"))
    if "batching" in decision:
        entry.setdefault("budgets", {})[chosen["precision"]] = decision["batching"]
    if entry:
        cache.put(key, entry)


def from_cache(
    job: Job, model_path: Path, table: pa.Table, cached: dict[str, Any], rows: int | None = None
) -> tuple[Job, dict[str, Any], Trial | None] | None:
    """The decision this machine measured before, gated on this job's rows; None when the
    cache lacks a part of it, or (for "auto") its precision fails this job's gate. For "auto"
    and a known number of ``rows`` to score, the precision expected to finish first is chosen
    instead (`soonest`): fp32 runs ungated, any other is gated here."""
    auto = job.model.precision == "auto"
    name = cached.get("precision") if auto else job.model.precision
    when = f"cached on this machine ({cached.get('measured_at', 'earlier')})"
    sooner = ""
    if auto and name not in (None, "fp32") and rows is not None:
        name, sooner = soonest(job, cached, name, rows, table.num_rows)
    budgets = cached.get("budgets", {})
    budget = budgets.get(name)
    if budget is None and sooner:  # chosen by expectation: the budget timed for the cache's choice
        budget = budgets.get(cached.get("precision"))
    if name is None or (job.batching.max_tokens == "auto" and budget is None):
        return None
    chosen = None
    if name == "fp32":
        verdict = {"precision": "fp32", "why": "fp32 is the reference"}
    else:
        fixed = dataclasses.replace(job, model=dataclasses.replace(job.model, precision=name))
        try:
            with stage(f"quality gate: scoring {table.num_rows} rows in fp32 and {name}",
                       "quality gate done"):  # fmt: skip
                chosen, verdict = choose_precision(fixed, model_path, table)
        except QualityGateError as exc:
            if not auto:
                raise
            log.info("%s: %s fails the quality gate on this job's rows (%s); measuring again",
                     when, name, exc)  # fmt: skip
            return None
    if auto:
        trials = "; ".join(cached.get("trials", []))
        gated = verdict["why"] if chosen is None else f"on this job's rows: {verdict['why']}"
        why = f"{when}, the fastest that passed of: {trials}; {sooner}{gated}"
        verdict = {**verdict, "trials": cached.get("trials", []), "cached": True, "why": why}
    elif chosen is None:
        verdict["why"] = f"{when}: {verdict['why']}"
    decision: dict[str, Any] = {"precision": verdict}
    if budget is not None and job.batching.max_tokens == "auto":
        decision["batching"] = {**budget, "why": f"{when}: {budget['why']}"}
    log.info("precision %s: %s", name, verdict["why"])
    return concrete(job, decision), decision, chosen


def soonest(
    job: Job, cached: dict[str, Any], fastest: str, rows: int, sample: int
) -> tuple[str, str]:
    """Of fp32 and every precision that passed when this machine measured them, the one a
    run of ``rows`` rows is expected to finish first with (`expected_s`), and why; ``fastest``
    (the cache's choice) and no reason when the cache lacks the speeds. A faster precision
    whose gate costs more (int8's calibration) pays for itself only on a larger job."""
    adopts = job.engine == "local"  # the gate's model, and its results for the sample
    compiled = job.model.compile or fp32_on_openvino(job)  # the fp32 model's, for `convertible`
    expected: dict[str, tuple[float, float]] = {}
    for name in cached.get("speeds", {}):
        if name == "fp32":
            continue
        converts = convertible(name, compiled=compiled)
        fp32_s, other_s, gate_s = expected_s(
            cached, name, rows, sample, converts=converts, adopts=adopts
        )
        if fp32_s is not None:
            expected.update({"fp32": (fp32_s, 0.0), name: (other_s, gate_s)})
    if not expected:
        return fastest, ""
    first = min(expected, key=lambda name: expected[name][0])  # fp32 first: it wins a tie
    times = ", ".join(
        f"{name} in {total:.1f} s" + (f" ({gate:.1f} s of it its quality gate)" if gate else "")
        for name, (total, gate) in expected.items()
    )
    return first, f"for {rows:,} rows, {first} is expected to finish first: {times}; "


def expected_s(
    cached: dict[str, Any],
    name: str,
    rows: int,
    sample: int,
    *,
    converts: bool = False,
    adopts: bool = False,
) -> tuple[float | None, float, float]:
    """Seconds a run of ``rows`` rows is expected to take at fp32 and at ``name``, and the part
    of the latter that is ``name``'s quality gate, from this machine's cached speeds: fp32 loads
    once and scores the rows; ``name`` first scores the sample in fp32 and in ``name`` (its own
    load and calibration included; only the calibration when the fp32 model ``converts`` in
    place), then the rows, less the sample where the run ``adopts`` the gate's model and its
    results (`batchscore.pipeline.known`). (None, 0, 0) when the cache lacks a speed."""
    speeds = cached.get("speeds", {})
    if "fp32" not in speeds or name not in speeds:
        return None, 0.0, 0.0
    fp32, other = speeds["fp32"], speeds[name]
    scale = sample / max(cached.get("sample_rows") or sample, 1)  # a pass costs per row
    own = max(other["load_s"] - fp32["load_s"], 0.0) if converts else other["load_s"]
    gate_s = fp32["load_s"] + scale * fp32["cold_s"] + own + scale * other["cold_s"]
    fp32_s = fp32["load_s"] + rows / max(fp32["rows_per_s"], 1e-9)
    left = max(rows - sample, 0) if adopts else rows
    return fp32_s, gate_s + left / max(other["rows_per_s"], 1e-9), gate_s


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


def check(
    job: Job, model_path: Path, *, cache: DecisionCache | None, model_files: str, refresh: bool
) -> tuple[dict[str, Any], bool]:
    """`batchscore check`: the gate on the job's rows, without recording or scoring. For
    "auto", this machine's cached table is shown and its choice gated, unless ``refresh`` (or
    no cache): then every precision is measured again and the cache updated."""
    table = sample_rows(job, job.quality.sample_rows)
    quality = dataclasses.replace(job.quality, accept=True)  # measure, whatever it shows
    batching = dataclasses.replace(job.batching, max_tokens=trial_budget(job))  # not timed here
    measuring = dataclasses.replace(job, quality=quality, batching=batching)
    key = machine_key(job, model_files)
    cached = cache.get(key) if cache is not None and not refresh else None
    settled = from_cache(measuring, model_path, table, cached) if cached else None
    if settled is not None:
        _, decision, chosen = settled
        decision = decision["precision"]
    else:
        chosen, decision = choose_precision(measuring, model_path, table)
        if cache is not None and job.model.precision == "auto":
            remember(cache, key, {"precision": decision}, cache.get(key))
    passed = chosen is None or chosen.agreement is None or chosen.agreement.passed
    return decision, passed
