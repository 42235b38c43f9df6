"""Settling a job with nothing to measure: every row filtered out, or every shard empty. The
default precision and budget have no row to gate or time on, and the job still completes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchscore.cli import main
from tests.conftest import restamp


def default_job(folder: Path, where: str | None = None) -> Path:
    """An embed job with no precision or budget key: both "auto", as users write them."""
    job = folder / "job.toml"
    filter_line = f"where = {json.dumps(where)}\n" if where else ""
    job.write_text(
        f'[input]\npath = "in"\ntext = "text"\nid = "doc_id"\n{filter_line}'
        '[model]\ntask = "embed"\nmax_length = 64\n[output]\npath = "out"\n'
    )
    return job


def run(job: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["run", str(job), "--progress", "off"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


@pytest.mark.parametrize("precision", ["auto", "int8", "fp32"])
def test_a_where_that_keeps_no_row_completes_the_job(tmp_path: Path, small_corpus, precision):
    (tmp_path / "in").mkdir()
    for i in range(2):
        pq.write_table(small_corpus.slice(i * 10, 10), tmp_path / f"in/s{i}.parquet")
    job = default_job(tmp_path, where="length(text) < 0")
    if precision != "auto":
        job.write_text(job.read_text().replace("max_length = 64", f'precision = "{precision}"'))
    code, output = run(job)
    assert code == 0, output
    assert (tmp_path / "out/_SUCCESS").is_file()
    assert len(list((tmp_path / "out/_batchscore/done").glob("*.json"))) == 2
    settled = json.loads((tmp_path / "out/_batchscore/settled.json").read_text())
    assert "no input row to measure on" in settled["precision"]["why"]


def test_a_folder_of_empty_shards_completes_the_job(tmp_path: Path, small_corpus):
    (tmp_path / "in").mkdir()
    for i in range(3):
        pq.write_table(small_corpus.slice(0, 0), tmp_path / f"in/s{i}.parquet")
    code, output = run(default_job(tmp_path))
    assert code == 0, output
    assert (tmp_path / "out/_SUCCESS").is_file()
    data = [pq.read_table(p) for p in (tmp_path / "out").glob("*.parquet")]
    assert len(data) == 3 and sum(t.num_rows for t in data) == 0
    assert all(t.schema.field("embedding").type == pa.list_(pa.float32(), 384) for t in data)


def test_int8_ranges_are_measured_when_the_first_rows_arrive(
    tmp_path: Path, small_corpus, minilm_path
):
    """A folder settled on empty shards has no ranges to keep; a shard with rows added later is
    quantized with ranges measured on its rows, then recorded, as a first run's would be."""
    from sentence_transformers import SentenceTransformer

    (tmp_path / "in").mkdir()
    pq.write_table(small_corpus.slice(0, 0), tmp_path / "in/s0.parquet")
    job = default_job(tmp_path)
    job.write_text(job.read_text() + '[embed]\nquantize = "int8"\n')
    code, output = run(job)
    assert code == 0, output
    settled = tmp_path / "out/_batchscore/settled.json"
    assert "ranges" not in json.loads(settled.read_text())
    rows = small_corpus.slice(0, 40)
    pq.write_table(rows, tmp_path / "in/s1.parquet")
    code, output = run(job)
    assert code == 0, output
    ranges = json.loads(settled.read_text())["ranges"]
    model = SentenceTransformer(str(minilm_path), device="cpu")
    model.max_seq_length = 64  # the job's max_length
    floats = model.encode(rows["text"].to_pylist())
    assert np.abs(np.asarray(ranges) - np.vstack((floats.min(0), floats.max(0)))).max() < 1e-5
    written = [pq.read_metadata(p).metadata for p in (tmp_path / "out").glob("*.parquet")]
    quantized = [m for m in written if b"batchscore.embed.ranges" in m]
    assert len(quantized) == 1  # the empty shard's file was written before there were any
    assert json.loads(quantized[0][b"batchscore.embed.ranges"]) == ranges


def quantizing_job(tmp_path: Path, small_corpus: pa.Table) -> Path:
    """An int8 embed job over one shard of 40 rows; its first run settles fp32 and ranges."""
    (tmp_path / "in").mkdir()
    pq.write_table(small_corpus.slice(0, 40), tmp_path / "in/s0.parquet")
    job = default_job(tmp_path)
    text = job.read_text().replace("max_length = 64", 'max_length = 64\nprecision = "fp32"')
    job.write_text(text + '[embed]\nquantize = "int8"\n[quality]\nsample_rows = 32\n')
    return job


def footers(out: Path) -> list[dict[bytes, bytes]]:
    return [pq.read_metadata(p).metadata for p in sorted(out.glob("*.parquet"))]


def edit_ranges(record: dict) -> None:
    record["ranges"][0] = [2 * v for v in record["ranges"][0]]  # wider: another int8 scale


def edit_precision(record: dict) -> None:
    record["precision"]["precision"] = "int8"


@pytest.mark.parametrize(
    "edit", [edit_ranges, edit_precision, None], ids=["ranges", "precision", "deleted"]
)
def test_a_record_the_data_files_disprove_yields_to_them(tmp_path, small_corpus, edit):
    """settled.json edited by hand (its ranges, its precision) or deleted, then a shard added:
    the new chunks are written as the committed ones were (the footers' ranges and precision),
    never with a second scale, the run says what it took back, and status agrees."""
    job = quantizing_job(tmp_path, small_corpus)
    code, output = run(job)
    assert code == 0, output
    out, settled = tmp_path / "out", tmp_path / "out/_batchscore/settled.json"
    first = json.loads(settled.read_text())
    if edit is None:
        settled.unlink()
    else:
        record = json.loads(settled.read_text())
        edit(record)
        settled.write_text(json.dumps(record))
    pq.write_table(small_corpus.slice(100, 40), tmp_path / "in/s1.parquet")
    job.write_text(job.read_text().replace("sample_rows = 32", "sample_rows = 8"))
    code, output = run(job)
    assert code == 0, output
    assert str(settled) in output and "footers" in output
    assert ("missing" if edit is None else edit.__name__.removeprefix("edit_")) in output
    written = footers(out)
    assert len(written) == 2
    assert {m[b"batchscore.embed.ranges"] for m in written} == {
        json.dumps(first["ranges"]).encode()
    }
    assert {m[b"batchscore.precision"] for m in written} == {b"fp32"}
    again = json.loads(settled.read_text())
    assert again["ranges"] == first["ranges"] and again["precision"]["precision"] == "fp32"
    status = CliRunner().invoke(main, ["status", str(job), "--check"])
    assert status.exit_code == 0, status.output


@pytest.mark.parametrize("key", ["ranges", "precision"])
def test_a_folder_holding_two_scales_is_refused_by_run_and_status(tmp_path, small_corpus, key):
    """A folder whose committed files were quantized with two ranges, or scored at two
    precisions (an edit an earlier version trusted): `run` refuses it (exit 10, naming what
    differs) rather than add to it, and `status --check` does not call it complete."""
    job = quantizing_job(tmp_path, small_corpus)
    pq.write_table(small_corpus.slice(100, 40), tmp_path / "in/s1.parquet")
    code, output = run(job)
    assert code == 0, output
    out = tmp_path / "out"
    second = sorted(out.glob("*.parquet"))[1]
    if key == "ranges":
        ranges = json.loads(pq.read_metadata(second).metadata[b"batchscore.embed.ranges"])
        wider = [[2 * v for v in ranges[0]], ranges[1]]
        restamp(second, {"batchscore.embed.ranges": json.dumps(wider)})
    else:
        restamp(second, {"batchscore.precision": "int8"})
    pq.write_table(small_corpus.slice(200, 40), tmp_path / "in/s2.parquet")
    code, output = run(job)
    assert code == 10, output
    told = "2 different ranges" if key == "ranges" else "2 different precisions (fp32, int8)"
    assert told in output and "Traceback" not in output
    assert len(list(out.glob("*.parquet"))) == 2  # nothing added
    (tmp_path / "in/s2.parquet").unlink()
    status = CliRunner().invoke(main, ["status", str(job), "--check"])
    assert status.exit_code != 0 and told in status.output, status.output
