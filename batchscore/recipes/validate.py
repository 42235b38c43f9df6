"""Preflight: everything about a job that can be checked without loading weights or scoring
(what `batchscore validate` prints): the model's weight-free part is built as a run builds it.

Every problem is found and reported at once, and the error that carries them has the exit
status `run` would meet them with, so a scheduler can gate on `validate` as on `run`: the job
file's (2) before the model's (4) before the machine's (6) before a transient read's (7)
before the data's (3: a shard that cannot be read, lacks a column the task reads, or holds a
carried column of a type the other shards' cannot share; by rows, ids that repeat or are
missing). The rows themselves are the run's to meet: a row that cannot be scored fails its
shard, or is recorded with its error.
"""

from __future__ import annotations

from batchscore.engines.ray import import_ray
from batchscore.errors import (
    BatchscoreError,
    InputDataError,
    JobError,
    ModelError,
    TransientIOError,
    WriteError,
)
from batchscore.job.runtimes import check_runtime_device
from batchscore.job.sections import Job
from batchscore.models.fingerprint import identity
from batchscore.models.source.locate import locate
from batchscore.models.tasks import check_outputs, encoding, generates, input_kinds
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.claim import Identity, refusal
from batchscore.output.pending import check_where
from batchscore.output.survey import Survey
from batchscore.output.todo import to_do
from batchscore.precision.table import check_precision
from batchscore.runtime.device import resolve_device
from batchscore.storage import open_store
from batchscore.work.shards import check_columns, find_shards, open_shard
from batchscore.work.units import Shard

# the order `run` meets problems in: the first kind found decides the exit status
KINDS: tuple[type[BatchscoreError], ...] = (
    JobError,
    ModelError,
    WriteError,
    TransientIOError,
    InputDataError,
)


def preflight(job: Job) -> list[str]:
    """Check inputs, model and device; return findings, or raise an error naming every problem,
    of the first kind in `KINDS` among them (`JobError` for a problem of no kind there)."""
    problems: list[str] = []
    model_problems: list[str] = []
    data_problems: list[BatchscoreError] = []
    facts: list[str] = []
    try:
        open_store(job.output.path).check()
    except WriteError as exc:
        raise WriteError(f"{job.source}: {exc}") from None  # the machine's problem: exit 6
    except BatchscoreError as exc:
        problems.append(str(exc))
    try:
        check_outputs(job)
    except BatchscoreError as exc:
        problems.append(str(exc).removeprefix(f"{job.source}: "))
    try:
        shards = find_shards(job.input)
    except BatchscoreError as exc:
        problems.append(str(exc))
        shards = []
    rows = 0
    rows_filter = job.input.row_filter
    kinds = input_kinds(job.model.task, job.input, job.options)
    for shard in shards:
        try:
            pf = open_shard(shard)
            check_columns(shard, pf.schema_arrow, job.input.copied, kinds)
            check_where(rows_filter, shard, pf.schema_arrow)
            rows += pf.metadata.num_rows
        except (InputDataError, TransientIOError) as exc:  # the data's, as `run` reads it
            data_problems.append(exc)
        except BatchscoreError as exc:
            problems.append(str(exc))
    if shards and not data_problems:
        data_problems += across_shards(job, shards, kinds)
    if shards:
        facts.append(f"input: {len(shards)} shard(s), {rows:,} rows")
    try:
        path = locate(job.model)
        who = identity(job, path)  # every file read and the model checked, as a run's start
        judge_model(job, who)
        if job.model.long_text == "chunk" and generates(job.model, path):
            raise ModelError(
                f'[model].long_text: "chunk" windows the texts of an encoder; {path} generates'
            )
        # what a run's load reads before any weights (the tokenizer, the config, the stack; a
        # chat template renders its probe conversation), built as `plan` and the run build it,
        # so what the load would refuse is refused here, in its words
        encoding(path, model=job.model, options=job.options, inp=job.input)
        facts.append(f"model: {job.model.name} at {path}" if job.model.name else f"model: {path}")
    except ModelError as exc:
        model_problems.append(str(exc))
    except BatchscoreError as exc:
        problems.append(str(exc))
    try:
        device = resolve_device(job.model.device)
        check_runtime_device(job.model, device.type)
        check_precision(job.model.precision, device)
        facts.append(f"device: {device}, precision {job.model.precision}")
    except BatchscoreError as exc:
        problems.append(str(exc))
    if job.engine == "ray":
        try:
            facts.append(f"engine: ray {import_ray().__version__}")
        except BatchscoreError as exc:
            problems.append(str(exc))
    found = [
        *(JobError(p) for p in problems),
        *(ModelError(p) for p in model_problems),
        *data_problems,
    ]
    if found:
        raise worst(job, found)
    return facts


def across_shards(job: Job, shards: list[Shard], kinds: dict[str, str]) -> list[BatchscoreError]:
    """What only the shards together say, as the run's own plan of work says it (a dry run:
    nothing changes): a carried column whose type one shard cannot share with the others,
    and, by rows, an id that names more than one row or none."""
    try:
        survey = Survey(
            inp=job.input, kinds=kinds, chunk_rows=job.output.chunk_rows, shards=tuple(shards)
        )
        todo = to_do(Checkpoint(job.output.path), survey)
    except (InputDataError, TransientIOError) as exc:  # the data's, as `run` reads it
        return [exc]
    except BatchscoreError:  # the output folder's own problems are the run's to meet
        return []
    return [InputDataError(failure["error"]) for failure in todo.failures]


def judge_model(job: Job, who: Identity) -> None:
    """The `ModelError` a run would stop at when the model lacks a file it had when the job's
    committed output was made. Whether the output was made with other settings is the run's to
    say (exit 5): `validate && run --restart` is how a changed job starts over."""
    try:
        refusal(Checkpoint(job.output.path), who)
    except ModelError:
        raise
    except (BatchscoreError, OSError):
        pass  # the output folder's own problems (not a folder, unreadable) are reported above


def worst(job: Job, found: list[BatchscoreError]) -> BatchscoreError:
    """One error listing every problem, of the kind `run` would stop at first."""
    messages = [f"{job.source}: {exc}" for exc in found]
    kind = next((k for k in KINDS if any(isinstance(e, k) for e in found)), JobError)
    if kind is JobError:
        return JobError(messages)
    return kind("\n".join(messages))
