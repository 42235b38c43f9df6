"""What every data file holds: its schema, and the footer metadata that says how it was made."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from batchscore.job.sections import Job
from batchscore.version import __version__
from batchscore.work.columns import canonical_schema
from batchscore.work.row_errors import error_fields


def output_schema(job: Job, carried: pa.Schema, task_columns: list[pa.Field]) -> pa.Schema:
    """Carried columns, the task's columns, then `error` if skipping.

    A carried column is written in the one layout of its kind (`canonical`: text as
    ``string``, integers as ``int64``), not in its first shard's: shards of one folder written
    by pyarrow, polars and pandas then share their data files' schema, and a run that meets its
    shards in another order (the first one failed, say) writes the same one.
    """
    return pa.schema(
        [*canonical_schema(carried), *task_columns, *error_fields(job.output.on_error)]
    )


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
