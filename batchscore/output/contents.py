"""What every data file holds: its schema, and the footer metadata that says how it was made."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from batchscore.errors import BookkeepingError
from batchscore.job.sections import ROW_HASH, EmbedConfig, Job
from batchscore.version import __version__
from batchscore.work.row_errors import error_fields


def output_schema(
    carried: pa.Schema, task_columns: list[pa.Field], on_error: str, *, row_hash: bool = False
) -> pa.Schema:
    """Carried columns, the task's columns, then `error` if skipping (``on_error``, the job's
    `[output].on_error`), then by rows (``row_hash``) each row's hash, last, where a reader's
    ``select *`` meets it after every column it knows.

    ``carried`` are the types the plan settled (`batchscore.output.drift`): the folder's
    committed files' once it has some, else the one layout of their kind (`canonical`: text
    as ``string``, integers as ``int64``) that holds every shard's, not the first shard's:
    shards of one folder written by pyarrow, polars and pandas then share their data files'
    schema, and a run that meets its shards in another order writes the same one.
    """
    hashes = [pa.field(ROW_HASH, pa.int64())] if row_hash else []
    return pa.schema([*carried, *task_columns, *error_fields(on_error), *hashes])


def file_metadata(
    job: Job, claim: dict[str, Any], precision: str, described: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The key-value metadata every data file's Parquet footer carries (its source shard and
    rows are added per file); ``described``: what the task says of its output (a classifier's
    label names, `LABELS`; `batchscore.models.tasks.footer_metadata`)."""
    return {
        **(described or {}),
        "batchscore.version": __version__,
        "batchscore.job": job.name,
        "batchscore.task": job.model.task,
        "batchscore.model": str(job.model.name or job.model.path),
        "batchscore.model_files": claim["parts"]["model_files"],
        PRECISION: precision,
        "batchscore.fingerprint": claim["fingerprint"],
        **(embed_metadata(job.options) if isinstance(job.options, EmbedConfig) else {}),
    }


def lineage(job: Job) -> dict[str, str]:
    """What a Delta commit's info says of the job before a model is loaded (a retirement's);
    an append adds its data files' `file_metadata`."""
    return {
        "batchscore.version": __version__,
        "batchscore.job": job.name,
        "batchscore.task": job.model.task,
        "batchscore.model": str(job.model.name or job.model.path),
        PRECISION: job.model.precision,
    }


PRECISION = "batchscore.precision"
RANGES = "batchscore.embed.ranges"
LABELS = "batchscore.labels"  # a classifier's label names in `scores` order: a JSON list


def embed_metadata(options: EmbedConfig) -> dict[str, str]:
    """How the vectors were cut and quantized, where the job asked: the ranges (JSON, the
    minimums then the maximums, one float32 per dimension) quantize queries the same way."""
    found = {
        "batchscore.embed.truncate_dim": options.truncate_dim,
        "batchscore.embed.quantize": options.quantize,
        "batchscore.embed.top_k": options.top_k,
    }
    meta = {key: str(value) for key, value in found.items() if value is not None}
    if options.ranges is not None:
        meta[RANGES] = json.dumps([list(bound) for bound in options.ranges])
    return meta


def footer_ranges(
    footers: list[dict[str, str]], where: str
) -> tuple[tuple[float, ...], ...] | None:
    """The ranges committed files were quantized with (None: none was), read back from their
    footers, which must agree: one output never mixes two."""
    found = {footer[RANGES] for footer in footers if RANGES in footer}
    if len(found) > 1:
        raise BookkeepingError(
            f"{where}; the data files were quantized with {len(found)} different ranges. Run "
            "with --restart to start over, or point [output].path at a new folder"
        )
    if not found:
        return None
    return tuple(tuple(float(v) for v in bound) for bound in json.loads(found.pop()))


def footer_precision(footers: list[dict[str, str]], where: str) -> str | None:
    """The precision committed files were scored at, read back from their footers (None: no
    footer names one), which must agree: one output never mixes two."""
    found = sorted({footer[PRECISION] for footer in footers if PRECISION in footer})
    if len(found) > 1:
        raise BookkeepingError(
            f"{where}; the data files were scored at {len(found)} different precisions "
            f"({', '.join(found)}). Run with --restart to start over, or point [output].path "
            "at a new folder"
        )
    return found[0] if found else None


# what of the data files' metadata goes into each table commit's info (Delta, Iceberg)
LINEAGE = (
    "batchscore.version",
    "batchscore.job",
    "batchscore.task",
    "batchscore.model",
    "batchscore.model_files",
    "batchscore.precision",
    "batchscore.fingerprint",
    "batchscore.labels",  # classify: the label names, in score order
)
