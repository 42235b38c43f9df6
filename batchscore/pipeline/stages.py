"""The stages between reader and model for one chunk: rows -> encoded window -> batches.

    read_rows (reader, `where`) -> task.encode (tokenizer) -> distinct units -> batches (sampler)

`windows` runs them for every pending chunk (in the reader thread); `sample_rows` reads the
job's first rows through the same reader and filter, for the quality gate and int8 calibration.
`batches` is the one way rows become batches, wherever they are cut.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from batchscore.errors import BatchscoreError, InputDataError, JobError
from batchscore.job.sections import Job
from batchscore.job.where import RowFilter
from batchscore.models.base import Encoded, Encoding, Task
from batchscore.models.tasks import input_kinds
from batchscore.output.pending import Chunk, chunks_of
from batchscore.pipeline.reader import Rows, read_rows
from batchscore.pipeline.sampler import first_of_each, form_batches
from batchscore.pipeline.shards import find_shards, open_shard


@dataclass
class Window:
    """Rows of one chunk between reader and model; `error` marks a shard that failed reading."""

    chunk: Chunk
    rows: Rows | None = None
    encoded: Encoded | None = None
    units: np.ndarray | None = None  # the units to score: each distinct input once
    same_as: np.ndarray | None = None  # unit -> the identical unit scored for it, if any repeat
    batches: list[np.ndarray] = field(default_factory=list)
    cut_for: int = 0  # the max_tokens the batches were cut for
    error: BatchscoreError | None = None


@dataclass
class Scored:
    """A window on its way to the writer: output rows, or the error that failed its shard."""

    chunk: Chunk
    table: pa.Table | None = None
    rejected: pa.Table | None = None  # shard, row, error of rows recorded with an error
    error: InputDataError | None = None
    read: int | None = None  # input rows the window covers before `where`; None: table's rows


def input_columns(job: Job) -> tuple[str, ...]:
    """The input columns a run reads: carried ones, the task's, and those `where` tests."""
    row_filter = RowFilter(job.input.where) if job.input.where is not None else None
    needs = row_filter.columns if row_filter else ()
    kinds = input_kinds(job.model.task, job.input, job.task)
    return tuple(dict.fromkeys([*job.input.carried, *kinds, *needs]))


def batches(
    encoded: Encoded, units: np.ndarray, max_tokens: int, *, max_rows: int, sort: bool
) -> list[np.ndarray]:
    """Cut ``units`` into batches under the budget; a unit longer than it runs alone."""
    sizes = np.minimum((encoded.lengths + encoded.reserve)[units], max_tokens)
    return [units[b] for b in form_batches(sizes, max_tokens, max_rows, sort)]


def check_fits(encoded: Encoded, max_tokens: int) -> None:
    """A row longer than the job's budget is the job's mistake (exit 2), not a row error."""
    sizes = encoded.lengths + encoded.reserve
    if sizes.size and sizes.max() > max_tokens:
        raise JobError(
            f"[batching].max_tokens = {max_tokens} cannot hold a row of {sizes.max()} tokens; "
            "raise it, or lower [model].max_length"
        )


def distinct(encoded: Encoded) -> tuple[np.ndarray, np.ndarray | None]:
    """The units worth scoring: identical token ids are scored once, since every task's result
    depends on its input alone (seeded sampling seeds each row from its prompt). Returns them,
    and unit -> its scored twin when any repeat."""
    units = np.arange(len(encoded.lengths))
    if encoded.ids is None:
        return units, None
    keys = [ids.tobytes() for ids in encoded.ids]
    if encoded.type_ids is not None:  # a pair split elsewhere is another input
        keys = [key + types.tobytes() for key, types in zip(keys, encoded.type_ids, strict=True)]
    first, same_as = first_of_each(keys)
    return (first, same_as) if len(first) < len(units) else (units, None)


def windows(job: Job, chunks: list[Chunk], task: Task) -> Iterator[Window]:
    """Reader + tokenizer + sampler for every pending chunk (runs in the reader thread).

    A shard that fails reading yields one window carrying its error, and no more windows.
    """
    row_filter = RowFilter(job.input.where) if job.input.where is not None else None
    columns = input_columns(job)
    failed: set[int] = set()
    for chunk in chunks:
        if chunk.shard.index in failed:
            continue
        try:
            for rows in read_rows(chunk, columns, job.batching.window_rows, row_filter):
                yield encode_window(job, chunk, rows, task)
        except InputDataError as exc:
            failed.add(chunk.shard.index)
            yield Window(chunk, error=exc)


def encode_window(job: Job, chunk: Chunk, rows: Rows, task: Encoding) -> Window:
    """Tokenizer + sampler for one window of rows: encoded, repeats found, batches cut.

    ``task`` is the adapter, or (`batchscore plan`) its encoding alone, without weights. Under
    ``on_error = "fail"`` a row that cannot be encoded fails the window (`InputDataError`).
    """
    max_tokens = job.batching.max_tokens
    encoded = task.encode(rows.table)
    if encoded.errors and job.output.on_error == "fail":
        row, message = min(encoded.errors.items())
        raise InputDataError(f"{chunk.shard.path}: row {rows.shard_row(row)}, {message}")
    check_fits(encoded, max_tokens)
    units, same_as = distinct(encoded)
    sort = job.batching.sort and task.bucketing
    cut = batches(encoded, units, max_tokens, max_rows=job.batching.max_rows, sort=sort)
    return Window(chunk, rows, encoded, units, same_as, cut, max_tokens)


def sample_rows(job: Job, rows: int) -> pa.Table:
    """The job's first ``rows`` input rows that pass `where` (only the columns a run reads),
    across shards in order, read by the run's own reader."""
    row_filter = RowFilter(job.input.where) if job.input.where is not None else None
    columns = input_columns(job)
    parts, count = [], 0
    for shard in find_shards(job.input):
        for chunk in chunks_of(shard, open_shard(shard).metadata.num_rows, job.output.chunk_rows):
            for window in read_rows(chunk, columns, rows, row_filter):
                parts.append(window.table.slice(0, rows - count))
                count += parts[-1].num_rows
                if count >= rows:
                    return pa.concat_tables(parts)
    return pa.concat_tables(parts) if parts else pa.table({c: [] for c in columns})
