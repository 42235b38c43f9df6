"""Scoring a window with continuous batching, for tasks that can (decoder-only generation).

The sampler's batches still decide the order: their units, concatenated, are the queue rows
take seats from, so rows seated together are alike in prompt length. The task's scheduler
(`batchscore.models.generation.schedule`) yields each row as it finishes; this stage puts the
results back in unit order, as `scoring.run_window` does for static batches, so the writer sees
no difference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from batchscore.models.base import Task
from batchscore.observe.progress import Progress
from batchscore.pipeline.batching import Batching
from batchscore.runtime.executor import Executor
from batchscore.work.units import Window


def streams(task: Task, *, enabled: bool) -> bool:
    """Whether ``task`` should run its windows with continuous batching."""
    return enabled and bool(getattr(task, "continuous", False))


def run_stream(
    window: Window,
    cut: list[np.ndarray],
    *,
    task: Any,
    executor: Executor,
    policy: Batching,
    reuse_prefix: bool,
    progress: Progress,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Every unit of ``cut`` through the task's scheduler, seated under ``policy``'s budget
    and max_rows; returns the results in unit order (repeats given their twin's) and the units
    prefilled together in each call, which the run's counters treat as its batches."""
    encoded, same_as = window.encoded, window.same_as
    order = np.concatenate(cut) if cut else np.empty(0, dtype=np.int64)
    rows_per_unit = window.table.num_rows / max(len(window.units), 1)
    results = np.empty(len(encoded.lengths), dtype=object)
    schedule = task.stream(
        encoded,
        order,
        max_tokens=policy.max_tokens,
        max_rows=policy.max_rows,
        reuse_prefix=reuse_prefix,
    )

    def drain() -> None:
        for index, tokens in schedule:
            unit = int(order[index])
            results[unit] = tokens
            progress.advance(rows_per_unit, int(encoded.lengths[unit]))

    executor.run(drain)  # tokens arrive on the host as rows finish: each is a sync point
    known = window.known
    if known is not None and len(known):  # the gate's answers, taken as they are
        results[known] = window.known_results
        progress.advance(rows_per_unit * len(known), int(encoded.lengths[known].sum()))
    if same_as is not None and len(results):
        results = results[same_as]
    return results, [order[group] for group in schedule.prefills]
