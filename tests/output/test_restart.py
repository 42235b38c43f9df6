"""`--restart` is resumable: killed after it removed the commit records but before the data
files, the next start (a `--restart` or a plain run) finishes it, and the job with its new
settings completes; files batchscore did not write survive."""

from __future__ import annotations

import contextlib
import json
import signal
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from batchscore.errors import BookkeepingError
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from batchscore.recipes.status import job_status
from tests.commands import invoke, run
from tests.output.tiny import glob_ids, tiny_job, undeletable, write_shard

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


@pytest.mark.parametrize("cause", ["immutable", "eio"])
def test_a_restart_that_cannot_remove_a_data_file_drops_success_first_and_names_it(
    done: tuple[Path, list[str]], cause: str
):
    """A --restart that fails partway through removing data files (the second of them) stops
    with the write error (exit 6) naming the file, no traceback; `_SUCCESS` went before
    anything was removed, `status --check` says not complete, and once the cause is gone the
    next run finishes the restart and completes with every row once.

    "immutable" makes the file undeletable for real (``chattr +i``, root on a file system with
    the attribute; root ignores a read-only folder, and a read-only output folder would refuse
    `_SUCCESS`'s removal before any data file's). Where that cannot be done here (not root, no
    chattr), and for "eio" (a disk's I/O error cannot be produced on demand), the OSError is
    injected at the removal call through the ``restart-remove`` fault point."""
    job, ids = done
    out = job.parent / "out"
    first, second = data_files(out)[:2]
    with contextlib.ExitStack() as stack:
        faults = "restart-remove@2:eio"
        if cause == "immutable":
            faults = stack.enter_context(undeletable(out / second, "restart-remove@2:eacces"))

        failed = run(job, "--restart", *NEW, faults=faults)

        assert failed.returncode == 6, failed.stderr
        assert f"{out / second}: cannot remove" in failed.stderr
        assert "Traceback" not in failed.stderr
        assert not (out / "_SUCCESS").exists()
        assert not (out / first).exists() and (out / second).exists()  # half removed
        assert (out / "_batchscore/restart.json").is_file()
        checked = invoke("status", str(job), "--check", *NEW)
        assert checked.exit_code == 13, checked.output

    finished = run(job, *NEW)  # the cause gone

    assert finished.returncode == 0, finished.stderr
    assert glob_ids(out, ("part-0.parquet",)) == ids and len(data_files(out)) == 6
    assert (out / "_SUCCESS").is_file() and (out / "part-0.parquet").is_file()
    assert invoke("status", str(job), "--check", *NEW).exit_code == 0


FOREIGN = {
    "_batchscore/gone/notes.json": b'{"mine": true}',
    "_batchscore/gone/20260101T000000.000000Z-1.json.bak": b"a backup",
    "_batchscore/gone/mine/part-x.parquet.gone": b"kept by hand",
    "_batchscore/rejected/README.txt": b"what these are",
    "_batchscore/rejected/reviewed.jsonl": b'{"row": 1}\n',
    "_batchscore/done/notes.json": b"{not json",
    "_batchscore/writing/todo.json": b'{"chunk": "x"}',
}


def test_a_restart_and_the_gone_clean_up_remove_only_what_batchscore_wrote(
    done: tuple[Path, list[str]],
):
    """Files a user put in batchscore's own folders (notes beside the kept output, reviewed
    rejected rows) are not batchscore's: no run, retirement or --restart removes them."""
    job, ids = done
    out = job.parent / "out"
    for rel, data in FOREIGN.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    (job.parent / "in/b.parquet").unlink()  # its output moves to gone/
    assert run_job(load_job(job))["outcome"] == "ok"
    assert glob_ids(out, ("part-0.parquet",)) == ids[:10]

    report = run_job(load_job(job, ["output.chunk_rows=3"]), restart=True)

    assert report["rows"] == 10 and glob_ids(out, ("part-0.parquet",)) == ids[:10]
    kept = [p.relative_to(out).as_posix() for p in out.glob("_batchscore/gone/*/*")]
    assert kept == ["_batchscore/gone/mine/part-x.parquet.gone"]  # the user's; b's output went
    for rel, data in FOREIGN.items():
        assert (out / rel).read_bytes() == data, rel
    assert (out / "part-0.parquet").read_bytes() == b"a user's own file"


def test_a_planted_plan_moves_and_removes_nothing_of_the_users(done: tuple[Path, list[str]]):
    """A retirement plan or a restart list naming a user's file (edited by hand, or planted by
    another user of a shared folder) was not written by batchscore: the user's file is neither
    moved to gone/ nor removed. The plan is skipped with a warning; the list stops a plain run
    (exit 10) and a --restart lists the folder again."""
    job, ids = done
    out = job.parent / "out"
    plan = out / "_batchscore/gone/20260101T000000.000000Z-1.json"
    moved = "_batchscore/gone/20260101T000000.000000Z-1/part-0.parquet.gone"
    plan.write_text(
        json.dumps({"state": "moving", "shards": [], "moves": [["part-0.parquet", moved]]})
    )
    assert run_job(load_job(job))["outcome"] == "ok"
    assert (out / "part-0.parquet").read_bytes() == b"a user's own file"
    assert not (out / moved).exists()

    listed = {"records": [], "files": ["part-0.parquet", "notes.txt", "../outside.txt"]}
    (out / "notes.txt").write_text("mine")
    (job.parent / "outside.txt").write_text("mine too")
    (out / "_batchscore/restart.json").write_text(json.dumps(listed))
    with pytest.raises(BookkeepingError, match=r"restart.json: damaged .*part-0.parquet"):
        run_job(load_job(job))
    run_job(load_job(job, ["output.chunk_rows=3"]), restart=True)

    assert glob_ids(out, ("part-0.parquet",)) == ids
    assert (out / "part-0.parquet").read_bytes() == b"a user's own file"
    assert (out / "notes.txt").read_text() == "mine"
    assert (job.parent / "outside.txt").read_text() == "mine too"
