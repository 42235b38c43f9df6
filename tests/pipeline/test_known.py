"""The quality gate's results for the first rows are the run's, not scored a second time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.api import data_job
from batchscore.job.parse import load_job
from batchscore.observe.figures import page_numbers
from batchscore.observe.html import render
from batchscore.observe.progress import Progress
from batchscore.observe.run_stats import summary
from batchscore.pipeline.batching import Batching
from batchscore.pipeline.known import Known, unit_keys
from batchscore.pipeline.score_table import MEMORY_SHARD
from batchscore.pipeline.stages import encode_window
from batchscore.pipeline.static import Budget, run_window
from batchscore.recipes.run import run_job
from batchscore.runtime.executor import Executor
from batchscore.work.units import Chunk, Encoded, Rows
from tests.conftest import read_output
from tests.reliability import make_job


class Sums:
    """A task whose result for a text is the sum of its characters' codes: cheap, exact and a
    function of the input alone, as every real task's is (so repeats may share a result)."""

    inputs = ("text",)
    bucketing = True

    def encode(self, table: pa.Table) -> Encoded:
        ids = [np.frombuffer(t.encode(), dtype=np.uint8).astype(np.int64) for t in
               table["text"].to_pylist()]  # fmt: skip
        rows = np.arange(len(ids))
        lengths = np.array([max(len(i), 1) for i in ids], dtype=np.int64)
        return Encoded(lengths, rows, rows, ids=ids)

    def forward(self, encoded: Encoded, batch: np.ndarray) -> np.ndarray:
        return np.array([float(encoded.ids[u].sum()) for u in batch])


QUIET = Progress(0, "off")
SCHEMA = pa.schema([("text", pa.string())])
TEXTS = st.lists(st.sampled_from(["a", "bb", "ccc", "dd", "e" * 9, "fff", "gg"]), max_size=60)


@settings(max_examples=200, deadline=None)
@given(texts=TEXTS, sample=st.integers(0, 20), window_rows=st.integers(1, 25))
def test_each_known_result_is_given_once_and_no_unit_is_scored_twice(texts, sample, window_rows):
    """Known results (marked: the true value + 0.5) go to the first window that meets their
    input, to all its repeats there, and to no later window; no batch holds a known unit; every
    other row gets the value its own batch computed."""
    task = Sums()
    job = data_job(task="embed", model=None, text="text",
                   options={"max_tokens": 64, "max_rows": 4, "window_rows": window_rows,
                            "precision": "fp32"})  # fmt: skip
    executor = Executor(job.model)
    gate = task.encode(pa.table({"text": texts[:sample]}, schema=SCHEMA))
    known = Known.of(gate, task.forward(gate, np.arange(len(gate.lengths))) + 0.5)
    offered, taken = set(texts[:sample]), set()
    chunk = Chunk(MEMORY_SHARD, 0, 0, len(texts), 1)
    policy = Batching.of(job.batching, task)
    for start in range(0, len(texts), window_rows):
        here = texts[start : start + window_rows]
        rows = Rows(pa.table({"text": here}, schema=SCHEMA), offset=start, read=len(here))
        window = encode_window(chunk, rows, task, policy, job.output.on_error, known)
        outcome = run_window(
            window,
            window.batches,
            task=task,
            executor=executor,
            budget=Budget(policy),
            progress=QUIET,
        )
        given_units = [] if window.known is None else window.known.tolist()
        given_now = {here[u] for u in given_units}
        assert given_now == (set(here) & offered) - taken
        ran = np.concatenate(outcome.batches).tolist() if outcome.batches else []
        assert not set(ran) & set(given_units) and len(ran) == len(set(ran))
        for row, text in enumerate(here):
            value = float(sum(text.encode()))
            assert outcome.results[row] == (value + 0.5 if text in given_now else value)
        taken |= given_now
    assert taken == offered


def test_known_results_are_taken_once_and_never_for_rows_without_token_ids():
    task = Sums()
    gate = task.encode(pa.table({"text": ["ab", "c"]}))
    known = Known.of(gate, np.array([1.0, 2.0]))
    later = task.encode(pa.table({"text": ["c", "zz", "ab", "c"]}))
    units, results = known.take(unit_keys(later), np.array([0, 1, 2]))
    assert units.tolist() == [0, 2] and results.tolist() == [2.0, 1.0]
    assert not known  # both given: nothing is left to take
    assert known.take(unit_keys(later), np.array([3]))[0].size == 0
    rows = Encoded(np.ones(2, dtype=np.int64), np.arange(2), np.arange(2))  # a tensor's rows
    assert Known.of(rows, np.array([1.0, 2.0])) is None


def test_a_new_output_folders_run_takes_the_gates_results(tmp_path: Path, small_corpus):
    """The real MiniLM: the gate scores the first 40 rows (max_tokens = "auto" times budgets
    with the model it gated); the run scores only the other 50, and every row's embedding is
    the one a run without a gate writes."""
    job = make_job(tmp_path, small_corpus.slice(0, 90))
    gated = ["batching.max_tokens=auto", "quality.sample_rows=40"]
    report = run_job(load_job(job, gated))
    assert report["from_gate"] == 40 and report["rows"] == 90
    # the 40 were not computed again: every unit is in one batch, the gate's pass or the run's
    assert sum(rows for _, _, rows, _ in report["shape"]["batches"]) == report["units"] == 90
    assert "40 inputs scored by its pass, not again" in summary(report)
    assert "40 inputs scored by its pass, not again" in render(page_numbers(report, {"shards": []}))
    plain = run_job(load_job(job, ['output.path="plain"']))
    assert plain["from_gate"] == 0 and plain["computed_tokens"] == plain["tokens"]
    ours, theirs = read_output(tmp_path / "out"), read_output(tmp_path / "plain")
    assert ours["doc_id"].to_pylist() == theirs["doc_id"].to_pylist()
    a, b = (np.array(t["embedding"].to_pylist()) for t in (ours, theirs))
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() > 0.99999
