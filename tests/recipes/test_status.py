"""`status` judges the folder against the job as given: it says complete exactly when a run of
that job, with those settings, would accept the folder and find nothing left to do."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from batchscore.cli import main
from batchscore.errors import OutputConflictError
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from batchscore.recipes.status import job_status
from tests.output.tiny import rows_job, rows_table, tiny_job, write_rows, write_shard

# keys a user may change between runs: some decide the output (the fingerprint), some do not
CHOICES = {
    "output.chunk_rows": ["4", "3"],
    "output.on_error": ['"fail"', '"skip"'],
    "input.where": [None, '"x0 > -100"'],
    "tensor.output": ['"class"', '"value"'],
    "batching.max_rows": ["8", "16"],
    "model.threads": ["1", "2"],
}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete output of the tiny job (its first choice of every key)."""
    root = tmp_path_factory.mktemp("status")
    job = tiny_job(root)
    write_shard(root / "in/a.parquet", 9)
    write_shard(root / "in/b.parquet", 4, seed=1)
    run_job(load_job(job))
    return job


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(picked=st.fixed_dictionaries({k: st.sampled_from(v) for k, v in CHOICES.items()}))
def test_status_is_complete_exactly_when_run_accepts_the_folder(job: Path, picked: dict):
    overrides = [f"{k}={v}" for k, v in picked.items() if v is not None]
    status = job_status(load_job(job, overrides))
    try:
        report = run_job(load_job(job, overrides))  # refused, or nothing left to do
    except OutputConflictError as exc:
        event("run refuses the folder")
        assert not status["complete"] and status["refused"] == str(exc)
        assert "changed:" in str(exc)
    else:
        event("run accepts the folder")
        assert status["complete"] and status["refused"] is None and report["rows"] == 0


def test_status_json_of_other_settings_says_not_complete_and_why(job: Path):
    """Status says why, then exits as the run does (5): one verdict (tests/recipes/
    test_verdict.py)."""
    args = ["--set", "output.chunk_rows=3"]
    result = CliRunner().invoke(main, ["status", str(job), "--json", *args])
    assert result.exit_code == 5, result.output
    status = json.loads(result.stdout)
    assert status["complete"] is False and "changed: chunk_rows" in status["refused"]
    text = CliRunner().invoke(main, ["status", str(job), *args]).stdout
    assert "not complete for this job" in text and "- complete" not in text
    refused = CliRunner().invoke(main, ["run", str(job), "--progress", "off", *args])
    assert refused.exit_code == 5


def test_status_of_another_job_in_the_folder_says_not_complete(job: Path, tmp_path: Path):
    (tmp_path / "in").mkdir()
    write_shard(tmp_path / "in/a.parquet", 9)
    other = load_job(job, [f'input.path=["{tmp_path / "in"}"]'])
    status = job_status(other)
    assert not status["complete"] and "holds the output of another job" in status["refused"]


@pytest.mark.parametrize("fault", ["deleted", "fifo"])
def test_a_model_file_gone_is_the_model_error_not_an_incomplete_output(tmp_path: Path, fault):
    """`status` still shows what is committed, and says the model is at fault; it exits 4,
    as the run does, and so does `--check` (the model's error, naming the file), not 13, and
    neither advises --restart."""
    job = tiny_job(tmp_path)
    write_shard(tmp_path / "in/a.parquet", 9)
    run_job(load_job(job))
    weights = tmp_path / "mlp.safetensors"
    weights.unlink()
    if fault == "fifo":
        os.mkfifo(weights)
    status = job_status(load_job(job))
    assert not status["complete"] and status["refused"] is None
    assert str(weights) in status["model_error"] and status["rows_done"] == 9
    shown = CliRunner().invoke(main, ["status", str(job)])
    assert shown.exit_code == 4 and str(weights) in shown.stdout and "9 of 9" in shown.stdout
    checked = CliRunner().invoke(main, ["status", str(job), "--check"])
    assert checked.exit_code == 4, checked.output
    assert str(weights) in checked.stderr and "--restart" not in checked.output


def test_a_path_that_left_and_came_back_is_its_new_shards_state(tmp_path: Path):
    """A shard renamed away has its output moved to gone/; a new file later under the old
    name is a shard of its own: once scored, status calls it done, not gone (the retirement's
    plan names the old path, which must not hide the new input). Found by the output state
    machine (tests/output/test_state_machine.py) after a change compared paths with keys."""
    job = tiny_job(tmp_path)
    inputs = tmp_path / "in"
    write_shard(inputs / "zz.parquet", 6)
    run_job(load_job(job))
    (inputs / "zz.parquet").rename(inputs / "e.parquet")
    run_job(load_job(job))  # zz's output moves to gone/, e is scored
    write_shard(inputs / "zz.parquet", 5, seed=2)  # the old name, new rows
    run_job(load_job(job))
    status = job_status(load_job(job))
    states = {Path(s["shard"]).name: s["state"] for s in status["shards"]}
    assert states == {"e.parquet": "done", "zz.parquet": "done"}, status["shards"]
    assert status["complete"]


def by_rows(tmp_path: Path, **extra: str) -> Path:
    """A complete output by rows (`increments = "rows"`) of a.parquet (10 rows, 3 chunks of
    4) and b.parquet (30 rows, 8 chunks)."""
    job = rows_job(tmp_path, **extra)
    write_rows(tmp_path / "in/a.parquet", rows_table([f"a{i}" for i in range(10)]))
    write_rows(tmp_path / "in/b.parquet", rows_table([f"b{i}" for i in range(30)], seed=1))
    run_job(load_job(job))
    return job


def shard_rows(status: dict) -> dict[str, tuple]:
    """Each shard's (state, chunks done, chunks, rows done, rows, rows written), by name."""
    keys = ("state", "chunks_done", "chunks", "rows_done", "rows", "rows_written")
    return {Path(s["shard"]).name: tuple(s[k] for k in keys) for s in status["shards"]}


def test_status_by_rows_counts_rows_and_chunks_and_names_damaged_files(tmp_path: Path):
    """By rows, status says what is true: rows committed and to score, chunks committed of
    the shard's, nothing "dropped by [input].where" without a where; and it names a committed
    file that is missing or damaged, as by shards, with its shard's state."""
    job = by_rows(tmp_path)
    status = job_status(load_job(job))
    assert shard_rows(status) == {
        "a.parquet": ("done", 3, 3, 10, 10, 10),
        "b.parquet": ("done", 8, 8, 30, 30, 30),
    }
    text = CliRunner().invoke(main, ["status", str(job)]).output
    assert "40 of 40 rows committed - complete" in text and "dropped" not in text
    write_rows(tmp_path / "in/c.parquet", rows_table([f"c{i}" for i in range(5)], seed=2))
    status = job_status(load_job(job))
    assert shard_rows(status)["c.parquet"] == ("pending", 0, 2, 0, 5, 0)
    assert status["rows_done"] == 40 and status["rows"] == 45 and not status["complete"]
    files = {json.loads(p.read_text())["file"]: json.loads(p.read_text())["shard"]["path"]
             for p in (tmp_path / "out/_batchscore/done").glob("*.json")}  # fmt: skip
    gone = next(f for f, path in sorted(files.items()) if path.endswith("a.parquet"))
    cut = next(f for f, path in sorted(files.items()) if path.endswith("b.parquet"))
    (tmp_path / "out" / gone).unlink()
    data = (tmp_path / "out" / cut).read_bytes()
    (tmp_path / "out" / cut).write_bytes(data[:-20])
    status = job_status(load_job(job))
    got = shard_rows(status)
    assert got["a.parquet"][:3] == ("missing", 2, 3) and got["b.parquet"][:3] == ("damaged", 7, 8)
    assert got["a.parquet"][3] + got["b.parquet"][3] == 40 - 8  # two files of 4 rows to score
    result = CliRunner().invoke(main, ["status", str(job), "--check"])
    assert result.exit_code == 13
    assert f"{gone}: missing" in result.output and f"{cut}: damaged" in result.output
    plan = json.loads(CliRunner().invoke(main, ["plan", str(job), "--json"]).stdout)
    counts = ("rows_committed", "chunks_committed", "chunks_to_score", "rows_to_score")
    assert [plan[k] for k in counts] == [32, 9, 1 + 1 + 2, 4 + 4 + 5]  # as status counts them


def test_status_by_rows_counts_the_rows_where_drops(tmp_path: Path):
    """With a where, by rows: the rows it drops count as done (none is to score) and are said
    to be dropped, as by shards."""
    job = by_rows(tmp_path, where="x0 > 0")
    inputs = [pq.read_table(tmp_path / f"in/{n}.parquet")["x0"].to_pylist() for n in "ab"]
    kept = [sum(x > 0 for x in xs) for xs in inputs]
    status = job_status(load_job(job))
    assert shard_rows(status) == {
        "a.parquet": ("done", 3, 3, 10, 10, kept[0]),
        "b.parquet": ("done", 8, 8, 30, 30, kept[1]),
    }
    text = CliRunner().invoke(main, ["status", str(job)]).output
    assert f"{sum(kept)} written, {40 - sum(kept)} dropped by [input].where - complete" in text
