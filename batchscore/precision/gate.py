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
from batchscore.models.agreement import Agreement
from batchscore.models.base import Task
from batchscore.pipeline.executor import Executor
from batchscore.pipeline.known import Known
from batchscore.pipeline.sampler import restore
from batchscore.pipeline.stages import batches
from batchscore.precision.load import convert, convertible, load_at


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
    cold_s: float = 0.0  # its first pass over the sample (the gate's pass, when not timed)
    runtime: str = "torch"  # or "openvino": where its model ran (`batchscore.pipeline.runtimes`)
    known: Known | None = None  # its model's results for the sample, for a run that adopts it

    def unload(self) -> None:
        """Let go of the model, and of the results only it may hand on (columns, timing stay)."""
        self.task = self.executor = self.known = None

    @property
    def rows_per_s(self) -> float:
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
    cut = batches(encoded, units, max_tokens, max_rows=job.batching.max_rows, sort=task.bucketing)
    outputs = [executor.run(lambda b=b: task.forward(encoded, b)) for b in cut]
    seconds = cold = executor.busy_s  # a cold pass: first calls pay one-off set-up costs
    if timed:
        for b in cut:
            executor.run(lambda b=b: task.forward(encoded, b))
        seconds = executor.busy_s - seconds
    results = restore(cut, outputs, np.empty((0,), dtype=np.float32))
    columns = task.finish(encoded, results) if cut else {}
    rows = len(encoded.rows)
    return Trial(
        precision, columns, seconds, rows, task, executor, load_s=load_s, cold_s=cold,
        runtime=executor.runtime, known=Known.of(encoded, results) if cut else None,
    )  # fmt: skip


def judge(reference: Trial, candidate: Trial, gate: QualityConfig) -> Agreement:
    """The candidate's agreement with fp32, by the task's own measure; no rows, nothing to fail."""
    if not reference.columns or not reference.rows:
        return Agreement()
    return candidate.task.agreement(reference.columns, candidate.columns, gate)
