"""Windows sized by the model's pace (`[output].commit_s`): each holds at most what the model
scores in a share of it, and cutting windows there loses, repeats and reorders no row."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscore.job.sections import BatchingConfig, InputConfig
from batchscore.pipeline.pace import SHARE, Pace
from batchscore.pipeline.stages import windows
from batchscore.work.units import Shard, chunks_of
from tests.pipeline.test_known import Sums


def test_the_first_windows_hold_one_batch_then_what_the_model_scores_in_a_share():
    pace = Pace(commit_s=8.0, first=16)
    assert pace.rows() == 16  # nothing measured yet
    pace.took(100, 2.0)  # 50 rows a second
    assert pace.rows() == 50 * 8 // SHARE
    pace.took(1, 1000.0)  # slower than a row a window
    assert pace.rows() == 1
    pace.took(0, 0.0)  # an empty window measures nothing
    assert pace.rows() == 1


def test_the_reader_sizes_no_second_window_before_the_first_is_measured():
    """A reader that ran ahead with unmeasured windows cut a short job into one-batch windows
    (twice the batches, 8 % slower at 3,640 texts): the second waits for the pace."""
    pace = Pace(commit_s=8.0, first=16)
    assert pace.rows() == 16
    sized: list[int] = []
    reader = threading.Thread(target=lambda: sized.append(pace.rows()))
    reader.start()
    time.sleep(0.3)
    assert not sized  # waiting: the first window is not measured yet
    pace.took(100, 2.0)  # the model's first batch of it
    reader.join(timeout=5)
    assert sized == [50 * 8 // SHARE]


def test_a_window_with_nothing_to_measure_lets_the_reader_go_on_and_a_stop_frees_it():
    pace = Pace(commit_s=8.0, first=16)
    assert pace.rows() == 16
    pace.took(0, 0.0)  # a window that was a shard's read error: nothing ran
    assert pace.rows() == 16  # another one-batch window, still unmeasured
    pace.stop.set()  # the run ends (or fails) while the reader would wait
    started = time.monotonic()
    assert pace.rows() == 16
    assert time.monotonic() - started < 1


def shards_of(folder: Path, sizes: list[int]) -> list[Shard]:
    found = []
    for i, rows in enumerate(sizes):
        path = folder / f"s{i}.parquet"
        texts = [("x" * (1 + (r * 7 + i) % 13)) for r in range(rows)]
        table = pa.table({"id": list(range(rows)), "text": texts})
        pq.write_table(table, path, row_group_size=5)
        found.append(Shard(i, str(path), path.stat().st_size, path.stat().st_mtime_ns))
    return found


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=4),
    chunk_rows=st.integers(1, 40),
    window_rows=st.integers(1, 25),
    paced=st.integers(1, 12),
    where=st.booleans(),
)
def test_paced_windows_cover_every_row_once_in_order(
    tmp_path_factory, sizes, chunk_rows, window_rows, paced, where
):
    folder = tmp_path_factory.mktemp("paced")
    shards = shards_of(folder, sizes)
    chunks = [c for s in shards for c in chunks_of(s, sizes[s.index], chunk_rows)]
    inp = InputConfig(path=(str(folder),), text="text", keep=("id",),
                      where="id % 3 <> 1" if where else None)  # fmt: skip
    pace = Pace(commit_s=1.0, first=paced)
    got = []
    for window in windows(
        chunks,
        Sums(),
        inp=inp,
        kinds={"text": "text"},
        batching=BatchingConfig(max_tokens=64, max_rows=4, window_rows=window_rows),
        on_error="fail",
        pace=pace,
    ):
        got.append(window)
        pace.took(0, 0.0)  # as the model does after each window: the reader sizes the next
    covered: dict[str, int] = {}
    rows: dict[str, list[int]] = {}
    for window in got:
        assert sum(p.rows.read for p in window.parts) <= min(window_rows, paced)
        keys = [p.chunk.key for p in window.parts]
        assert len(keys) == len(set(keys))  # one part per chunk: its rows in order
        for part in window.parts:
            assert part.rows.offset == part.chunk.start + covered.get(part.chunk.key, 0)
            covered[part.chunk.key] = covered.get(part.chunk.key, 0) + part.rows.read
            rows.setdefault(part.chunk.key, []).extend(part.rows.table["id"].to_pylist())
    for chunk in chunks:
        assert covered.get(chunk.key, 0) == chunk.rows
        kept = [r for r in range(chunk.start, chunk.stop) if not where or r % 3 != 1]
        assert rows.get(chunk.key, []) == kept
