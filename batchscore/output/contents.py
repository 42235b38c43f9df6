"""What every data file holds: its schema, and the footer metadata that says how it was made."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from batchscore.job.sections import Job
from batchscore.version import __version__


def output_schema(job: Job, carried: pa.Schema, task_columns: list[pa.Field]) -> pa.Schema:
    """Carried columns (their first shard's types), the task's columns, then `error` if skipping."""
    fields = [*carried, *task_columns]
    if job.output.on_error == "skip":
        fields.append(pa.field("error", pa.string()))
    return pa.schema(fields)


def file_metadata(job: Job, claim: dict[str, Any], precision: str) -> dict[str, str]:
    """The key-value metadata every data file's Parquet footer carries (its source shard and
    rows are added per file)."""
    return {
        "batchscore.version": __version__,
        "batchscore.job": job.name,
        "batchscore.task": job.model.task,
        "batchscore.model": str(job.model.name or job.model.path),
        "batchscore.model_files": claim["parts"]["model_files"],
        "batchscore.precision": precision,
        "batchscore.fingerprint": claim["fingerprint"],
    }
