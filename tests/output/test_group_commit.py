"""Group commits: the chunks one window completes (many small shards) commit together, yet each
keeps its own file and record, and a SIGKILL anywhere in a group resumes with every row once."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sample_corpus

from batchscore.job.parse import load_job
from batchscore.output.checkpoint import Checkpoint
from batchscore.recipes.run import run_job
from batchscore.storage.layout import part_name
from tests.commands import start
from tests.conftest import read_output, write_job
from tests.output.test_checkpoint import A, write_part
from tests.reliability import (
    assert_complete_and_equal,
    committed_files,
    intended_files,
)

SHARDS, CHUNK = 12, 5  # 60 rows: 12 shards of 5 rows, each one chunk, all in one window
FOREIGN = "part-foreign.parquet"  # another writer's file in the output folder


def many_small(folder: Path, rows: pa.Table) -> Path:
    sample_corpus.write_shards(rows, folder / "in", shards=SHARDS, row_group_size=CHUNK)
    return write_job(
        folder / "job.toml",
        input={"path": "in", "text": "text", "id": "doc_id"},
        model={"task": "embed", "max_length": 64, "threads": 1},
        batching={"max_tokens": 1024, "window_rows": 64},
        output={"path": "out", "chunk_rows": CHUNK},
    )


@pytest.fixture(scope="module")
def rows(small_corpus) -> pa.Table:
    return small_corpus.slice(0, SHARDS * CHUNK)


@pytest.fixture(scope="module")
def clean(tmp_path_factory, rows) -> pa.Table:
    job = many_small(tmp_path_factory.mktemp("clean"), rows)
    run_job(load_job(job))
    return read_output(job.parent / "out")


def test_a_grouped_commit_keeps_a_record_per_chunk(tmp_path: Path, rows, clean):
    job = many_small(tmp_path, rows)
    report = run_job(load_job(job))
    out = tmp_path / "out"
    records = [json.loads(p.read_text()) for p in (out / "_batchscore/done").glob("*.json")]
    assert report["chunks_committed"] == len(records) == SHARDS
    assert {r["file"] for r in records} == {p.name for p in out.glob("*.parquet")}
    for record in records:
        footer = pq.read_metadata(out / record["file"]).metadata
        assert footer[b"batchscore.chunk"].decode() == record["chunk"]
        assert record["rows"] == record["stop"] - record["start"] == CHUNK
    assert not list((out / "_batchscore/writing").iterdir())
    assert_complete_and_equal(out, clean)


@pytest.mark.parametrize(
    "point",
    ["after-fsync@4", "after-rename@6", "before-record@3", "after-record@5", "after-record@12"],
)
def test_a_group_killed_midway_resumes_with_every_row_once(tmp_path: Path, rows, clean, point):
    job = many_small(tmp_path, rows)
    out = tmp_path / "out"
    out.mkdir()
    pq.write_table(pa.table({"x": [1]}), out / FOREIGN)
    foreign = (out / FOREIGN).read_bytes()
    crashed = start(job, faults=f"{point}:kill")
    crashed.communicate(timeout=300)
    assert crashed.returncode == -signal.SIGKILL
    visible = {p.name for p in out.glob("*.parquet")} - {FOREIGN}
    strays = visible - committed_files(out)  # published, unrecorded: whole, swept next
    for name in strays:
        assert pq.read_metadata(out / name).num_rows == CHUNK
    if point.startswith("before-record"):  # the group being recorded: published, all of it
        assert strays and strays == intended_files(out)
    resumed = start(job)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()
    assert (out / FOREIGN).read_bytes() == foreign
    (out / FOREIGN).unlink()  # the check below reads batchscore's files only
    assert_complete_and_equal(out, clean)


def test_sweep_reads_a_group_intent(tmp_path: Path):
    """A crash between a group's publish and its records: the published files it names go;
    a file at a named chunk that is not what the intent says stays."""
    ckpt = Checkpoint(tmp_path)
    ckpt.prepare()
    published = write_part(tmp_path, f"{A}-00000")
    never = write_part(tmp_path / "_batchscore", f"{A}-00001")
    (tmp_path / part_name(f"{A}-00001")).write_bytes(b"someone else's")
    ckpt.intend([published, never])
    assert set(ckpt.intents()) == {f"{A}-00000", f"{A}-00001"}
    assert {Path(p).name for p in ckpt.sweep()} == {part_name(f"{A}-00000")}
    assert [p.name for p in tmp_path.glob("part-*")] == [part_name(f"{A}-00001")]
    assert ckpt.intents() == {} and not ckpt.damaged
