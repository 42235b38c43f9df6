"""The quality gate: a precision scores the job's sample rows next to fp32, and the task's own
agreement measure (`Task.agreement`) judges the two against `[quality]`."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
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
from batchscore.work.units import Encoded


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
    policy: Batching | None = None  # how its batches are cut: as the run cuts its rows
    sizes: list[int] = field(default_factory=list)  # each batch's padded tokens, as scored
    spent: list[float] = field(default_factory=list)  # and its model seconds
    cut: list[np.ndarray] = field(default_factory=list)  # the last pass's batches (units)
    encoded: Encoded | None = None  # and its units

    def score(self, table: pa.Table) -> None:
        """Score ``table`` (the sample's next rows) with this trial's model and add its results
        to the trial's: its columns, its known results and its speed.

        The gate scores its sample in rounds and stops as soon as the rows it has scored keep
        its promise (`batchscore.measure.rounds`), so each round adds the rows after the last."""
        task, executor = self.task, self.executor
        if self.rows and not table.num_rows:
            return
        encoded = task.encode(table)
        units = np.arange(len(encoded.lengths))
        ran = run_sample(
            encoded,
            self.policy.batches(encoded, units),
            task=task,
            executor=executor,
            policy=self.policy,
        )
        cut = ran.batches  # as run, split where too big
        self.cut, self.encoded = cut, encoded
        self.sizes += [padded_tokens(encoded.lengths + encoded.reserve, [b]) for b in cut]
        self.spent += ran.seconds
        self.seconds = self.cold_s = executor.busy_s  # cold: first calls pay one-off set-up
        results = restore(cut, ran.outputs, np.empty((0,), dtype=np.float32))
        columns = task.finish(encoded, results) if cut else {}
        if self.columns and columns:
            columns = {k: joined(self.columns[k], v) for k, v in columns.items()}
        self.columns = columns or self.columns
        known = Known.of(encoded, results, cut) if cut else None
        self.known = known if not self.rows else Known.joined(self.known, known)
        self.rows += len(encoded.rows)
        self.tokens_per_s = warm_speed(self.sizes, self.spent)
        self.tokens_per_row = sum(self.sizes) / max(self.rows, 1)

    def unload(self) -> None:
        """Let go of the model, and of the results only it may hand on (columns, timing stay),
        and give its memory back to the device: on a GPU the caching allocator would otherwise
        keep the fp32 reference's blocks reserved beside the model that scores the run."""
        executor = self.executor
        self.task = self.executor = self.known = self.encoded = None
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
    rows: int | None = None,
) -> Trial:
    """Load the model at ``precision`` and score ``table``'s first ``rows`` (all by default;
    the quality gate scores more in rounds, `Trial.score`); when ``timed``, score them twice
    and time the second (warm) pass, since only a choice between precisions needs their
    speeds. ``reuse``: the fp32 reference, whose model becomes ``precision`` in place where it
    can (int8: `convertible`) instead of being loaded again; it is let go either way."""
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
    policy = Batching.of(job.batching, task, max_tokens=max_tokens)  # cut as the run cuts
    scored = Trial(
        precision,
        {},
        0.0,
        0,
        task,
        executor,
        load_s=load_s,
        calibrate_s=executor.calibrate_s,
        runtime=executor.runtime,
        policy=policy,
    )
    scored.score(table.slice(0, table.num_rows if rows is None else rows))
    if timed:
        before, encoded = executor.busy_s, scored.encoded
        for b in scored.cut:
            executor.run(lambda b=b: task.forward(encoded, b))
        scored.seconds = executor.busy_s - before
        scored.tokens_per_s = sum(scored.sizes) / max(scored.seconds, 1e-9)
    return scored


def joined(before: pa.Array | pa.ChunkedArray, after: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One column of two passes' results, in the order they were scored."""
    chunks = [c for x in (before, after) for c in getattr(x, "chunks", [x])]
    return pa.chunked_array(chunks, type=chunks[0].type).combine_chunks()


def warm_speed(tokens: list[int], seconds: list[float]) -> float:
    """Padded tokens per second over a pass's batches, the first left out where there are
    others: a model's first call pays one-off set-up (oneDNN primitives, OpenVINO's first
    inference) that the rest of a run does not, so the gate's single pass still tells the
    run's speed without a second, timed pass."""
    if len(tokens) > 1:
        tokens, seconds = tokens[1:], seconds[1:]
    return sum(tokens) / max(sum(seconds), 1e-9)


def judge(reference: Trial, candidate: Trial, gate: QualityConfig) -> Agreement:
    """The candidate's agreement with fp32 on the rows both scored (the reference may have
    scored more: int8 converts its model after it scored the whole sample), by the task's own
    measure; no rows, nothing to fail."""
    if not reference.columns or not reference.rows or not candidate.rows:
        return Agreement()
    columns = reference.columns
    if reference.rows > candidate.rows:
        columns = {k: v.slice(0, candidate.rows) for k, v in columns.items()}
    return candidate.task.agreement(columns, candidate.columns, gate)
