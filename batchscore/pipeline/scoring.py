"""Scoring in the model's thread: a window's batches through the model (`static.run_window`, or
`continuous.run_stream` for generation), the results turned into output rows in input order
(`Scorer`, one per loaded model) and handed on to the writer, one `Scored` per part.

A window of many small shards holds many parts, and a part is complete once its own rows are
scored. The scorer hands complete parts on a few times while the model runs the rest of the
window (`Handoff`), so the writer commits them beside the model rather than after it: with
thousands of one-row shards in a window, those commits would otherwise all wait for its end.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable

import numpy as np
import pyarrow as pa

from batchscore.errors import InputDataError
from batchscore.job.sections import BatchingConfig, InputConfig
from batchscore.models.base import USAGE, Task
from batchscore.observe.progress import Progress
from batchscore.observe.run_stats import RunStats
from batchscore.pipeline.assemble import assemble
from batchscore.pipeline.batching import Batching
from batchscore.pipeline.continuous import run_stream, streams
from batchscore.pipeline.pace import Pace
from batchscore.pipeline.sampler import padded_tokens
from batchscore.pipeline.static import Budget, Outcome, Ran, run_window
from batchscore.runtime.device import is_out_of_memory
from batchscore.runtime.executor import Executor
from batchscore.work.row_errors import COLUMN, rejected
from batchscore.work.units import Part, Scored, Window

log = logging.getLogger("batchscore")
HANDOFFS = 8  # times per window the complete parts are handed on while the model runs the rest
Hand = Callable[[list[Scored]], None]  # takes the `Scored` parts of a window, in one call


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
        self,
        task: Task,
        executor: Executor,
        *,
        inp: InputConfig,
        batching: BatchingConfig,
        on_error: str,
        stats: RunStats,
        progress: Progress,
        pace: Pace | None = None,
    ) -> None:
        """``inp``: the `[input]` section (the columns carried to the output, the id rows are
        named by); ``batching``: `[batching]`; ``on_error``: `[output].on_error`; ``pace``
        learns how long each window took (the reader sizes windows by it)."""
        self.task, self.executor = task, executor
        self.inp, self.batching = inp, batching
        self.stats, self.progress, self.pace = stats, progress, pace
        self.budget = Budget(Batching.of(batching, task))
        self.skip = on_error == "skip"
        self.usage = tuple(f.name for f in task.columns if f.name in USAGE)  # the run counts

    def __call__(self, window: Window, hand: Hand) -> None:
        """Hand on one `Scored` per part of the window, each once: a chunk's output rows, or
        (under ``on_error = "fail"``) the error of the first row of its shard that failed.
        Parts complete early may go first (see the module's note); the rest follow in order."""
        started = time.monotonic()  # each part says it: the committer's clock (`commit_s`)
        if window.error is not None:
            hand([Scored(window.chunk, error=window.error, started=started)])
            if self.pace is not None:
                self.pace.took(0, 0)  # nothing to measure: the reader goes on
            return
        policy = self.budget.for_shard(window.chunk.shard.index)
        cut = window.batches
        if policy.max_tokens < window.cut_for:  # an earlier out-of-memory shrank the budget
            cut = policy.batches(window.encoded, window.pending)
        handoff = Handoff(self, window, hand, batches=len(cut), started=started)
        read = sum(p.rows.read for p in window.parts)

        def after_batch(ran: Ran) -> None:
            handoff(ran)
            if self.pace is not None and self.pace.rate is None:  # its first batch: the pace
                share = ran.share_run()
                if share > 0:
                    self.pace.took(round(read * share), time.monotonic() - started)

        outcome = self.run(window, cut, policy, after_batch=after_batch)
        if not len(window.encoded.lengths):
            self.progress.advance(window.table.num_rows, 0)
        count(self.stats, window, outcome.batches)
        handoff.rest(outcome)
        if self.pace is not None:
            self.pace.took(read, time.monotonic() - started)

    def output(self, window: Window, outcome: Outcome) -> tuple[pa.Table, dict[int, str]]:
        """The window's output rows from the model's results, and the rows that failed."""
        encoded = window.encoded
        errors = {**encoded.errors, **outcome.errors}
        columns = {}
        if outcome.results is not None:  # the task's columns, then its usage if it counts
            columns = self.task.finish(encoded, outcome.results)
            failed = columns.pop(COLUMN, None)  # rows the model ran whose result is no value
            if failed is not None:
                messages = failed.to_pylist()
                errors |= {int(encoded.rows[i]): m for i, m in enumerate(messages) if m is not None}
            columns |= self.task.usage(encoded, outcome.results)
        table = assemble(
            window.table,
            columns,
            carried=self.inp.carried,
            fields=self.task.columns,
            encoded_rows=encoded.rows,
            errors=errors,
            with_error_column=self.skip,
        )
        return table, errors

    def part(
        self,
        window: Window,
        part: Part,
        table: pa.Table,
        errors: dict[int, str],
        *,
        started: float | None = None,
    ) -> Scored:
        """A part's rows of the window's output, or its shard's first failed row's error;
        ``started``: when the model began the window."""
        own = {r: m for r, m in errors.items() if part.start <= r < part.stop}
        if own and not self.skip:
            row, message = min(own.items())
            error = InputDataError(f"{window.where(row)}, {message}")
            return Scored(part.chunk, error=error, started=started)
        rows = table.slice(part.start, part.stop - part.start)
        self.stats.used(rows, self.usage)
        rejected = self.rejected(window, part, own)
        return Scored(part.chunk, rows, rejected, read=part.rows.read, started=started)

    def run(
        self,
        window: Window,
        cut: list[np.ndarray],
        policy: Batching,
        after_batch: Callable[[Ran], None],
    ) -> Outcome:
        """The window's units through the model: continuously batched where the task can (under
        ``policy``'s limits, the shard's in force), else (or after an out-of-memory there) in
        the static batches ``cut``."""
        if cut and streams(self.task, enabled=self.batching.continuous):
            try:
                results, prefills = run_stream(
                    window,
                    cut,
                    task=self.task,
                    executor=self.executor,
                    policy=policy,
                    reuse_prefix=self.batching.prefix_cache,
                    progress=self.progress,
                )
                return Outcome(results, {}, prefills)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                self.executor.release_memory()
                log.warning("out of memory in continuous batching; this window runs statically")
        return run_window(
            window,
            cut,
            task=self.task,
            executor=self.executor,
            budget=self.budget,
            progress=self.progress,
            after_batch=after_batch,
        )

    def rejected(self, window: Window, part: Part, errors: dict[int, str]) -> pa.Table | None:
        """A part's rows recorded with an error, listed for `_batchscore/rejected/`."""
        if not errors:
            return None
        rows = sorted(errors)
        shard_rows = [part.rows.shard_row(r - part.start) for r in rows]
        column = self.inp.id
        ids = window.table.column(column).take(rows) if column else None
        return rejected(part.chunk.shard.path, shard_rows, [errors[r] for r in rows], ids)


def score_chunk(windows: Iterable[Window], scorer: Scorer) -> list[Scored]:
    """Every window of one chunk (`stages.windows` of it alone), scored: the unit of work a
    remote engine's worker returns.

    The list ends at the first failed window (the shard's error), as the local stream does.
    """
    parts: list[Scored] = []
    for window in windows:
        scorer(window, parts.extend)
        if parts[-1].error is not None:
            break
    return parts


class Handoff:
    """Hands a window's parts on as they complete: a few times while the model runs (after every
    ``batches / HANDOFFS`` batches, each part once its units are done), the rest at the end.

    Each early handoff finishes and assembles the whole window from what is done so far (units
    not yet run hold stand-ins that no part handed on contains), so it is done only a few times
    per window, and only for windows of more than one part.
    """

    def __init__(
        self, scorer: Scorer, window: Window, hand: Hand, *, batches: int, started: float
    ) -> None:
        self.scorer, self.window, self.hand, self.started = scorer, window, hand, started
        self.sent = np.zeros(len(window.parts), dtype=bool)
        self.every = math.ceil(batches / HANDOFFS) if len(window.parts) > 1 else 0
        self.seen = 0
        encoded = window.encoded
        starts = np.array([p.start for p in window.parts])
        rows = encoded.rows[encoded.owners]  # each unit's window row
        self.part_of = np.searchsorted(starts, rows, side="right") - 1  # ... and its part

    def __call__(self, ran: Ran) -> None:
        """After a batch: hand on the parts that are complete now, if it is time to look."""
        self.seen += 1
        if not self.every or self.seen % self.every or not ran.outputs:
            return
        waiting = np.zeros(len(self.sent), dtype=bool)
        waiting[self.part_of[~ran.finished()]] = True
        ready = np.flatnonzero(~waiting & ~self.sent)
        if len(ready):
            self.send(ran.outcome(), ready)

    def rest(self, outcome: Outcome) -> None:
        """At the window's end: every part not handed on yet, in order."""
        self.send(outcome, np.flatnonzero(~self.sent))

    def send(self, outcome: Outcome, ready: np.ndarray) -> None:
        if not len(ready):
            return
        window, scorer = self.window, self.scorer
        table, errors = scorer.output(window, outcome)
        parts = [window.parts[i] for i in ready]
        self.hand([scorer.part(window, p, table, errors, started=self.started) for p in parts])
        self.sent[ready] = True
