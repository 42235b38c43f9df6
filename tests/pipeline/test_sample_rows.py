"""The measured sample (`stages.sample_rows`): the job's first distinct rows that pass `where`,
the task's columns alone, in one layout, from the shards that can be read."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import strategies as st

from batchscore.job.parse import load_job
from batchscore.models.tasks import input_kinds
from batchscore.pipeline.stages import first_distinct, sample_rows
from batchscore.work.shards import find_shards
from tests.conftest import write_job


def sample_of(path: Path, rows: int) -> pa.Table:
    """The job's first ``rows`` distinct rows, from its input as a run lists it."""
    job = load_job(path)
    kinds = input_kinds(job.model.task, job.input, job.task)
    return sample_rows(job.input, kinds, find_shards(job.input), rows)


def shard(path: Path, first: int, text: pa.DataType, ids: pa.DataType) -> pa.Table:
    words = [f"text {i}" for i in range(first, first + 4)]
    table = pa.table(
        {
            "doc_id": pa.array(range(first, first + 4), ids),
            "text": pa.array(words).cast(text),
            "lang": ["en", "fr", "en", "en"],
        }
    )
    pq.write_table(table, path, row_group_size=2)
    return table


def test_the_sample_passes_over_bad_shards_and_reads_one_layout(tmp_path: Path):
    folder = tmp_path / "in"
    folder.mkdir()
    shard(folder / "a.parquet", 0, pa.string(), pa.int32())
    data = (folder / "a.parquet").read_bytes()
    (folder / "a.parquet").write_bytes(data[: len(data) // 2])  # truncated: the first shard
    twice = shard(folder / "b.parquet", 10, pa.string(), pa.int64())
    names = [*twice.column_names, "text"]
    pq.write_table(
        pa.Table.from_arrays([*twice.columns, twice["text"]], names), folder / "b.parquet"
    )
    shard(folder / "c.parquet", 20, pa.large_string(), pa.int64())
    shard(folder / "d.parquet", 30, pa.dictionary(pa.int8(), pa.string()), pa.int32())
    shard(folder / "e.parquet", 40, pa.string_view(), pa.int64())
    job = write_job(
        tmp_path / "job.toml",
        input={"path": "in", "text": "text", "id": "doc_id", "where": "lang = 'en'"},
        model={"task": "embed", "max_length": 16},
        output={"path": "out"},
    )
    sample = sample_of(job, 7)
    assert sample.schema == pa.schema([("text", pa.string())])  # what measuring needs, one layout
    kept = [20, 22, 23, 30, 32, 33, 40]  # the rows in English, of the shards that can be read
    assert sample["text"].to_pylist() == [f"text {i}" for i in kept]


@given(
    st.lists(st.tuples(st.sampled_from(["N/A", "a", "b", "", "c d"]), st.integers(0, 2))),
    st.integers(1, 8),
)
def test_the_sample_keeps_first_occurrences_in_order(rows, wanted):
    """Of rows with repeats (a block of "N/A"s, pairs that repeat), the sample keeps each
    input's first row, in input order, until it holds ``wanted`` or the rows run out; what it
    has seen is passed over the next time."""
    table = pa.table({"text": [t for t, _ in rows], "pair": [p for _, p in rows]})
    seen: set[str] = set()
    kept = first_distinct(table, wanted, seen)
    distinct = list(dict.fromkeys(rows))
    assert pairs(kept) == distinct[:wanted]
    assert pairs(first_distinct(table, wanted, seen)) == distinct[wanted : 2 * wanted]


def pairs(table: pa.Table) -> list[tuple[str, int]]:
    return list(zip(table["text"].to_pylist(), table["pair"].to_pylist(), strict=True))


def test_a_block_of_one_text_first_is_read_past(tmp_path: Path):
    """The first shard opens with 30 copies of one text: the sample reads on past them, into
    the next shard, until it holds 5 distinct texts."""
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["N/A"] * 30 + ["x", "N/A", "y"]}), folder / "a.parquet")
    pq.write_table(pa.table({"text": ["y", "z", "w", "v"]}), folder / "b.parquet")
    job = write_job(
        tmp_path / "job.toml",
        input={"path": "in", "text": "text"},
        model={"task": "embed", "max_length": 16},
        output={"path": "out"},
    )
    assert sample_of(job, 5)["text"].to_pylist() == ["N/A", "x", "y", "z", "w"]


def test_a_frame_is_read_past_its_repeats_a_slice_at_a_time():
    """In-memory data (`score`): 3,000 copies of one text, then others, across slices."""
    table = pa.table({"text": ["N/A"] * 3000 + [f"text {i}" for i in range(10)]})
    kept = first_distinct(table, 4, set())
    assert kept["text"].to_pylist() == ["N/A", "text 0", "text 1", "text 2"]
