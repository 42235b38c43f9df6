"""In-memory input: a table scored like one shard of a job, with nothing read or written on disk.

The rows go through the run's own stages (`stages.encode_window`: tokenizer, repeats, sampler;
`scoring.Scorer`: the model, out-of-memory splitting, rows back in input order), a window at a
time, so `batchscore.score` batches, pads and fails rows exactly as a job would.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from batchscore.job.sections import BatchingConfig, InputConfig
from batchscore.models.base import Task
from batchscore.observe.progress import Progress
from batchscore.observe.run_stats import RunStats
from batchscore.pipeline.batching import Batching
from batchscore.pipeline.known import Known
from batchscore.pipeline.scoring import Scorer
from batchscore.pipeline.stages import encode_window, window_rows
from batchscore.runtime.executor import Executor
from batchscore.work.row_errors import error_fields
from batchscore.work.units import Chunk, Rows, Scored, Shard, Window

MEMORY = "the data"  # how messages name the in-memory input: "the data: row 3, column 'text'"
MEMORY_SHARD = Shard(0, MEMORY, 0, 0)


def memory_windows(
    table: pa.Table,
    task: Task,
    *,
    batching: BatchingConfig,
    on_error: str,
    known: Known | None = None,
) -> Iterator[Window]:
    """The table as one chunk's windows of `[batching].window_rows` rows, encoded and cut;
    units whose result is ``known`` are not batched."""
    chunk = Chunk(MEMORY_SHARD, 0, 0, table.num_rows, 1)
    step, policy = window_rows(task, batching), Batching.of(batching, task)
    for start in range(0, table.num_rows, step):
        rows = Rows(table.slice(start, step), offset=start, read=min(step, table.num_rows - start))
        yield encode_window(chunk, rows, task, policy, on_error, known)


def score_table(
    table: pa.Table,
    *,
    task: Task,
    executor: Executor,
    inp: InputConfig,
    batching: BatchingConfig,
    on_error: str,
    progress: Progress,
    known: Known | None = None,
) -> tuple[pa.Table, RunStats]:
    """The task's columns (and ``error`` under ``on_error = "skip"``) for every row of
    ``table``, in its order; a row that fails under ``on_error = "fail"`` raises
    `InputDataError` naming it. Also returns the counters (tokens, padding) of the work.
    ``known``: results the model gave before (its quality gate's), not scored again."""
    stats = RunStats()
    scorer = Scorer(
        task,
        executor,
        inp=inp,
        batching=batching,
        on_error=on_error,
        stats=stats,
        progress=progress,
    )
    parts = []
    for window in memory_windows(table, task, batching=batching, on_error=on_error, known=known):
        scored: list[Scored] = []
        scorer(window, scored.extend)
        (one,) = scored  # one chunk: one part
        if one.error is not None:
            raise one.error
        parts.append(one.table)
    if not parts:
        fields = [*task.columns, *error_fields(on_error)]
        return pa.schema(fields).empty_table(), stats
    return pa.concat_tables(parts), stats
