"""Bad input, one kind per test: each gets a message naming shard, row and column as it applies,
and the error policy decides what happens to the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscore.errors import BadRowsError, InputDataError, JobError
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from tests.conftest import output_files, read_output, source_of
from tests.reliability import make_job


@pytest.fixture
def job(tmp_path: Path, small_corpus) -> Path:
    return make_job(tmp_path, small_corpus.slice(0, 120))


def shard(job: Path, n: int) -> Path:
    return sorted((job.parent / "in").glob("*.parquet"))[n]


def set_texts(path: Path, changes: dict[int, str | None]) -> None:
    table = pq.read_table(path)
    texts = table["text"].to_pylist()
    for row, text in changes.items():
        texts[row] = text
    index = table.schema.get_field_index("text")
    pq.write_table(table.set_column(index, "text", pa.array(texts, pa.string())), path)


def test_missing_folder_or_empty_glob_is_a_job_error(job: Path):
    with pytest.raises(JobError, match=r"/nope: no such file or folder"):
        run_job(load_job(job, ['input.path="nope"']))
    with pytest.raises(JobError, match=r"matches no Parquet files"):
        run_job(load_job(job, ['input.path="in/*.csv"']))


def test_null_and_empty_texts_fail_their_shard_under_fail(job: Path):
    set_texts(shard(job, 1), {7: None, 9: "   "})
    with pytest.raises(
        InputDataError, match=r"docs-001\.parquet: row 7, column 'text': text is null"
    ):
        run_job(load_job(job))
    done = (job.parent / "out/_batchscore/done").glob("*.json")
    committed = {Path(json.loads(p.read_text())["shard"]["path"]).name for p in done}
    assert committed == {"docs-000.parquet", "docs-002.parquet"}


def test_null_and_empty_texts_are_recorded_under_skip(job: Path):
    set_texts(shard(job, 1), {7: None, 9: "   "})
    report = run_job(load_job(job, ["output.on_error=skip"]))
    assert report["bad_rows"] == 2 and report["outcome"] == "ok"
    out = read_output(job.parent / "out")
    assert out.num_rows == 120 and out.column_names[-1] == "error"
    errors = {i: e for i, e in enumerate(out["error"].to_pylist()) if e}
    assert errors == {47: "column 'text': text is null", 49: "column 'text': text is empty"}
    assert out["embedding"][47].as_py() is None and out["embedding"][48].as_py() is not None
    (listing,) = (job.parent / "out/_batchscore/rejected").glob("*.jsonl")
    rejected = [json.loads(line) for line in listing.read_text().splitlines()]
    assert [list(r) for r in rejected] == [["shard", "row", "id", "error"]] * 2
    assert [r["row"] for r in rejected] == [7, 9]
    assert rejected[0]["shard"].endswith("docs-001.parquet")


def test_the_bad_row_gate_counts_over_the_whole_job(job: Path):
    """8 bad rows of 120: over a 5% limit (6 rows) the run stops as soon as that is certain,
    and every re-run fails again; within 10% (12 rows) the job passes."""
    set_texts(shard(job, 0), {i: None for i in range(0, 15, 2)})  # 8 in the first chunk
    skip = ["output.on_error=skip", "output.max_bad_share=0.05"]
    message = r"8 of the job's 120 input rows failed \(6\.7%\).*most in docs-000\.parquet \(8\)"
    with pytest.raises(BadRowsError, match=message):
        run_job(load_job(job, skip))
    runs = [json.loads(p.read_text()) for p in (job.parent / "out/_batchscore/runs").glob("*")]
    assert [(r["outcome"], r["chunks_committed"]) for r in runs] == [("too many bad rows", 1)]
    with pytest.raises(BadRowsError, match=message):  # the same input and limit: fails again
        run_job(load_job(job, skip))
    report = run_job(load_job(job, [*skip, "output.max_bad_share=0.1"]))
    assert report["outcome"] == "ok" and read_output(job.parent / "out").num_rows == 120


def test_a_few_bad_rows_up_front_do_not_stop_a_big_job(job: Path):
    """Two null texts in a small shard that sorts first: 2 of 124 rows, under 10%."""
    first = pq.read_table(shard(job, 0)).slice(0, 4)
    path = job.parent / "in/aaa-first.parquet"
    pq.write_table(first, path)
    set_texts(path, {0: None, 1: None})
    report = run_job(load_job(job, ["output.on_error=skip"]))
    assert report["outcome"] == "ok" and report["bad_rows"] == 2 and report["rows"] == 124


def test_max_bad_share_must_be_a_share(job: Path):
    for value in ("nan", "inf", "1.5", "-0.1"):
        with pytest.raises(JobError, match=r"\[output\]\.max_bad_share"):
            load_job(job, [f"output.max_bad_share={value}"])


def test_long_texts_are_truncated_and_counted(job: Path):
    set_texts(shard(job, 0), {0: "word " * 5000})
    report = run_job(load_job(job))
    assert report["truncated"] >= 1


def test_corrupt_and_truncated_files_fail_alone(job: Path):
    data = shard(job, 0).read_bytes()
    shard(job, 0).write_bytes(data[: len(data) // 2])
    middle = bytearray(shard(job, 2).read_bytes())
    middle[200:900] = b"\x41" * 700  # page data destroyed, footer intact
    shard(job, 2).write_bytes(bytes(middle))
    with pytest.raises(InputDataError, match=r"2 shard\(s\) failed") as info:
        run_job(load_job(job))
    assert "docs-000.parquet: not a readable Parquet file" in str(info.value)
    assert "docs-002.parquet: cannot decode rows" in str(info.value)
    assert read_output(job.parent / "out").num_rows == 40  # shard 1 committed
    shard(job, 0).write_bytes(data)  # repaired: the next run retries it, not the corrupt one
    with pytest.raises(InputDataError, match=r"1 shard\(s\) failed"):
        run_job(load_job(job))
    assert read_output(job.parent / "out").num_rows == 80


def test_wrong_column_type_and_missing_column(job: Path):
    table = pq.read_table(shard(job, 1))
    pq.write_table(table.drop_columns(["text"]), shard(job, 1))
    pq.write_table(table.set_column(2, "text", pa.array(range(40))), shard(job, 2))
    with pytest.raises(InputDataError) as info:
        run_job(load_job(job))
    assert "docs-001.parquet: missing column(s) text" in str(info.value)
    assert "docs-002.parquet: column 'text' is int64, expected a string column" in str(info.value)


def test_zero_row_shard_commits_an_empty_part(job: Path):
    pq.write_table(pq.read_table(shard(job, 0)).slice(0, 0), job.parent / "in/docs-003.parquet")
    report = run_job(load_job(job))
    assert report["outcome"] == "ok" and report["rows"] == 120
    (last,) = [f for f in output_files(job.parent / "out") if "docs-003" in source_of(f)]
    assert pq.read_metadata(last).num_rows == 0


def test_schema_drift_between_shards(job: Path):
    wider = pq.read_table(shard(job, 1))  # doc_id string -> large_string: same family, cast
    pq.write_table(wider.cast(wider.schema.set(0, pa.field("doc_id", pa.large_string()))),
                   shard(job, 1))  # fmt: skip
    other = pq.read_table(shard(job, 2))  # doc_id string -> int64: cannot share a column
    pq.write_table(other.set_column(0, "doc_id", pa.array(range(40))), shard(job, 2))
    with pytest.raises(
        InputDataError, match=r"column 'doc_id' is int64 here but string in .*docs-000"
    ):
        run_job(load_job(job))
    out = read_output(job.parent / "out")
    assert out.num_rows == 80 and out.schema.field("doc_id").type == pa.string()


def test_non_parquet_files_in_the_folder(job: Path, caplog):
    (job.parent / "in/README.txt").write_text("notes")
    (job.parent / "in/_SUCCESS").write_text("")
    (job.parent / "in/fake.parquet").write_text("id,text\n1,hello\n")
    with pytest.raises(InputDataError, match=r"fake\.parquet: not a readable Parquet file"):
        run_job(load_job(job))
    assert "ignoring 1 non-Parquet file(s): README.txt" in caplog.text
    assert read_output(job.parent / "out").num_rows == 120
