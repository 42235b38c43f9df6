"""What a job leaves to measurement, decided once per output folder before anything is scored.

- The quality gate: a precision other than fp32 scores the job's first rows next to fp32 and is
  refused when the two agree less than `[quality]` demands (see `batchscore.quality`).
- ``precision = "auto"``: every precision the device runs natively is timed on those rows, and
  the fastest one that passes the gate is chosen.
- ``precision = "int8"``: which Linear layers may run in int8 is measured on those rows too,
  every time the model loads (see `batchscore.quantize`); the gate then judges the result.
- ``max_tokens = "auto"``: batch budgets are timed on those rows (with the chosen precision),
  and the fastest that fits in memory is chosen.

The decision is recorded in the output folder, so a resumed run reuses it and one output never
mixes precisions; the run report carries it, reasons included.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from batchscore.config import Job
from batchscore.errors import ModelError, QualityGateError
from batchscore.executor import Executor, fast_precisions, resolve_device
from batchscore.models import Encoded, Task, generates, input_kinds, load_task
from batchscore.quality import Agreement, measure
from batchscore.quantize import quantize_int8
from batchscore.reader import find_shards, iter_batches, open_shard
from batchscore.sampler import restore
from batchscore.scoring import cut, is_out_of_memory

log = logging.getLogger("batchscore")
TRIAL_BUDGET = 8192  # budget for timing precisions when max_tokens is itself "auto"
BUDGETS = {"cpu": (2048, 4096, 8192, 16384), "cuda": (8192, 16384, 32768, 65536, 131072)}


@dataclass
class Trial:
    """One precision scored on the sample: its results, speed and agreement with fp32."""

    precision: str
    columns: dict[str, pa.Array]
    seconds: float
    rows: int
    task: Task | None
    executor: Executor | None
    agreement: Agreement | None = None

    def unload(self) -> None:
        """Let go of the model (its results and timing stay)."""
        self.task = self.executor = None

    @property
    def rows_per_s(self) -> float:
        return self.rows / max(self.seconds, 1e-9)

    def describe(self) -> str:
        quality = f", {self.agreement.describe()}" if self.agreement else ""
        return f"{self.precision}: {self.rows_per_s:,.1f} rows/s{quality}"


def sample_rows(job: Job, rows: int) -> pa.Table:
    """The job's first ``rows`` input rows (only the columns it reads), across shards in order."""
    columns = list(
        dict.fromkeys([*job.input.carried, *input_kinds(job.model.task, job.input, job.task)])
    )
    parts, count = [], 0
    for shard in find_shards(job.input):
        pf = open_shard(shard)
        groups = list(range(pf.metadata.num_row_groups))
        for batch in iter_batches(pf, shard, groups, tuple(columns), rows):
            parts.append(batch.slice(0, rows - count))
            count += parts[-1].num_rows
            if count >= rows:
                return pa.Table.from_batches(parts)
    return pa.Table.from_batches(parts) if parts else pa.table({c: [] for c in columns})


def load(job: Job, model_path: Path, executor: Executor, table: pa.Table | None = None) -> Task:
    """Load the job's task; at int8, quantize it on half of ``table`` (the gate's sample rows).

    The calibration is deterministic, so every load of one job (the gate's trial, the run, each
    Ray replica) picks the same layers.
    """
    model = dataclasses.replace(job.model, precision=executor.precision)
    task = load_task(model_path, model, job.task, job.input, executor)
    if executor.precision == "int8":
        if generates(model, model_path):
            raise ModelError(
                f'[model].precision: "int8" measures quality by comparing output vectors, and '
                f"{model_path} generates text; use fp32 or bf16 for generation"
            )
        if table is None:
            table = sample_rows(job, job.quality.sample_rows)
        # Every other row: the gate then measures on the whole sample, half of it unseen here.
        table = table.take(np.arange(0, table.num_rows, 2))
        budget = job.batching.max_tokens
        quantize(job, task, executor, table, budget if isinstance(budget, int) else TRIAL_BUDGET)
    return task


def planned(job: Job, task: Task, table: pa.Table, budget: int) -> tuple[Encoded, list[np.ndarray]]:
    """The sample's rows, encoded and cut into batches as a window of the run would be."""
    encoded = task.encode(table)
    sizes = encoded.lengths + encoded.reserve
    return encoded, cut(sizes, np.arange(len(sizes)), budget, job.batching.max_rows, task.bucketing)


def quantize(job: Job, task: Task, executor: Executor, table: pa.Table, budget: int) -> None:
    """Swap the model's Linear layers for int8 ones, keeping in float those the rows need.

    The calibration compares each row's output vector with fp32's by cosine, against
    `[quality].min_cosine`; a one-number output (a regressor) is compared batch-wide instead,
    since the cosine of two single numbers only tells their signs apart.
    """
    encoded, batches = planned(job, task, table, budget)
    if not batches:
        raise ModelError("int8 calibrates on the job's first rows, and none of them can be scored")

    def forward(module: torch.nn.Module, batch: np.ndarray) -> torch.Tensor:
        out = np.asarray(task.forward(encoded, batch), dtype=np.float32).reshape(len(batch), -1)
        return torch.from_numpy(out if out.shape[1] > 1 else out.reshape(1, -1))

    report = None
    if executor.prepared:  # TorchScript and torch.export models are loaded as they are
        module = executor.prepared[-1]
        _, report = quantize_int8(module, batches, forward, min_cosine=job.quality.min_cosine)
    if report is None or not report.quantized:
        raise ModelError(
            f'[model].precision: "int8" found no torch.nn.Linear layer to quantize in '
            f"{job.model.path or job.model.name} (TorchScript and torch.export models hide them); "
            "use fp32 or bf16"
        )
    executor.quantization = report.summary()
    log.info("int8: %s", executor.quantization)


def trial(
    job: Job, model_path: Path, precision: str, table: pa.Table, max_tokens: int, timed: bool
) -> Trial:
    """Load the model at ``precision`` and score ``table``; when ``timed``, score it twice and
    time the second (warm) pass, since only a choice between precisions needs their speeds."""
    executor = Executor(dataclasses.replace(job.model, precision=precision))
    task = load(job, model_path, executor, table)
    encoded, batches = planned(job, task, table, max_tokens)
    outputs = [executor.run(lambda b=b: task.forward(encoded, b)) for b in batches]
    seconds = executor.busy_s  # a cold pass: first calls pay one-off set-up costs
    if timed:
        for b in batches:
            executor.run(lambda b=b: task.forward(encoded, b))
        seconds = executor.busy_s - seconds
    results = restore(batches, outputs, np.empty((0,), dtype=np.float32))
    columns = task.finish(encoded, results) if batches else {}
    return Trial(precision, columns, seconds, len(encoded.rows), task, executor)


def choose_precision(
    job: Job, model_path: Path, table: pa.Table, budget: int, accept: bool
) -> tuple[Trial, dict[str, Any]]:
    """Gate the job's precision (or, for "auto", pick the fastest that passes); say why.

    At most two models are loaded at a time: the best so far and the one being measured.
    """
    wanted = job.model.precision
    auto = wanted == "auto"
    reference = trial(job, model_path, "fp32", table, budget, timed=auto)
    if wanted == "fp32":
        return reference, {"precision": "fp32", "why": "fp32 is the reference"}
    device = resolve_device(job.model.device)
    candidates = [p for p in fast_precisions(device) if p != "fp32"] if auto else [wanted]
    if auto and generates(job.model, model_path):
        candidates = [p for p in candidates if p != "int8"]
    best, measured = reference, [reference.describe()]
    for precision in candidates:
        candidate = trial(job, model_path, precision, table, budget, timed=auto)
        candidate.agreement = measure(reference.columns, candidate.columns, job.quality)
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
    return best, {**record, "precision": best.precision, "agreement": agreement, "why": why}


def choose_budget(job: Job, chosen: Trial, table: pa.Table) -> dict[str, Any]:
    """Time each candidate budget on the sample's rows (repeated to fill it); keep the fastest."""
    task, executor = chosen.task, chosen.executor
    encoded = task.encode(table)
    sizes = encoded.lengths + encoded.reserve
    if not len(sizes):
        return {"max_tokens": TRIAL_BUDGET, "why": "no rows to measure; default budget"}
    budgets = [b for b in BUDGETS[executor.device.type] if b >= sizes.max()]
    speeds: dict[int, float] = {}
    for budget in budgets:
        copies = int(np.ceil(2 * budget / sizes.sum()))
        units = np.tile(np.arange(len(sizes)), copies)
        batches = cut(sizes, units, budget, job.batching.max_rows, task.bucketing)
        try:
            executor.run(lambda b=batches[0]: task.forward(encoded, b))  # warm-up, and OOM probe
            start = time.perf_counter()
            tokens = 0
            for b in batches:
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
    job: Job, model_path: Path, recorded: dict[str, Any] | None, accept: bool = False
) -> tuple[Job, dict[str, Any] | None, Trial | None]:
    """The job with "auto" settings made concrete and its precision gated.

    ``recorded`` is an earlier decision for this output, reused as is. Returns the concrete job,
    the new decision to record (None when there was nothing to decide) and the chosen trial,
    whose loaded model the local engine adopts instead of loading (and calibrating) it again.
    """
    if recorded:
        return concrete(job, recorded), None, None
    needs_budget = job.batching.max_tokens == "auto"
    if job.model.precision == "fp32" and not needs_budget:
        return job, None, None
    table = sample_rows(job, job.quality.sample_rows)
    budget = TRIAL_BUDGET if needs_budget else job.batching.max_tokens
    chosen, decision = choose_precision(job, model_path, table, budget, accept)
    decision = {"precision": decision}
    if needs_budget:
        decision["batching"] = choose_budget(job, chosen, table)
        log.info("max_tokens = auto: %s", decision["batching"]["why"])
    log.info("precision %s: %s", chosen.precision, decision["precision"]["why"])
    return concrete(job, decision), decision, chosen


def concrete(job: Job, decision: dict[str, Any]) -> Job:
    """Apply a decision's precision and budget to the job."""
    model = dataclasses.replace(job.model, precision=decision["precision"]["precision"])
    batching = job.batching
    if "batching" in decision:
        batching = dataclasses.replace(batching, max_tokens=decision["batching"]["max_tokens"])
    return dataclasses.replace(job, model=model, batching=batching)


def check(job: Job, model_path: Path) -> tuple[dict[str, Any], bool]:
    """`batchscore check`: measure the gate on the job's rows without recording or scoring."""
    table = sample_rows(job, job.quality.sample_rows)
    budget = TRIAL_BUDGET if job.batching.max_tokens == "auto" else job.batching.max_tokens
    chosen, decision = choose_precision(job, model_path, table, budget, accept=True)
    return decision, chosen.agreement is None or chosen.agreement.passed
