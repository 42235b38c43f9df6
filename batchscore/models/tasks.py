"""Task adapters, in one table keyed by `[model].task`; see `batchscore.models.base`.

Each entry is an adapter class (`Adapter`) that declares everything that sets its task apart:
its input columns and their kinds, its output columns, how its model's files are checked, its
parts of the fingerprint, whether it generates text. The functions here only look them up.

One task has two adapters: `summarize` is extractive over an encoder (the built-in MiniLM) and
abstractive over a generative model, told apart by the model's config, never by its name. Each
adapter names its `encoding_type`, the weight-free part its `encode` runs: `encoding` builds
that part alone, which is all `batchscore plan` loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchscore.errors import JobError, ModelError
from batchscore.job.column_names import clashes
from batchscore.job.sections import InputConfig, Job, ModelConfig
from batchscore.models.base import USAGE, Adapter, Encoding, Task
from batchscore.models.classify import ClassifyTask
from batchscore.models.embed import EmbedTask
from batchscore.models.generate import AbstractiveSummarizeTask, GenerateTask
from batchscore.models.generation.architecture import is_generative
from batchscore.models.images import TowersTask
from batchscore.models.loglik import LoglikTask
from batchscore.models.reward import RewardTask
from batchscore.models.summarize import SummarizeTask
from batchscore.models.tensor import TensorTask
from batchscore.models.vision.family import find_towers
from batchscore.runtime.executor import Executor
from batchscore.work.row_errors import error_fields

TASKS: dict[str, type[Adapter]] = {
    "embed": EmbedTask,
    "classify": ClassifyTask,
    "generate": GenerateTask,
    "summarize": SummarizeTask,
    "tensor": TensorTask,
    "loglik": LoglikTask,
    "reward": RewardTask,
}


def input_kinds(task: str, inp: InputConfig, options: Any) -> dict[str, str]:
    """Input columns a task reads, each with the kind it must be ("text" or "numeric")."""
    return TASKS[task].input_kinds(inp, options)


def check_outputs(job: Job) -> None:
    """An `id` or `keep` column named like one of the task's output columns (or `error`, which
    skipped rows carry) would make a file with two fields of one name: a job error. So would
    one that differs from it only in case, for DuckDB, Spark and Hive
    (`batchscore.job.column_names`)."""
    names = set(TASKS[job.model.task].output_names(job.options))
    names.update(f.name for f in error_fields(job.output.on_error))
    if job.output.usage:  # which adapter counts what is known once the model is found: all
        names.update(USAGE)
    found = clashes(job.input.carried, names)
    if found:
        column, output = found[0]
        task = f"task {job.model.task} ({', '.join(sorted(names))})"
        said = (
            f"has the name of an output column of {task}"
            if column == output
            else f"differs only in case from the output column {output!r} of {task}, and "
            "DuckDB, Spark and Hive ignore case"
        )
        raise JobError(
            f"{job.source}: [input].id/keep: column {column!r} {said}; rename it in the input, "
            "or leave it out"
        )


def check_model(task: str, path: Path, *, options: Any, allow_pickle: bool = False) -> None:
    """Check the model's files are there and in a loadable format, without loading weights."""
    TASKS[task].check_files(path, options, allow_pickle=allow_pickle)


def generates(model: ModelConfig, path: Path) -> bool:
    """Whether the job's task generates text (its outputs are tokens, not numbers to compare)."""
    return TASKS[model.task].generates(model, path)


def adapter(path: Path, *, model: ModelConfig, options: Any) -> type:
    """The table's adapter for the job's task; summarize's is chosen by the model's config,
    and so is embed's for a CLIP or SigLIP model (its towers, `TowersTask`)."""
    if model.task == "embed" and find_towers(path) is not None:
        return TowersTask
    if model.task == "summarize":
        if is_generative(path, model.trust_remote_code):
            if model.long_text == "chunk":
                raise ModelError(
                    f'[model].long_text: "chunk" windows the texts of an encoder; {path} '
                    "generates its summaries, from the start of each text"
                )
            return AbstractiveSummarizeTask
        if options.prompt is not None:
            raise ModelError(
                f"[summarize].prompt: {path} is an encoder, which summarizes extractively "
                "and reads no prompt; remove the prompt or use a generative model"
            )
    return TASKS[model.task]


def footer_metadata(path: Path, *, model: ModelConfig, options: Any) -> dict[str, str]:
    """What the job's task writes of itself into every data file's footer (a classifier's
    label names, in score order), read from the model's files without loading its weights."""
    return adapter(path, model=model, options=options).footer_metadata(path, options)


def encoding(path: Path, *, model: ModelConfig, options: Any, inp: InputConfig) -> Encoding:
    """The job's task encoding alone: the tokenizer, config and stack read from ``path``, no
    weights loaded (what `batchscore plan` counts with). The adapter `load_task` builds runs
    this same class in its `encode`, so a plan meets the units its run will."""
    chosen = adapter(path, model=model, options=options)
    return chosen.encoding_type(path, model=model, options=options, inp=inp)


def load_task(
    path: Path,
    *,
    model: ModelConfig,
    options: Any,
    inp: InputConfig,
    executor: Executor,
    usage: bool = False,
) -> Task:
    """Build the adapter for the job's task around the model at ``path``; with ``usage``
    (`[output].usage`), one that writes the tokens its model read per row too."""
    chosen = adapter(path, model=model, options=options)
    task = chosen(path, model=model, options=options, inp=inp, executor=executor)
    if usage:
        task.count_usage()
    return task
