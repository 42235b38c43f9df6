"""`--restart` is resumable: killed after it removed the commit records but before the data
files, the next start (a `--restart` or a plain run) finishes it, and the job with its new
settings completes; files batchscore did not write survive."""

from __future__ import annotations

import signal
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from batchscore.errors import BookkeepingError
from batchscore.job.load import load_job
from batchscore.recipes.driver import run_job
from batchscore.recipes.status import job_status
from tests.commands import run
from tests.output.tiny import glob_ids, tiny_job, write_shard

NEW = ("--set", "output.chunk_rows=3")  # other settings: what a restart is for


@pytest.fixture
def done(tmp_path: Path) -> tuple[Path, list[str]]:
    """A complete output of two shards (chunks of 4 rows), a user's file beside it."""
    job = tiny_job(tmp_path)
    ids = write_shard(tmp_path / "in/a.parquet", 10) + write_shard(tmp_path / "in/b.parquet", 5)
    run_job(load_job(job))
    (tmp_path / "out/part-0.parquet").write_bytes(b"a user's own file")
    return job, ids


def data_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("part-*-*.parquet"))


@pytest.mark.parametrize("then", [("--restart",), ()], ids=["restart-again", "plain-run"])
def test_a_restart_killed_between_records_and_files_is_finished_next_time(
    done: tuple[Path, list[str]], then: tuple[str, ...]
):
    job, ids = done
    out = job.parent / "out"
    files = data_files(out)

    killed = run(job, "--restart", *NEW, faults="restart-unrecorded:kill")

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert data_files(out) == files and not list((out / "_batchscore/done").iterdir())
    status = job_status(load_job(job, ["output.chunk_rows=3"]))
    assert status["restarting"] and not status["complete"]
    assert {s["state"] for s in status["shards"]} == {"pending"}

    finished = run(job, *NEW, *then)

    assert finished.returncode == 0, finished.stderr
    assert glob_ids(out, ("part-0.parquet",)) == ids
    assert {pq.read_metadata(out / f).num_rows for f in data_files(out)} <= {1, 2, 3}
    assert len(data_files(out)) == 6  # 4 + 2 chunks of 3 rows: every old file went
    assert not (out / "_batchscore/restart.json").exists()
    assert (out / "part-0.parquet").read_bytes() == b"a user's own file"
    assert job_status(load_job(job, ["output.chunk_rows=3"]))["complete"]


def test_a_folder_an_older_restart_left_wedged_is_cleared_by_the_footers(
    done: tuple[Path, list[str]],
):
    """Records gone, data files left, no list (what an older version's killed restart left):
    the data files' footers say batchscore wrote them for the chunks their names say."""
    job, ids = done
    out = job.parent / "out"
    for record in (out / "_batchscore/done").iterdir():
        record.unlink()
    report = run_job(load_job(job, ["output.chunk_rows=3"]), restart=True)
    assert report["rows"] == 15 and glob_ids(out, ("part-0.parquet",)) == ids
    assert (out / "part-0.parquet").read_bytes() == b"a user's own file"


def test_a_damaged_restart_list_stops_a_plain_run_and_a_restart_lists_again(
    done: tuple[Path, list[str]],
):
    job, ids = done
    out = job.parent / "out"
    (out / "_batchscore/restart.json").write_text('{"records": [')
    with pytest.raises(BookkeepingError, match=r"restart.json: damaged .* run with --restart"):
        run_job(load_job(job))
    run_job(load_job(job, ["output.chunk_rows=3"]), restart=True)
    assert glob_ids(out, ("part-0.parquet",)) == ids and len(data_files(out)) == 6
