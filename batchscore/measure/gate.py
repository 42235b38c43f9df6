"""The quality gate: a precision scores the job's sample rows next to fp32, and the task's own
agreement measure (`Task.agreement`) judges the two against `[quality]`."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from batchscore.job.sections import Job, QualityConfig
from batchscore.measure.load import convert, convertible, load_at
from batchscore.models.agreement import Agreement
from batchscore.models.base import Task
from batchscore.pipeline.batching import Batching
from batchscore.pipeline.known import Known
from batchscore.pipeline.sampler import padded_tokens, restore
from batchscore.pipeline.static import run_sample
from batchscore.runtime.executor import Executor


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
    load_s: float = 0.0  # loading the model at this precision, int8's calibration included
    calibrate_s: float = 0.0  # of which int8's calibration
    cold_s: float = 0.0  # its first pass over the sample (the gate's pass, when not timed)
    runtime: str = "torch"  # or "openvino": where its model ran (`batchscore.job.runtimes`)
    known: Known | None = None  # its model's results for the sample, for a run that adopts it
    tokens_per_s: float = 0.0  # padded tokens per second of model time, first batch left out
    tokens_per_row: float = 0.0  # the sample's padded tokens per row, as its batches were cut

    def unload(self) -> None:
        """Let go of the model, and of the results only it may hand on (columns, timing stay),
        and give its memory back to the device: on a GPU the caching allocator would otherwise
        keep the fp32 reference's blocks reserved beside the model that scores the run."""
        executor = self.executor
        self.task = self.executor = self.known = None
        if executor is not None:
            executor.release_memory()

    @property
    def rows_per_s(self) -> float:
        """Rows per second of model time at the warm speed (see `warm_speed`)."""
        if self.tokens_per_s and self.tokens_per_row:
            return self.tokens_per_s / self.tokens_per_row
        return self.rows / max(self.seconds, 1e-9)

    def describe(self) -> str:
        quality = f", {self.agreement.describe()}" if self.agreement else ""
        where = " on OpenVINO" if self.runtime == "openvino" else ""
        return f"{self.precision}{where}: {self.rows_per_s:,.1f} rows/s{quality}"

    @property
    def cost_s(self) -> float:
        """What gating this precision costs a run: its load and one pass over the sample."""
        return self.load_s + self.cold_s


def trial(
    job: Job,
    model_path: Path,
    precision: str,
    *,
    table: pa.Table,
    max_tokens: int,
    timed: bool,
    reuse: Trial | None = None,
) -> Trial:
    """Load the model at ``precision`` and score ``table``; when ``timed``, score it twice and
    time the second (warm) pass, since only a choice between precisions needs their speeds.
    ``reuse``: the fp32 reference, whose model becomes ``precision`` in place where it can
    (int8: `convertible`) instead of being loaded again; it is let go either way."""
    started = time.perf_counter()
    loaded = reuse.executor if reuse is not None else None
    if loaded is not None and convertible(precision, compiled=loaded.compiled):
        task, executor = reuse.task, reuse.executor
        convert(job, model_path, task, executor, precision, table)
    else:
        executor = Executor(dataclasses.replace(job.model, precision=precision))
        task = load_at(job, model_path, executor, table)
    if reuse is not None:
        reuse.unload()
    load_s = time.perf_counter() - started
    encoded = task.encode(table)
    units = np.arange(len(encoded.lengths))
    policy = Batching.of(job.batching, task, max_tokens=max_tokens)  # cut as the run cuts
    ran = run_sample(
        encoded, policy.batches(encoded, units), task=task, executor=executor, policy=policy
    )
    cut, outputs, spent = ran.batches, ran.outputs, ran.seconds  # as run, split where too big
    seconds = cold = executor.busy_s  # a cold pass: first calls pay one-off set-up costs
    sizes = [padded_tokens(encoded.lengths + encoded.reserve, [b]) for b in cut]
    if timed:
        for b in cut:
            executor.run(lambda b=b: task.forward(encoded, b))
        seconds = executor.busy_s - seconds
    results = restore(cut, outputs, np.empty((0,), dtype=np.float32))
    columns = task.finish(encoded, results) if cut else {}
    rows = len(encoded.rows)
    return Trial(
        precision,
        columns,
        seconds,
        rows,
        task,
        executor,
        load_s=load_s,
        calibrate_s=executor.calibrate_s,
        cold_s=cold,
        runtime=executor.runtime,
        known=Known.of(encoded, results, cut) if cut else None,
        tokens_per_s=sum(sizes) / max(seconds, 1e-9) if timed else warm_speed(sizes, spent),
        tokens_per_row=sum(sizes) / max(rows, 1),
    )


def warm_speed(tokens: list[int], seconds: list[float]) -> float:
    """Padded tokens per second over a pass's batches, the first left out where there are
    others: a model's first call pays one-off set-up (oneDNN primitives, OpenVINO's first
    inference) that the rest of a run does not, so the gate's single pass still tells the
    run's speed without a second, timed pass."""
    if len(tokens) > 1:
        tokens, seconds = tokens[1:], seconds[1:]
    return sum(tokens) / max(sum(seconds), 1e-9)


def judge(reference: Trial, candidate: Trial, gate: QualityConfig) -> Agreement:
    """The candidate's agreement with fp32, by the task's own measure; no rows, nothing to fail."""
    if not reference.columns or not reference.rows:
        return Agreement()
    return candidate.task.agreement(reference.columns, candidate.columns, gate)
