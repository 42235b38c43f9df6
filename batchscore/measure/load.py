"""A task loaded at a precision, top to bottom in `load_at`: the adapter built (its weights cast,
moved and prepared for the runtime once, `Executor.prepare`), then for a calibrated precision
(int8) its Linear layers swapped on the job's own rows before it scores anything.

int8 calibration is deterministic, so every load of one job (the gate's trial, the run, each
Ray replica) picks the same layers.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from batchscore.errors import ModelError, QualityGateError
from batchscore.job.sections import Job, ModelConfig
from batchscore.models.base import Task
from batchscore.models.tasks import generates, input_kinds, load_task
from batchscore.observe.progress import stage
from batchscore.pipeline.batching import Batching
from batchscore.pipeline.stages import sample_rows
from batchscore.precision.int8 import QuantReport, quantize_int8
from batchscore.precision.table import precision
from batchscore.runtime.executor import Executor
from batchscore.work.shards import find_shards
from batchscore.work.units import Shard

log = logging.getLogger("batchscore")
TRIAL_BUDGET = 8192  # budget for trials and calibration when max_tokens is itself "auto"


def trial_budget(job: Job) -> int:
    """The token budget trials and calibration cut their batches with."""
    budget = job.batching.max_tokens
    return budget if isinstance(budget, int) else TRIAL_BUDGET


def job_sample(job: Job, shards: list[Shard] | None = None) -> pa.Table:
    """The rows the job's measurements are made on: its first `[quality].sample_rows` distinct
    rows (`sample_rows`), from ``shards`` as the run listed them (listed here when not given)."""
    kinds = input_kinds(job.model.task, job.input, job.options)
    listed = shards if shards is not None else find_shards(job.input)
    return sample_rows(job.input, kinds, listed, job.quality.sample_rows)


def load_at(
    job: Job,
    model_path: Path,
    executor: Executor,
    sample: pa.Table | None = None,
    *,
    shards: list[Shard] | None = None,
) -> Task:
    """Load the job's task at the executor's precision, in the order gpt-fast's `_load_model`
    loads a model (build, swap in quantized layers, load weights, move to device):

    1. refuse what the precision cannot judge (int8 on a model that generates text);
    2. build the adapter the task table names (`models.tasks.load_task`): it reads the
       tokenizer, config and weights, and the executor casts and moves each module once,
       switches it to inference, and hands it to OpenVINO, packs it for oneDNN or compiles it
       (`Executor.prepare`);
    3. for a calibrated precision (int8), swap in int8 Linear layers where the job's rows
       allow, then hand the encoder to OpenVINO (`calibrate_on`), measured on ``sample`` (the
       gate's rows), else the job's sample read from ``shards``.
    """
    model = dataclasses.replace(job.model, precision=executor.precision)
    refuse_generation(model, model_path)
    task = load_task(
        model_path,
        model=model,
        options=job.options,
        inp=job.input,
        executor=executor,
        usage=job.output.usage,
    )
    if precision(executor.precision).calibrated:
        calibrate_on(job, task, executor, sample if sample is not None else job_sample(job, shards))
    return task


def refuse_generation(model: ModelConfig, model_path: Path) -> None:
    """A precision judged by comparing output vectors (int8) cannot be judged on generated text."""
    if not precision(model.precision).generates and generates(model, model_path):
        raise ModelError(
            f'[model].precision: "{model.precision}" measures quality by comparing output '
            f"vectors, and {model_path} generates text; use fp32 or bf16 for generation"
        )


def convertible(name: str, *, compiled: bool) -> bool:
    """Whether a model loaded in fp32 can become ``name`` in place: a calibrated precision whose
    float parts stay float32 (int8) changes only its Linear layers, so the weights need not be
    read again. A compiled model's graph (inductor's, OpenVINO's) would not see the swap."""
    entry = precision(name)
    return entry.calibrated and entry.dtype == precision("fp32").dtype and not compiled


def convert(
    job: Job, model_path: Path, task: Task, executor: Executor, name: str, sample: pa.Table
) -> None:
    """Make ``task``, loaded in fp32 by ``executor``, run at ``name`` (see `convertible`)."""
    refuse_generation(dataclasses.replace(job.model, precision=name), model_path)
    executor.precision, executor.compile, executor.busy_s = name, False, 0.0
    calibrate_on(job, task, executor, sample)


def calibrate_on(job: Job, task: Task, executor: Executor, sample: pa.Table) -> None:
    """int8's load-time transform of the model ``executor`` prepared: its Linear layers
    chosen on every other row of ``sample`` (the gate's rows: the gate then measures on the
    whole sample, half of it unseen by the calibration) and swapped (`calibrate`), then the
    encoder handed to OpenVINO where the runtime says (`Executor.calibrated`)."""
    if sample.num_rows == 0:  # no row of the job passes `where`: the model will score none
        executor.quantization = "not calibrated: no input row to score"
        return
    report = calibrate(job, task, executor, sample.take(np.arange(0, sample.num_rows, 2)))
    executor.calibrated(executor.prepared[-1])
    executor.calibrate_s = report.seconds
    on = " (on OpenVINO, inputs quantized per group at run time)"
    executor.quantization = report.summary() + (on if executor.runtime == "openvino" else "")
    log.info("int8: %s", executor.quantization)


def calibrate(job: Job, task: Task, executor: Executor, table: pa.Table) -> QuantReport:
    """Swap the model's Linear layers for int8 ones, keeping in float those the rows need.

    The calibration compares each row's output vector with fp32's by cosine, against
    `[quality].min_cosine`; a one-number output (a regressor) is compared batch-wide instead,
    since the cosine of two single numbers only tells their signs apart. When no layer can go
    int8 within that promise, int8 fails the quality gate (exit 8), unless the job accepts
    int8's quality as it is (`[quality].accept`): then every layer the rows reach goes int8.
    """
    encoded = task.encode(table)
    units = np.arange(len(encoded.lengths))
    cut = Batching.of(job.batching, task, max_tokens=trial_budget(job)).batches(encoded, units)
    if not cut:
        raise ModelError("int8 calibrates on the job's first rows, and none of them can be scored")

    def forward(module: torch.nn.Module, batch: np.ndarray) -> torch.Tensor:
        out = np.asarray(task.forward(encoded, batch), dtype=np.float32).reshape(len(batch), -1)
        return torch.from_numpy(out if out.shape[1] > 1 else out.reshape(1, -1))

    report = None
    if executor.prepared:  # TorchScript and torch.export models are loaded as they are
        module = executor.prepared[-1]
        rows = f"int8 calibration: choosing the Linear layers on {table.num_rows} rows"
        with stage(rows, "int8 calibrated"):
            _, report = quantize_int8(module, cut, forward, min_cosine=job.quality.min_cosine)
        if not report.quantized and report.sensitivity:  # Linear layers, none good enough
            if not job.quality.accept:
                raise QualityGateError(
                    f'[model].precision = "int8" fails the quality gate on the first '
                    f"{2 * table.num_rows} rows: with any Linear layer in int8, some row's "
                    f"cosine with fp32 falls below [quality].min_cosine = "
                    f"{job.quality.min_cosine}. Use another precision, relax [quality], or "
                    "pass --accept-quality to score in int8 anyway"
                )
            _, report = quantize_int8(module, cut, forward, min_cosine=None)
    if report is None or not report.quantized:
        raise ModelError(
            f'[model].precision: "int8" found no torch.nn.Linear layer to quantize in '
            f"{job.model.path or job.model.name} (TorchScript and torch.export models hide them); "
            "use fp32 or bf16"
        )
    return report
