"""The measured sample (`stages.sample_rows`): the job's first distinct rows that pass `where`,
the task's columns alone, in one layout, from the shards that can be read."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import batchscore
from batchscore.errors import InputDataError
from batchscore.job.parse import load_job
from batchscore.models.tasks import input_kinds
from batchscore.pipeline.stages import first_distinct, sample_rows
from batchscore.work.shards import find_shards
from tests.commands import command, environment
from tests.conftest import read_output, write_job
from tests.reliability import make_job


def sample_of(path: Path, rows: int) -> pa.Table:
    """The job's first ``rows`` distinct rows, from its input as a run lists it."""
    job = load_job(path)
    kinds = input_kinds(job.model.task, job.input, job.options)
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


# -- bytes that are not UTF-8 ----------------------------------------------------------------


def unchecked(values: list[str | bytes | None]) -> pa.Array:
    """A string column holding ``values`` as they are: bytes that are not UTF-8 go in
    unchecked, as a writer that does not validate (or a damaged file) leaves them."""
    raw = pa.array([v.encode() if isinstance(v, str) else v for v in values], pa.binary())
    return pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())


def test_the_sample_compares_bytes_that_are_not_utf8():
    """A row that is not UTF-8, in a text column or a datasets Image struct's path, is a row of
    the sample like any other (the task refuses it when it encodes the sample, as a row
    error); repeats of it are still repeats."""
    texts = unchecked(["a", b"\xff\xfe not UTF-8", "b", b"\xff\xfe not UTF-8", "c"])
    paths = pa.StructArray.from_arrays([pa.nulls(5, pa.binary()), texts], ["bytes", "path"])
    table = pa.table({"text": texts, "image": paths})
    kept = first_distinct(table, 10, set())
    assert kept.num_rows == 4
    assert kept["text"].cast(pa.binary()).to_pylist() == [b"a", b"\xff\xfe not UTF-8", b"b", b"c"]


def undecodable_job(tmp_path: Path, small_corpus: pa.Table, **sections) -> tuple[Path, Path]:
    """30 real texts in 3 shards; the second text of the first shard is not UTF-8. Precision
    "auto", so the quality gate samples the first rows."""
    job = make_job(tmp_path, small_corpus.slice(0, 30), chunk_rows=5)
    path = sorted((tmp_path / "in").glob("*.parquet"))[0]
    table = pq.read_table(path)
    texts: list = table["text"].to_pylist()
    texts[1] = b"\xff\xfe not UTF-8"
    table = table.set_column(table.schema.get_field_index("text"), "text", unchecked(texts))
    pq.write_table(table, path)
    text = job.read_text().replace('precision = "fp32"', 'precision = "auto"')
    extra = "".join(
        f"[{name}]\n" + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in keys.items())
        for name, keys in sections.items()
    )
    job.write_text(text + extra)
    return job, path


def run(job: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(job, *args), capture_output=True, text=True, env=environment(), timeout=300
    )


@pytest.mark.parametrize("embed", [{}, {"quantize": "int8"}], ids=["gate", "gate+ranges"])
def test_text_that_is_not_utf8_is_its_rows_error_when_measured(
    tmp_path: Path, small_corpus: pa.Table, embed: dict
):
    """The quality gate (and int8 ranges measured on the same sample) read the row that is
    not UTF-8: under on_error = "skip" it is its row's error and the other 29 rows are scored;
    under "fail" its shard fails naming file, row and column (exit 3) and the other shards
    are committed. Never a traceback."""
    job, path = undecodable_job(tmp_path, small_corpus, **({"embed": embed} if embed else {}))
    failed = run(job)
    assert failed.returncode == 3, failed.stderr
    assert f"{path.name}: row 1, column 'text': not valid UTF-8" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert read_output(tmp_path / "out").num_rows == 20  # the other shards committed
    skipped = run(job, "--set", 'output.on_error="skip"', "--restart")
    assert skipped.returncode == 0 and "Traceback" not in skipped.stderr, skipped.stderr
    out = read_output(tmp_path / "out")
    errors = out["error"].to_pylist()
    assert errors[1] == "column 'text': not valid UTF-8 (byte 0)"
    assert sum(e is None for e in errors) == 29 and out.num_rows == 30
    assert all(v is not None for i, v in enumerate(out["embedding"].to_pylist()) if i != 1)


def test_score_measures_frames_that_are_not_utf8(small_corpus: pa.Table):
    """`batchscore.score` gates a frame on its first distinct rows as a job does: a row that
    is not UTF-8 is its row's error (on_error="skip") or the error naming its row."""
    texts: list = small_corpus["text"].to_pylist()[:6]
    texts[0] = b"\xff\xfe not UTF-8"
    table = pa.table({"text": unchecked(texts)})
    scored = batchscore.score(table, task="embed", precision="auto", on_error="skip")
    assert scored["error"].to_pylist() == ["column 'text': not valid UTF-8 (byte 0)"] + [None] * 5
    with pytest.raises(InputDataError, match="row 0, column 'text': not valid UTF-8"):
        batchscore.score(table, task="embed", precision="auto")
