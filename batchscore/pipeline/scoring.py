"""Scoring in the model's thread: a window's batches through the model, surviving out-of-memory,
and the results turned into output rows in input order (`Scorer`, one per loaded model).

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
from batchscore.errors import InputDataError
from batchscore.job.sections import Job
from batchscore.models.base import Task
from batchscore.observe.progress import Progress
from batchscore.observe.report import RunStats
from batchscore.output.pending import Chunk
from batchscore.pipeline.assemble import assemble
from batchscore.pipeline.continuous import run_stream, streams
from batchscore.pipeline.executor import Executor
from batchscore.pipeline.sampler import padded_tokens, restore
from batchscore.pipeline.stages import Part, Scored, Window, batches, windows

log = logging.getLogger("batchscore")
NON_FINITE = "non-finite output (NaN or inf) from the model"


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


@dataclass
class Outcome:
    """A window's model results in unit order, and the window rows that failed in the model."""

    results: Any
    errors: dict[int, str] = field(default_factory=dict)
    batches: list[np.ndarray] = field(default_factory=list)


def run_window(
    window: Window,
    cut: list[np.ndarray],
    *,
    task: Task,
    executor: Executor,
    budget: Budget,
    max_rows: int,
    progress: Progress,
) -> Outcome:
    """Run every batch; on out-of-memory, re-plan what is left under a smaller budget.

    When the window has repeats (``same_as``: unit -> the identical unit that is scored for
    it), batches cover only the distinct units and each duplicate gets its twin's result (and
    its twin's failure). Units whose result is known (`Window.known`) take it as it is, checked
    like any batch's.
    """
    encoded, same_as = window.encoded, window.same_as
    rows_per_unit = window.table.num_rows / max(len(window.units), 1)
    sizes = encoded.lengths + encoded.reserve
    queue, done, outputs = list(cut), [], []
    failed: dict[int, str] = {}  # unit -> why it has no result
    known = window.known
    if known is not None and len(known):  # taken as they are, checked as any batch's are
        done.append(known)
        outputs.append(window.known_results)
        failed.update(dict.fromkeys(non_finite(window.known_results, known), NON_FINITE))
        progress.advance(rows_per_unit * len(known), int(encoded.lengths[known].sum()))
    lost: list[int] = []  # units the model produced nothing for (a stand-in keeps their place)
    while queue:
        batch = queue.pop(0)
        padded = padded_tokens(sizes, [batch])
        try:
            faults.hit("model-batch", tokens=padded)
            out = executor.run(lambda batch=batch: task.forward(encoded, batch))
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            executor.release_memory()
            if len(batch) == 1:
                failed[int(batch[0])] = "out of memory even as a batch of one row"
                lost.append(int(batch[0]))
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
                rest = np.concatenate(queue)
                queue = batches(encoded, rest, budget.max_tokens, max_rows=max_rows, sort=True)
            queue[:0] = [batch[:half], batch[half:]]
            continue
        failed.update(dict.fromkeys(non_finite(out, batch), NON_FINITE))
        outputs.append(out)
        done.append(batch)
        progress.advance(rows_per_unit * len(batch), int(encoded.lengths[batch].sum()))
    if same_as is not None and failed:  # a duplicate of a row that failed fails too
        failed = {u: failed[int(t)] for u, t in enumerate(same_as) if int(t) in failed}
    errors: dict[int, str] = {}
    for unit, why in failed.items():
        errors.setdefault(int(encoded.rows[encoded.owners[unit]]), why)
    ran = done[1:] if known is not None and len(known) else list(done)
    if lost:
        if not outputs:  # every unit failed: there is nothing to assemble
            return Outcome(None, errors, ran)
        # a stand-in result keeps every unit in place; its row is nulled and reported
        outputs.append(np.repeat(outputs[0][:1], len(lost), axis=0))
        done.append(np.asarray(lost))
    empty = np.empty((0,), dtype=np.float32)
    results = restore(done, outputs, empty, size=len(encoded.lengths))
    if same_as is not None and len(results):
        results = results[same_as]
    return Outcome(results, errors, ran)


def non_finite(out: Any, batch: np.ndarray) -> list[int]:
    """The units of ``batch`` whose numeric output holds NaN or inf (never written as a score)."""
    if not isinstance(out, np.ndarray) or out.dtype.kind not in "fc" or not len(out):
        return []  # generated tokens, say: nothing to be non-finite
    finite = np.isfinite(out.reshape(len(out), -1)).all(axis=1)
    return [int(u) for u in batch[~finite]]


def count(stats: RunStats, window: Window, ran: list[np.ndarray]) -> None:
    """Add a scored window to the run's counters.

    ``tokens`` counts every unit's tokens (the work delivered); ``computed_tokens`` and
    ``padded_tokens`` only the units the model ran, so repeats skipped are not padding.
    """
    encoded = window.encoded
    units = np.concatenate(ran) if ran else np.empty(0, dtype=np.int64)
    stats.rows += window.table.num_rows
    stats.units += len(encoded.lengths)
    stats.duplicates += len(encoded.lengths) - len(window.units)
    stats.from_gate += 0 if window.known is None else len(window.known)
    stats.tokens += int(encoded.lengths.sum())
    stats.computed_tokens += int(encoded.lengths[units].sum())
    stats.padded_tokens += padded_tokens(encoded.lengths, ran)
    stats.batches += len(ran)
    stats.truncated += encoded.truncated
    stats.chunked += encoded.chunked
    stats.windows += encoded.windows
    stats.shape.add(encoded.lengths, ran)


class Scorer:
    """The model's thread: turns a window of rows into output rows (`Scored`)."""

    def __init__(
        self, job: Job, task: Task, executor: Executor, *, stats: RunStats, progress: Progress
    ) -> None:
        self.job, self.task, self.executor = job, task, executor
        self.stats, self.progress = stats, progress
        self.budget = Budget(job.batching.max_tokens)
        self.skip = job.output.on_error == "skip"

    def __call__(self, window: Window) -> list[Scored]:
        """One `Scored` per part of the window, in order: each chunk's output rows, or (under
        ``on_error = "fail"``) the error of the first row of its shard that failed."""
        if window.error is not None:
            return [Scored(window.chunk, error=window.error)]
        encoded = window.encoded
        max_tokens = self.budget.for_shard(window.chunk.shard.index)
        cut = window.batches
        if max_tokens < window.cut_for:  # an earlier out-of-memory shrank the budget
            sort = self.job.batching.sort and self.task.bucketing
            cut = batches(encoded, window.pending, max_tokens, max_rows=self.max_rows, sort=sort)
        outcome = self.run(window, cut, max_tokens)
        if not len(encoded.lengths):
            self.progress.advance(window.table.num_rows, 0)
        errors = {**encoded.errors, **outcome.errors}
        columns = {} if outcome.results is None else self.task.finish(encoded, outcome.results)
        table = assemble(
            window.table,
            columns,
            carried=self.job.input.carried,
            fields=self.task.columns,
            encoded_rows=encoded.rows,
            errors=errors,
            with_error_column=self.skip,
        )
        count(self.stats, window, outcome.batches)
        scored = [self.part(window, part, table, errors) for part in window.parts]
        for early in scored[:-1]:
            early.more = True  # the window's chunks are ready together: one group commit
        return scored

    def part(self, window: Window, part: Part, table: pa.Table, errors: dict[int, str]) -> Scored:
        """A part's rows of the window's output, or its shard's first failed row's error."""
        own = {r: m for r, m in errors.items() if part.start <= r < part.stop}
        if own and not self.skip:
            row, message = min(own.items())
            return Scored(part.chunk, error=InputDataError(f"{window.where(row)}, {message}"))
        rows = table.slice(part.start, part.stop - part.start)
        return Scored(part.chunk, rows, self.rejected(window, part, own), read=part.rows.read)

    def run(self, window: Window, cut: list[np.ndarray], max_tokens: int) -> Outcome:
        """The window's units through the model: continuously batched where the task can, else
        (or after an out-of-memory there) in the static batches ``cut``."""
        if cut and streams(self.task, enabled=self.job.batching.continuous):
            limits, reuse = (max_tokens, self.max_rows), self.job.batching.prefix_cache
            try:
                results, prefills = run_stream(window, cut, task=self.task, executor=self.executor,
                                               limits=limits, reuse_prefix=reuse,
                                               progress=self.progress)  # fmt: skip
                return Outcome(results, {}, prefills)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                self.executor.release_memory()
                log.warning("out of memory in continuous batching; this window runs statically")
        return run_window(window, cut, task=self.task, executor=self.executor, budget=self.budget,
                          max_rows=self.max_rows, progress=self.progress)  # fmt: skip

    @property
    def max_rows(self) -> int:
        return self.job.batching.max_rows

    def rejected(self, window: Window, part: Part, errors: dict[int, str]) -> pa.Table | None:
        """A part's rows recorded with an error, listed for `_batchscore/rejected/`."""
        if not errors:
            return None
        rows = sorted(errors)
        listing = {
            "shard": [part.chunk.shard.path] * len(rows),
            "row": [part.rows.shard_row(r - part.start) for r in rows],
        }
        if self.job.input.id:
            listing["id"] = window.table.column(self.job.input.id).take(rows)
        listing["error"] = [errors[r] for r in rows]
        return pa.table(listing)


def score_chunk(job: Job, chunk: Chunk, scorer: Scorer) -> list[Scored]:
    """Every window of one chunk, scored: the unit of work a remote engine's worker returns.

    The list ends at the first failed window (the shard's error), as the local stream does.
    """
    parts = []
    for window in windows(job, [chunk], scorer.task):
        parts += scorer(window)
        if parts[-1].error is not None:
            break
    return parts
