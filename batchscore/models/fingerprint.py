"""The fingerprint: everything that decides a job's output, recorded when the folder is claimed.

A run whose parts differ from the recorded ones would mix outputs made with other settings, so
it is refused (`batchscore.output.claim`) and told which parts changed. The model is judged
whole before its digest is taken: a file missing or unreadable is the model's error naming it,
never a digest that differs and reads as other settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batchscore.job.sections import Job
from batchscore.models.locate import model_identity, read_model_files
from batchscore.models.tasks import check_model, input_kinds, model_parts, task_options
from batchscore.output.claim import Identity


def fingerprint_parts(job: Job, model_path: Path, model_files: str | None = None) -> dict[str, Any]:
    """Everything that decides the output; a change means committed chunks no longer match.
    ``model_files``: the model's digest when it was read already."""
    return {
        "task": job.model.task,
        "task_options": task_options(job.task),
        "model": job.model.name or job.model.path,
        "model_files": model_files or model_identity(model_path),
        "precision": job.model.precision,
        "max_length": job.model.max_length or "model default",
        "columns": {
            # pairs, not a mapping: the order of feature columns matters
            "inputs": list(input_kinds(job.model.task, job.input, job.task).items()),
            "carried": list(job.input.carried),
        },
        "on_error": job.output.on_error,
        "chunk_rows": job.output.chunk_rows,
        # only when set, so outputs made before the key existed still resume
        **({"where": job.input.where} if job.input.where is not None else {}),
        **model_parts(job.model, model_path, job.task),
    }


def identity(job: Job, model_path: Path) -> Identity:
    """The job's identity for its output folder: inputs and fingerprint, as JSON records them,
    with each of the model's files (recorded beside the fingerprint, so a later run names a
    file that went missing). `ModelError` for a model file that cannot be read, or a model that
    lacks a file it needs (its weights, its config), as loading it would say."""
    files = read_model_files(model_path)
    model, task = job.model, job.model.task
    check_model(task, model_path, options=job.task, allow_pickle=model.allow_pickle)
    parts = fingerprint_parts(job, model_path, files.digest)
    parts = json.loads(json.dumps(parts, default=str))
    return Identity(
        job.name,
        str(job.source),
        list(job.input.path),
        parts,
        files=files.each,
        model_path=str(model_path),
    )
