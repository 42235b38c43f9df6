"""The scorer hands a window's complete parts on while the model runs the rest: every part once,
each with the rows its own units gave, however the window's parts and batches fall."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.api import data_job
from batchscore.job.sections import Job
from batchscore.observe.run_stats import RunStats
from batchscore.pipeline.batching import Batching
from batchscore.pipeline.scoring import HANDOFFS, Scorer
from batchscore.pipeline.stages import encode
from batchscore.runtime.executor import Executor
from batchscore.work.units import Chunk, Encoded, Part, Rows, Scored, Shard, Window
from tests.pipeline.test_known import QUIET, SCHEMA, Sums


class Summed(Sums):
    """`Sums` with an output column: each row's sum, as a real task's `finish` gives it."""

    def __init__(self) -> None:
        self.columns = [pa.field("sum", pa.float64())]

    def finish(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        return {"sum": pa.array(np.asarray(results, dtype=np.float64))}

    def usage(self, encoded: Encoded, results: np.ndarray) -> dict[str, pa.Array]:
        return {}  # counts nothing, as a task whose job leaves [output].usage off


def scorer_for(job: Job, task: Summed) -> Scorer:
    """The scorer a run of ``job`` builds, on the real executor."""
    return Scorer(
        task,
        Executor(job.model),
        inp=job.input,
        batching=job.batching,
        on_error=job.output.on_error,
        stats=RunStats(),
        progress=QUIET,
    )


def window_of(texts: list[str], sizes: list[int]) -> Window:
    """``texts`` cut into consecutive parts of ``sizes`` rows, each part one shard's only chunk."""
    parts, start = [], 0
    for i, size in enumerate(sizes):
        shard = Shard(i, f"shard-{i}.parquet", 0, 0)
        rows = Rows(pa.table({"text": texts[start : start + size]}, schema=SCHEMA), 0, size)
        parts.append(Part(Chunk(shard, 0, 0, size, 1), rows, start))
        start += size
    return Window(parts, pa.concat_tables([p.rows.table for p in parts]))


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=40),
    letters=st.lists(
        st.sampled_from(["a", "bb", "ccc", "e" * 9, "fff", "gg", "h" * 20]),
        min_size=240,
        max_size=240,
    ),
    max_rows=st.integers(1, 8),
)
def test_every_part_is_handed_on_once_with_its_own_rows(sizes, letters, max_rows):
    texts = letters[: sum(sizes)]
    task = Summed()
    options = {"max_tokens": 64, "max_rows": max_rows, "precision": "fp32"}
    job = data_job(task="embed", model=None, text="text", options=options)
    policy = Batching.of(job.batching, task)
    window = encode(window_of(texts, sizes), task, policy, job.output.on_error)
    handoffs: list[list[Scored]] = []
    scorer = scorer_for(job, task)
    scorer(window, handoffs.append)
    handed = [s for h in handoffs for s in h]
    assert sorted(s.chunk.shard.index for s in handed) == list(range(len(sizes)))
    assert len(handoffs) <= HANDOFFS + 1 and all(handoffs)
    for scored in handed:
        part = window.parts[scored.chunk.shard.index]
        expected = [float(sum(t.encode())) for t in texts[part.start : part.stop]]
        assert scored.error is None and scored.table["sum"].to_pylist() == expected


def test_parts_complete_early_go_before_the_window_ends():
    """Many one-row parts over many batches: most are handed on before the last batch runs."""
    texts = [f"{i}" + "x" * (i % 7) for i in range(64)]  # distinct: no repeats to share
    task = Summed()
    job = data_job(task="embed", model=None, text="text",
                   options={"max_tokens": 64, "max_rows": 4, "precision": "fp32"})  # fmt: skip
    policy = Batching.of(job.batching, task)
    window = encode(window_of(texts, [1] * len(texts)), task, policy, job.output.on_error)
    handoffs: list[list[Scored]] = []
    scorer_for(job, task)(window, handoffs.append)
    assert len(window.batches) >= HANDOFFS and len(handoffs) > 1
    assert sum(len(h) for h in handoffs[:-1]) >= len(texts) // 2
