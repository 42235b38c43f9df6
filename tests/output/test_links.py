"""A symbolic link inside the output folder is never followed to write, rename or delete: a link
where `_batchscore`, one of its folders, a data file, `_SUCCESS` or a temporary file goes stops
the run (exit 6) naming the link, and whatever it points to is left exactly as it was."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscore.errors import WriteError
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from batchscore.storage.disk import LocalStore
from batchscore.storage.layout import chunk_key, part_name, shard_key, staged_name
from batchscore.storage.store import READ_LIMIT
from tests.commands import invoke
from tests.output.tiny import tiny_job, write_shard

FOLDERS = ["_batchscore", *(f"_batchscore/{f}" for f in ("tmp", "done", "writing", "runs"))]
FOLDERS += ["_batchscore/rejected", "_batchscore/gone"]
FILES = ["_SUCCESS", "_batchscore/lock", "_batchscore/job.json", "data file", "tmp file"]


def tree(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` (links not followed), with the digest of its bytes."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def plant(out: Path, place: str, elsewhere: Path) -> Path:
    """Replace ``place`` in ``out`` with a link to a copy of it (plus a file of someone else's)
    in ``elsewhere``; return the link."""
    if place == "data file":
        place = next(p.name for p in out.glob("part-*.parquet"))
    if place == "tmp file":
        place = "_batchscore/tmp/part-0123456789abcdef-00000.parquet.4242.tmp"
    link = out / place
    target = elsewhere / link.name
    if link.is_dir():
        shutil.move(link, target)
        (target / "someone-elses.txt").write_text("not batchscore's\n")
    elif link.exists():
        shutil.move(link, target)
    else:
        target.write_text("not batchscore's\n")
    link.symlink_to(target, target_is_directory=target.is_dir())
    return link


@pytest.mark.parametrize("place", FOLDERS + FILES)
def test_a_link_in_the_output_folder_stops_the_run_and_its_target_is_untouched(
    tmp_path: Path, place: str
):
    job = tiny_job(tmp_path)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in "abc":
        write_shard(tmp_path / f"in/{name}.parquet", 5, seed=ord(name))
    run_job(load_job(job))
    link = plant(out, place, elsewhere)
    before = tree(elsewhere)
    (tmp_path / "in/a.parquet").unlink()  # work for every place: a shard to move out, one to
    write_shard(tmp_path / "in/d.parquet", 5)  # score; the tmp clean-up at the start

    result = invoke("run", str(job), "--progress", "off")

    assert result.exit_code == 6, result.output
    assert f"{link}: is a symbolic link" in result.stderr
    assert tree(elsewhere) == before and link.is_symlink()


OPERATIONS = {
    "write_json": lambda s: s.write_json("_batchscore/done/k.json", {"x": 1}),
    "write_text": lambda s: s.write_text("_batchscore/done/k.json", "x"),
    "write_many": lambda s: s.write_many({"_batchscore/done/k.json": {"x": 1}}),
    "delete": lambda s: s.delete("_batchscore/done/k.json"),
    "move out": lambda s: s.move("_batchscore/done/k.json", "_batchscore/gone/r/k.json"),
    "move in": lambda s: s.move("part-0.parquet", "_batchscore/done/k.json"),
    "prepare": lambda s: s.prepare("_batchscore/done"),
    "barrier": lambda s: s.barrier("_batchscore/done"),
    "publish": lambda s: s.publish(s.staging / "x.tmp", "_batchscore/done/k.json"),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
@pytest.mark.parametrize("where", ["folder", "file"])
def test_every_store_write_refuses_a_link_on_its_way(tmp_path: Path, operation: str, where: str):
    """Checked at each operation too, not only at a run's start: a link planted mid-run."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    store = LocalStore(out)
    store.prepare("_batchscore/done")
    (store.staging / "x.tmp").write_text("staged")
    (out / "part-0.parquet").write_text("a user's")
    elsewhere.mkdir()
    (elsewhere / "k.json").write_text("not batchscore's\n")
    link = out / "_batchscore/done"
    if where == "folder":
        link.rmdir()
        link.symlink_to(elsewhere, target_is_directory=True)
    else:
        link = link / "k.json"
        link.symlink_to(elsewhere / "k.json")
    before = tree(elsewhere)
    if operation in ("prepare", "barrier") and where == "file":
        OPERATIONS[operation](store)  # the folder is real: nothing is written through the link
    else:
        with pytest.raises(WriteError, match=f"{link}: is a symbolic link"):
            OPERATIONS[operation](store)
    assert tree(elsewhere) == before and link.is_symlink()


# -- whatever is planted where batchscore reads its bookkeeping -------------------------------
# Every bookkeeping file is read without following a link, only when it is a regular file, and
# to a cap: a link, a FIFO (an open would wait forever, holding the lock), a device (a read
# without end), a folder or a file past the cap stops the command naming it, or is left out of
# a listing unread, and nothing it points to changes. Each command also ends in time.

PLACES = {
    "settled": "_batchscore/settled.json",
    "restart list": "_batchscore/restart.json",
    "job record": "_batchscore/job.json",
    "_SUCCESS": "_SUCCESS",
    "lock": "_batchscore/lock",
    "commit record": "_batchscore/done/{record}",
    "intent": "_batchscore/writing/{record}",
    "run report": "_batchscore/runs/{report}",
    "retirement": "_batchscore/gone/20200101T000000.000000Z-1.json",
    "data file": "{part}",  # read for its size and footer only
}
LISTED = {"commit record", "intent", "run report", "retirement"}  # found by listing a folder,
# which leaves out what is not a regular file (or a link to one): never opened
THINGS = ["link to a file outside", "link to /dev/zero", "FIFO", "folder", "huge file"]
HUGE = (READ_LIMIT + 1) * 2  # sparse: costs no disk
COMMANDS = {  # what each command is given, and the exit statuses it may end with
    "run": (["--progress", "off"], {0, 5, 6, 10}),  # 5: not a data file batchscore wrote
    "status": ([], {0, 6, 10}),
    "report": (["-o", "{root}/report.html"], {0, 2, 6, 10}),  # 2: no report left to draw
}


class Hung(BaseException):
    """A command that did not end in time (a BaseException: nothing on the way catches it)."""


@contextmanager
def ends_within(seconds: int) -> Iterator[None]:
    """Fail a command that would wait forever (on a FIFO, say) instead of hanging the tests:
    SIGALRM interrupts the blocked call with `Hung`."""

    def alarm(signum: int, frame: object) -> None:
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def finished_folder(root: Path) -> tuple[Path, Path]:
    """A job whose run finished (3 shards), then changed (one shard gone, one new), so a run
    has everything to do: the job file and its output folder."""
    job = tiny_job(root)
    for name in "abc":
        write_shard(root / f"in/{name}.parquet", 5, seed=ord(name))
    run_job(load_job(job))
    (root / "in/a.parquet").unlink()
    write_shard(root / "in/d.parquet", 5)
    return job, root / "out"


def plant_thing(out: Path, place: str, thing: str, outside: Path) -> Path:
    """Put ``thing`` at ``place`` in ``out`` (replacing what is there); return its path."""
    kept = shard_key(str((out.parent / "in/b.parquet").resolve()))  # a shard still input
    record = f"{chunk_key(kept, 0)}.json"
    report = next((out / "_batchscore/runs").glob("*.json"), None)
    rel = PLACES[place].format(
        record=record, report=report.name if report else "x.json", part=part_name(record[:-5])
    )
    path = out / rel
    assert path.exists() or place not in ("commit record", "data file"), "replaces a real one"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    if thing == "link to a file outside":
        (outside / "theirs").write_text('{"precision": {"precision": "fp16"}, "outcome": "ok"}')
        path.symlink_to(outside / "theirs")
    elif thing == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif thing == "FIFO":
        os.mkfifo(path)
    elif thing == "folder":
        path.mkdir()
        (path / "someone-elses.txt").write_text("not batchscore's\n")
    else:
        with path.open("wb") as fh:
            fh.write(b'{"outcome": "ok", "pad": "')
            fh.truncate(HUGE)
    return path


def what_is_at(path: Path) -> tuple:
    """What ``path`` is, without following it: kind, link target, size, folder contents."""
    info = os.lstat(path)
    target = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
    inside = sorted(p.name for p in path.iterdir()) if stat.S_ISDIR(info.st_mode) else None
    return stat.S_IFMT(info.st_mode), target, info.st_size if target is None else 0, inside


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    place=st.sampled_from(sorted(PLACES)),
    thing=st.sampled_from(THINGS),
    command=st.sampled_from(sorted(COMMANDS)),
)
def test_whatever_is_planted_in_the_bookkeeping_is_never_followed_nor_waited_on(
    tmp_path_factory: pytest.TempPathFactory, place: str, thing: str, command: str
):
    root = tmp_path_factory.mktemp("planted")
    job, out = finished_folder(root)
    outside = root / "outside"
    outside.mkdir()
    planted = plant_thing(out, place, thing, outside)
    before, there = tree(outside), what_is_at(planted)
    args, allowed = COMMANDS[command]

    with ends_within(60):
        result = invoke(command, str(job), *(a.format(root=root) for a in args))

    assert result.exit_code in allowed, result.output
    if result.exit_code and not (command == "report" and result.exit_code == 2):
        assert f"{planted}: " in result.stderr, result.stderr
    assert tree(outside) == before
    if what_is_at(planted) != there:  # replaced by batchscore's own file, at its own name:
        assert result.exit_code == 0 and planted.is_file() and not planted.is_symlink()
        if place == "data file":  # a changed data file is scored again (never opened)
            assert command == "run" and thing != "folder" and "is damaged" in result.stderr
        else:  # a FIFO at a record's name, never opened (nor listed)
            assert thing == "FIFO" and place in LISTED and json.loads(planted.read_text())


STOPS = [  # (place, thing): how a run meets it
    *[(place, "FIFO") for place in ("settled", "restart list", "job record", "_SUCCESS")],
    *[(place, "folder") for place in ("settled", "restart list", "job record", "_SUCCESS")],
    *[(place, "huge file") for place in ("settled", "restart list", "job record", "_SUCCESS")],
    ("commit record", "huge file"),
    ("intent", "huge file"),
    ("retirement", "huge file"),
]


@pytest.mark.parametrize(("place", "thing"), STOPS)
def test_a_bookkeeping_file_that_is_not_a_regular_file_stops_the_run_as_damaged(
    tmp_path: Path, place: str, thing: str
):
    """Not a link (exit 6, above), but a FIFO, a folder or a file past the cap where a
    bookkeeping file is read: the bookkeeping error (exit 10), naming it, nothing removed."""
    job, out = finished_folder(tmp_path)
    planted = plant_thing(out, place, thing, tmp_path)
    there = what_is_at(planted)
    with ends_within(60):
        result = invoke("run", str(job), "--progress", "off")
    assert result.exit_code == 10, result.output
    assert f"{planted}: " in result.stderr
    assert "not a regular file" in result.stderr or "bytes, more than" in result.stderr
    assert what_is_at(planted) == there


@pytest.mark.parametrize("operation", ["write_json", "write_many", "stage"])
def test_a_hard_link_at_a_temporary_name_is_never_written_through(tmp_path: Path, operation):
    """``O_NOFOLLOW`` stops a symbolic link, not a hard link: a temporary file is made new
    (``O_EXCL``), so a hard link planted at the name it would take (the old ``.NAME.<pid>.tmp``,
    or a staged chunk's) is never truncated and written into."""
    out, victim = tmp_path / "out", tmp_path / "victim"
    victim.write_text("precious\n")
    store = LocalStore(out)
    store.prepare("_batchscore/done")
    done = out / "_batchscore/done"
    os.link(victim, done / f".k.json.{os.getpid()}.tmp")
    staged = store.staging / staged_name("part-0123456789abcdef-00000.parquet", os.getpid())
    os.link(victim, staged)
    if operation == "stage":
        with pytest.raises(FileExistsError):
            store.stage(staged, b"PAR1")
    else:
        write = {"write_json": store.write_json, "write_many": store.write_many}[operation]
        if operation == "write_json":
            write("_batchscore/done/k.json", {"x": 1})
        else:
            write({"_batchscore/done/k.json": {"x": 1}})
        assert json.loads((done / "k.json").read_text()) == {"x": 1}
    assert victim.read_text() == "precious\n" and victim.stat().st_nlink == 3
