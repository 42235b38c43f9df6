"""The output contract, end to end on real shards and the real MiniLM: batchscore touches only
its own files, notices when its output is damaged, keeps one job per folder, knows shards by
name, and leaves a folder every dataset reader opens as it is."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from batchscore.errors import InputDataError, JobError
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from batchscore.recipes.status import job_status
from batchscore.storage.layout import chunk_key, part_name, shard_key
from tests.commands import invoke
from tests.conftest import read_output, source_of
from tests.reliability import make_job

FOREIGN = {
    "part-00000-3f2a.snappy.parquet": pa.table({"spark": [1, 2, 3]}),  # a Spark writer's
    "part-0.parquet": pa.table({"mine": ["a"]}),  # a user's own
}


@pytest.fixture
def job(tmp_path: Path, small_corpus) -> Path:
    """30 real texts in 3 shards of 10 rows, 2 chunks a shard."""
    return make_job(tmp_path, small_corpus.slice(0, 30), chunk_rows=5)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file outside `_batchscore/`, by relative path, with the digest of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "_batchscore" not in p.relative_to(folder).parts
    }


def drop_foreign(out: Path) -> dict[str, str]:
    """Files batchscore did not write, where its data goes; returns their digests."""
    (out / "nested").mkdir(parents=True, exist_ok=True)
    for name, table in FOREIGN.items():
        pq.write_table(table, out / name)
    (out / "README.txt").write_text("the team's notes\n")
    (out / "nested" / "x.parquet").write_bytes(b"not even Parquet")
    return {k: v for k, v in snapshot(out).items() if not k.startswith("part-") or k in FOREIGN}


def target(shard: Path, chunk: int = 0) -> str:
    """Where batchscore puts a chunk of ``shard``: a name keyed by a digest of its path."""
    return part_name(chunk_key(shard_key(str(shard.resolve())), chunk))


def test_foreign_files_survive_run_resume_and_restart(job: Path):
    out = job.parent / "out"
    foreign = drop_foreign(out)
    run_job(load_job(job))
    assert {k: snapshot(out)[k] for k in foreign} == foreign
    for record in list((out / "_batchscore/done").glob("*.json"))[:2]:
        record.unlink()  # commit records lost: the files are recognised as this job's by footer
    resumed = run_job(load_job(job))
    assert resumed["chunks_committed"] == 2
    assert {k: snapshot(out)[k] for k in foreign} == foreign
    run_job(load_job(job), restart=True)
    assert {k: snapshot(out)[k] for k in foreign} == foreign
    mine = [f for f in out.glob("*.parquet") if source_of(f)]  # footers naming a shard
    assert sum(pq.read_metadata(f).num_rows for f in mine) == 30 and len(mine) == 6


def test_a_foreign_file_where_a_chunk_goes_stops_the_run_untouched(job: Path):
    out = job.parent / "out"
    shard = sorted((job.parent / "in").glob("*.parquet"))[1]
    out.mkdir()
    (out / target(shard)).write_bytes(b"someone else's file")
    result = invoke("run", str(job), "--progress", "off")
    assert result.exit_code == 5, result.output
    assert target(shard) in result.stderr and "did not write" in result.stderr
    assert (out / target(shard)).read_bytes() == b"someone else's file"
    assert not list((out / "_batchscore/done").glob("*.json"))  # refused before scoring


@pytest.mark.parametrize(
    ("output", "relation"),
    [
        ("in", "the same as"),
        ("in/out", "inside"),
        ("in/sub/../out", "inside"),
        (".", "a folder containing"),
        ("link-to-in/out", "inside"),
    ],
)
def test_output_may_not_overlap_the_input(job: Path, output: str, relation: str):
    (job.parent / "link-to-in").symlink_to(job.parent / "in")
    before = snapshot(job.parent / "in")
    for command in ("validate", "run"):
        result = invoke(command, str(job), "--set", f'output.path="{output}"')
        assert result.exit_code == 2, result.output
        assert f"is {relation} the input" in result.stderr
    assert snapshot(job.parent / "in") == before
    assert not (job.parent / "in/out").exists() and not (job.parent / "_batchscore").exists()


def test_a_sibling_output_of_a_glob_input_is_fine(job: Path):
    (job.parent / "in/sub").mkdir()
    loaded = load_job(job, ['input.path="in/*.parquet"', 'output.path="in/sub/out"'])
    assert loaded.output.path.endswith("in/sub/out")  # *.parquet never reaches into in/sub
    with pytest.raises(JobError, match="is inside the input"):
        load_job(job, ['input.path="in/**/*.parquet"', 'output.path="in/sub/out"'])


def test_missing_and_damaged_files_are_noticed_and_scored_again(job: Path):
    out = job.parent / "out"
    run_job(load_job(job))
    clean = read_output(out)
    shards = sorted((job.parent / "in").glob("*.parquet"))
    (out / target(shards[0], 1)).unlink()
    pq.write_table(pa.table({"doc_id": ["forged"]}), out / target(shards[2], 0))  # replaced
    status = job_status(load_job(job))
    states = {Path(s["shard"]).name: (s["state"], s["problems"]) for s in status["shards"]}
    assert states["docs-000.parquet"] == ("missing", [f"{target(shards[0], 1)}: missing"])
    assert states["docs-002.parquet"][0] == "damaged" and not status["complete"]
    assert "damaged (now" in states["docs-002.parquet"][1][0]
    report = run_job(load_job(job))
    assert report["chunks_committed"] == 2 and report["chunks_redone"] == 2
    assert sorted(r["chunk"] for r in report["redone"]) == sorted(
        [target(shards[0], 1)[5:-8], target(shards[2], 0)[5:-8]]
    )
    assert read_output(out).equals(clean)
    assert job_status(load_job(job))["complete"]


def test_one_job_per_output_folder(job: Path, tmp_path: Path, small_corpus):
    run_job(load_job(job))
    other = make_job(tmp_path / "other", small_corpus.slice(30, 60))
    text = other.read_text().replace('path = "out"', f'path = "{job.parent / "out"}"')
    other.write_text(text)  # same name ("job"), same settings, other inputs, same folder
    result = invoke("run", str(other))
    assert result.exit_code == 5 and "holds the output of another job, 'job'" in result.stderr
    moved = tmp_path / "elsewhere" / "renamed.toml"  # the same job from a moved, renamed file
    moved.parent.mkdir()
    absolute = job.read_text().replace('"in"', f'"{job.parent / "in"}"')
    moved.write_text(absolute.replace('"out"', f'"{job.parent / "out"}"'))
    assert run_job(load_job(moved))["chunks_already_done"] == 6


def test_a_run_that_committed_nothing_claims_nothing(job: Path):
    with pytest.raises(JobError, match="names column"):
        run_job(load_job(job, ["input.where=\"lang = 'en'\""]))  # no such column
    report = run_job(load_job(job, ["input.where=\"doc_id != ''\""]))  # corrected: just runs
    assert report["rows"] == 30


def test_shards_are_known_by_name_not_position(job: Path):
    out, inputs = job.parent / "out", job.parent / "in"
    run_job(load_job(job))
    before = snapshot(out)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.glob("*.parquet")}
    first = sorted(inputs.glob("*.parquet"))[0]
    pq.write_table(pq.read_table(first).slice(0, 3), inputs / "aaa-sorts-first.parquet")
    report = run_job(load_job(job))
    assert report["rows"] == 3 and report["chunks_committed"] == 1
    assert {k: snapshot(out)[k] for k in before if k != "_SUCCESS"} == {
        k: v for k, v in before.items() if k != "_SUCCESS"
    }
    assert all(
        p.stat().st_mtime_ns == mtimes[p.name] for p in out.glob("*.parquet") if p.name in mtimes
    )
    first.rename(inputs / "docs-000-renamed.parquet")  # the new name is scored; the old moves
    report = run_job(load_job(job))
    assert report["rows"] == 10 and [g["shard"] for g in report["gone_shards"]] == [
        str(first.resolve())
    ]
    kept = Path(report["gone_shards"][0]["kept"])
    status = job_status(load_job(job))
    gone = [s for s in status["shards"] if s["state"] == "gone"]
    assert [(Path(s["shard"]).name, s["kept"]) for s in gone] == [("docs-000.parquet", str(kept))]
    assert status["complete"] and not (out / target(first)).exists()
    assert pq.read_table(kept / f"{target(first)}.gone").num_rows == 5  # kept, recoverable
    assert read_output(out).num_rows == 33  # the current input (30 + 3 rows), each row once


def test_a_kept_column_named_like_an_output_column_is_refused(job: Path):
    for sets, column in (
        (['input.keep=["embedding"]'], "embedding"),
        (['input.keep=["error"]', "output.on_error=skip"], "error"),
    ):
        args = [a for s in sets for a in ("--set", s)]
        for command in ("validate", "run"):
            result = invoke(command, str(job), *args)
            assert result.exit_code == 2 and f"column {column!r}" in result.stderr


def test_every_reader_sees_every_row_once(job: Path):
    out = job.parent / "out"
    shard = sorted((job.parent / "in").glob("*.parquet"))[1]
    table = pq.read_table(shard)
    pq.write_table(
        table.set_column(2, "text", pa.array([None, *table["text"][1:].to_pylist()])), shard
    )
    run_job(load_job(job, ["output.on_error=skip", 'input.keep=["doc_id"]']))
    assert (out / "_SUCCESS").read_text().startswith("written by batchscore")
    assert (out / "_batchscore/rejected").is_dir() and not list(
        (out / "_batchscore").rglob("*.parquet")
    )
    ids = sorted(read_output(out)["doc_id"].to_pylist())
    assert len(ids) == len(set(ids)) == 30
    dataset = ds.dataset(out, format="parquet")  # skips `_` and `.` names
    assert sorted(dataset.to_table()["doc_id"].to_pylist()) == ids
    frame = pl.scan_parquet(f"{out}/**/*.parquet").collect()
    assert sorted(frame["doc_id"].to_list()) == ids
    assert frame.schema["embedding"] == pl.Array(pl.Float32, 384)
    rows = duckdb.sql(f"select doc_id from read_parquet('{out}/**/*.parquet')").fetchall()
    assert sorted(r[0] for r in rows) == ids
    hidden = [p for p in out.rglob("*") if p.is_file() and p.suffix != ".parquet"]
    assert all(  # Hadoop and Spark skip every path with a `_` or `.` component
        any(part.startswith(("_", ".")) for part in p.relative_to(out).parts) for p in hidden
    )
    meta = pq.read_metadata(next(out.glob("*.parquet"))).metadata
    for key in ("version", "job", "model", "model_files", "precision", "fingerprint", "shard"):
        assert meta[f"batchscore.{key}".encode()]


def test_success_marks_a_complete_output_only(job: Path):
    out, inputs = job.parent / "out", job.parent / "in"
    run_job(load_job(job))
    assert (out / "_SUCCESS").is_file()
    (inputs / "zz-broken.parquet").write_bytes(b"not Parquet")
    with pytest.raises(InputDataError):
        run_job(load_job(job))
    assert not (out / "_SUCCESS").exists()  # a run with work to do removed it
    (inputs / "zz-broken.parquet").unlink()
    run_job(load_job(job))
    assert (out / "_SUCCESS").is_file()
    (out / "_SUCCESS").write_text("")  # another writer's marker: never removed or replaced
    pq.write_table(pq.read_table(sorted(inputs.glob("*"))[0]).slice(0, 2), inputs / "new.parquet")
    run_job(load_job(job))
    assert (out / "_SUCCESS").read_text() == ""


def test_bookkeeping_stays_small(job: Path):
    out = job.parent / "out"
    metrics = job.parent / "run.prom"
    run_job(load_job(job))
    first = os.stat(out / "_batchscore/runs").st_mtime_ns
    report = run_job(load_job(job), metrics_file=metrics)  # nothing to score
    assert report["rows"] == 0 and len(list((out / "_batchscore/runs").glob("*.json"))) == 1
    assert os.stat(out / "_batchscore/runs").st_mtime_ns == first
    lines = metrics.read_text().splitlines()
    last_run = next(x for x in lines if x.startswith("batchscore_last_run_timestamp"))
    assert float(last_run.split()[-1]) >= report["started"]
