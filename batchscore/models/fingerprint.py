"""The fingerprint: everything that decides a job's output, recorded when the folder is claimed.

A run whose parts differ from the recorded ones would mix outputs made with other settings, so
it is refused (`batchscore.output.claim`) and told which parts changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batchscore.job.sections import Job
from batchscore.models.locate import model_identity
from batchscore.models.tasks import input_kinds, model_parts, task_options
from batchscore.output.claim import Identity


def fingerprint_parts(job: Job, model_path: Path) -> dict[str, Any]:
    """Everything that decides the output; a change means committed chunks no longer match."""
    return {
        "task": job.model.task,
        "task_options": task_options(job.task),
        "model": job.model.name or job.model.path,
        "model_files": model_identity(model_path),
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
    """The job's identity for its output folder: inputs and fingerprint, as JSON records them."""
    parts = json.loads(json.dumps(fingerprint_parts(job, model_path), default=str))
    return Identity(job.name, str(job.source), list(job.input.path), parts)
