"""A shard that left the input leaves the data files: renamed or removed, its output moves
under ``_batchscore/gone/`` at the next run's start, whole and recoverable, so a reader's glob
always sees the current input, each row once; a kill at any move is finished by the next start."""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from batchscore.recipes.status import job_status
from batchscore.storage.fs import filesystem
from batchscore.storage.layout import chunk_key, part_name, record_name, shard_key
from tests.commands import invoke, run
from tests.output.tiny import glob_ids, kept_ids, tiny_job, write_shard


def digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_renamed_shard_is_in_the_output_once_and_its_old_output_is_kept(tmp_path: Path):
    job = tiny_job(tmp_path)
    out = tmp_path / "out"
    a = write_shard(tmp_path / "in/a.parquet", 30)
    other = write_shard(tmp_path / "in/other.parquet", 5, seed=1)
    run_job(load_job(job))
    (out / "part-0.parquet").write_bytes(b"a user's own file")
    (tmp_path / "in/a.parquet").rename(tmp_path / "in/b.parquet")
    status = job_status(load_job(job))  # before the run: the old output is still visible
    gone = [s for s in status["shards"] if s["state"] == "gone"]
    assert [(s["shard"], s["kept"]) for s in gone] == [(str(tmp_path / "in/a.parquet"), None)]
    assert not status["complete"] and "next run moves it" in gone[0]["problems"][0]

    report = run_job(load_job(job))

    assert sorted(glob_ids(out, ("part-0.parquet",))) == sorted(a + other)  # 35, not 65
    assert (out / "_SUCCESS").is_file() and report["outcome"] == "ok"
    assert (out / "part-0.parquet").read_bytes() == b"a user's own file"
    [moved] = report["gone_shards"]
    assert moved["shard"] == str(tmp_path / "in/a.parquet") and moved["rows_written"] == 30
    assert kept_ids(out) == a  # recoverable, in order
    status = job_status(load_job(job))
    gone = [s for s in status["shards"] if s["state"] == "gone"]
    assert [(s["shard"], s["kept"], s["rows_done"]) for s in gone] == [
        (moved["shard"], moved["kept"], 30)
    ]
    assert status["complete"] and status["rows"] == 35


def test_a_removed_shard_leaves_the_glob_and_a_returning_one_is_scored_again(tmp_path: Path):
    job = tiny_job(tmp_path)
    out = tmp_path / "out"
    a = write_shard(tmp_path / "in/a.parquet", 9)
    b = write_shard(tmp_path / "in/b.parquet", 6, seed=1)
    run_job(load_job(job))
    (tmp_path / "in/a.parquet").rename(tmp_path / "a.parquet")
    assert run_job(load_job(job))["rows"] == 0
    assert glob_ids(out) == b and kept_ids(out) == a
    (tmp_path / "a.parquet").rename(tmp_path / "in/a.parquet")  # back: its output is not
    assert run_job(load_job(job))["rows"] == 9
    assert glob_ids(out) == a + b
    (tmp_path / "in/a.parquet").unlink()
    run_job(load_job(job))  # gone a second time: a second retirement keeps it again
    assert glob_ids(out) == b and kept_ids(out) == a + a
    assert len(list((out / "_batchscore/gone").glob("*.json"))) == 2


@pytest.mark.parametrize("move", range(1, 7))
def test_a_kill_at_any_move_leaves_each_file_once_and_the_next_run_finishes(
    tmp_path: Path, move: int
):
    """3 chunks move, each as its data file, then its record: 6 moves, a SIGKILL after each."""
    job = tiny_job(tmp_path)
    out = tmp_path / "out"
    a = write_shard(tmp_path / "in/a.parquet", 10)
    b = write_shard(tmp_path / "in/b.parquet", 3, seed=1)
    run_job(load_job(job))
    before = digests(out)
    (tmp_path / "in/a.parquet").unlink()

    killed = run(job, faults=f"retire-move@{move}:kill")

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    [plan_file] = (out / "_batchscore/gone").glob("*.json")
    plan = json.loads(plan_file.read_text())
    assert plan["state"] == "moving"
    key = shard_key(str(tmp_path / "in/a.parquet"))
    for rel in [name(chunk_key(key, c)) for c in range(3) for name in (part_name, record_name)]:
        kept = next(m[1] for m in plan["moves"] if m[0] == rel)
        assert (out / rel).is_file() != (out / kept).is_file(), rel  # old place or new, once
        assert before[rel] == digests(out)[rel if (out / rel).is_file() else kept]
    assert sorted(glob_ids(out) + kept_ids(out)) == sorted(a + b)  # no row lost, none twice

    report = run_job(load_job(job))

    assert report["rows"] == 0 and glob_ids(out) == b and kept_ids(out) == a
    assert json.loads(plan_file.read_text())["state"] == "kept"
    [finished] = report["gone_shards"]  # the killed run's retirement, reported once finished
    assert finished["kept"] == str(plan_file.with_suffix("")) and finished["rows_written"] == 10
    status = job_status(load_job(job))
    assert [s["kept"] for s in status["shards"] if s["state"] == "gone"] == [
        str(plan_file.with_suffix(""))
    ]


@pytest.mark.s3
def test_gone_shards_leave_an_object_store_glob_too(bucket: str, tmp_path: Path):
    """No rename in S3: each file is copied, then deleted; a kill between moves is finished."""
    out = f"{bucket}/out"
    job = tiny_job(tmp_path, output=out)
    a = write_shard(tmp_path / "in/a.parquet", 10)
    b = write_shard(tmp_path / "in/b.parquet", 3, seed=1)
    run_job(load_job(job))
    (tmp_path / "in/a.parquet").rename(tmp_path / "in/c.parquet")

    killed = run(job, faults="retire-move@3:kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    report = run_job(load_job(job))

    fs, base = filesystem(out)
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    names = {i.path[len(base) + 1 :]: i.path for i in infos if i.is_file}
    glob = sorted(p for n, p in names.items() if n.endswith(".parquet"))
    kept = sorted(p for n, p in names.items() if n.endswith(".parquet.gone"))
    ids = [i for p in glob for i in pq.read_table(p, filesystem=fs)["id"].to_pylist()]
    assert sorted(ids) == sorted(b + [f"a-{i}" for i in range(10)])  # c holds a's rows
    assert report["rows"] == 10 and len(kept) == 3
    assert [i for p in kept for i in pq.read_table(fs.open_input_file(p))["id"].to_pylist()] == a
    status = job_status(load_job(job))
    assert [s["shard"] for s in status["shards"] if s["state"] == "gone"] == [
        str(tmp_path / "in/a.parquet")
    ]
    assert status["complete"]


@pytest.mark.parametrize(("leaves", "move"), [("renamed", 1), ("renamed", 3), ("removed", 6)])
def test_success_goes_before_a_retirement_moves_anything(tmp_path: Path, leaves: str, move: int):
    """A shard renamed (or removed), the next run SIGKILLed while it moves the old name's
    output to gone/ (after its first, third or last of 6 moves): `_SUCCESS` must not stay
    beside data that holds part of the old shard and none of the new name's rows (it goes
    before the plan is written), and `status --check` says not complete, even once every file
    moved but the plan is not yet marked kept."""
    job = tiny_job(tmp_path)
    out = tmp_path / "out"
    a = write_shard(tmp_path / "in/a.parquet", 10)
    b = write_shard(tmp_path / "in/b.parquet", 3, seed=1)
    run_job(load_job(job))
    assert (out / "_SUCCESS").is_file()
    if leaves == "renamed":
        (tmp_path / "in/a.parquet").rename(tmp_path / "in/c.parquet")
    else:
        (tmp_path / "in/a.parquet").unlink()

    killed = run(job, faults=f"retire-move@{move}:kill")

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / "_SUCCESS").exists()
    assert sorted(glob_ids(out) + kept_ids(out)) == sorted(a + b)  # each row once, old or new
    checked = invoke("status", str(job), "--check")
    assert checked.exit_code == 13, checked.output

    finished = run(job)

    assert finished.returncode == 0, finished.stderr
    c = [f"a-{i}" for i in range(10)] if leaves == "renamed" else []  # c holds a's rows
    assert sorted(glob_ids(out)) == sorted(b + c) and len(glob_ids(out)) == len(b + c)
    assert kept_ids(out) == a and (out / "_SUCCESS").is_file()
    assert invoke("status", str(job), "--check").exit_code == 0
