"""Scoring one window in the model's thread: run its batches, survive out-of-memory, and turn the
results into output rows in input order.

Out of memory is not fatal: the batch is re-planned under half the padded tokens it had, the
smaller budget holds for the rest of the shard, and a single row that cannot fit even alone
becomes that row's error. Rows are never dropped: every row leaves with an output or an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from batchscore import faults
from batchscore.config import BatchingConfig
from batchscore.executor import Executor
from batchscore.models import Encoded, Task
from batchscore.report import Progress, RunStats
from batchscore.sampler import padded_tokens, plan_batches, restore

log = logging.getLogger("batchscore")


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator giving up."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


@dataclass
class Budget:
    """The token budget in force; it shrinks after an out-of-memory and resets per shard."""

    configured: int
    max_tokens: int = 0
    shard: int = -1

    def for_shard(self, shard: int) -> int:
        if shard != self.shard:
            self.shard, self.max_tokens = shard, self.configured
        return self.max_tokens


def cut(
    sizes: np.ndarray, units: np.ndarray, max_tokens: int, max_rows: int, sort: bool = True
) -> list[np.ndarray]:
    """Batches of ``units`` under a (shrunk) budget; a unit longer than it runs alone."""
    clipped = np.minimum(sizes[units], max_tokens)  # too long: fills a batch by itself
    return [units[b] for b in plan_batches(clipped, max_tokens, max_rows, sort)]


@dataclass
class Outcome:
    """A window's model results in unit order, and the window rows that failed in the model."""

    results: Any
    errors: dict[int, str] = field(default_factory=dict)
    batches: list[np.ndarray] = field(default_factory=list)


def run_window(
    encoded: Encoded,
    batches: list[np.ndarray],
    task: Task,
    executor: Executor,
    budget: Budget,
    batching: BatchingConfig,
    progress: Progress,
    rows_per_unit: float,
    same_as: np.ndarray | None = None,
) -> Outcome:
    """Run every batch; on out-of-memory, re-plan what is left under a smaller budget.

    With ``same_as`` (unit -> the identical unit that is scored for it), batches cover only
    the distinct units and each duplicate gets its twin's result (and its twin's failure).
    """
    sizes = encoded.lengths + encoded.reserve
    queue, done, outputs, failed = list(batches), [], [], []
    while queue:
        batch = queue.pop(0)
        padded = padded_tokens(sizes, [batch])
        try:
            faults.hit("model-batch", tokens=padded)
            outputs.append(executor.run(lambda batch=batch: task.forward(encoded, batch)))
            done.append(batch)
            progress.advance(rows_per_unit * len(batch), int(encoded.lengths[batch].sum()))
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            executor.release_memory()
            if len(batch) == 1:
                failed.append(int(batch[0]))
                progress.advance(rows_per_unit, 0)
                continue
            # Halve this batch for sure (so the loop always ends), and re-cut what is still
            # queued under the smaller budget, which also holds for the rest of the shard.
            budget.max_tokens = max(1, padded // 2)
            log.warning(
                "out of memory on %d rows x %d tokens; budget now %d tokens",
                len(batch), padded // len(batch), budget.max_tokens,
            )  # fmt: skip
            half = len(batch) // 2
            if queue:
                queue = cut(sizes, np.concatenate(queue), budget.max_tokens, batching.max_rows)
            queue[:0] = [batch[:half], batch[half:]]
    units = len(encoded.lengths)
    if same_as is not None and failed:  # a duplicate of a row that failed fails too
        failed = np.flatnonzero(np.isin(same_as, failed)).tolist()
    errors = {
        int(encoded.rows[encoded.owners[u]]): "out of memory even as a batch of one row"
        for u in failed
    }
    ran = list(done)
    if failed:
        if not outputs:  # every unit failed: there is nothing to assemble
            return Outcome(None, errors, ran)
        # a stand-in result keeps every unit in place; its row is nulled and reported
        outputs.append(np.repeat(outputs[0][:1], len(failed), axis=0))
        done.append(np.asarray(failed))
    empty = np.empty((0,), dtype=np.float32)
    results = restore(done, outputs, empty, size=units)
    if same_as is not None and len(results):
        results = results[same_as]
    return Outcome(results, errors, ran)


def assemble(
    table: pa.Table,
    carried: tuple[str, ...],
    columns: dict[str, pa.Array],
    fields: list[pa.Field],
    encoded_rows: np.ndarray,
    errors: dict[int, str],
    with_error_column: bool,
) -> pa.Table:
    """Output rows in input order: carried columns, task columns (null for failed rows), error."""
    n = table.num_rows
    position = np.full(n, -1, dtype=np.int64)
    position[encoded_rows] = np.arange(len(encoded_rows))
    position[list(errors)] = -1
    take = pa.array(position, mask=position < 0)
    in_place = not errors and len(encoded_rows) == n
    out = table.select(list(carried))
    for f in fields:
        if f.name not in columns:
            values = pa.nulls(n, f.type)
        else:
            values = columns[f.name] if in_place else columns[f.name].take(take)
        out = out.append_column(f, values)
    if with_error_column:
        messages = [errors.get(i) for i in range(n)]
        out = out.append_column(pa.field("error", pa.string()), pa.array(messages, pa.string()))
    return out


def count(
    stats: RunStats, encoded: Encoded, batches: list[np.ndarray], rows: int, distinct: int
) -> None:
    """Add a scored window to the run's counters.

    ``tokens`` counts every unit's tokens (the work delivered); ``computed_tokens`` and
    ``padded_tokens`` only the units the model ran, so repeats skipped are not padding.
    """
    ran = np.concatenate(batches) if batches else np.empty(0, dtype=np.int64)
    stats.rows += rows
    stats.units += len(encoded.lengths)
    stats.duplicates += len(encoded.lengths) - distinct
    stats.tokens += int(encoded.lengths.sum())
    stats.computed_tokens += int(encoded.lengths[ran].sum())
    stats.padded_tokens += padded_tokens(encoded.lengths, batches)
    stats.batches += len(batches)
    stats.truncated += encoded.truncated
