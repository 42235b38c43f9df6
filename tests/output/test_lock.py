"""The lock: one holder at a time, and a killed holder leaves no stale lock."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batchscore.errors import LockHeldError, WriteError
from batchscore.output.lock import hold_lock

HOLDER = """
import sys, time
from pathlib import Path
from batchscore.output.lock import hold_lock
with hold_lock(Path(sys.argv[1]), "holder"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_second_holder_is_refused_naming_the_first(tmp_path: Path):
    lock = tmp_path / "_batchscore" / "lock"
    with (
        hold_lock(lock, "first"),
        pytest.raises(LockHeldError, match=rf"pid {os.getpid()} .*job first"),
        hold_lock(lock, "second"),
    ):
        pass
    with hold_lock(lock, "second"):
        pass  # released on exit


def test_sigkilled_holder_releases_the_lock(tmp_path: Path):
    lock = tmp_path / "_batchscore" / "lock"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"held"
        with pytest.raises(LockHeldError, match=f"pid {proc.pid}"), hold_lock(lock, "mine"):
            pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.time() + 5
    while True:
        try:
            with hold_lock(lock, "mine"):
                break
        except LockHeldError:
            assert time.time() < deadline, "lock not released after SIGKILL"
            time.sleep(0.05)


VICTIM = "a file of the user's, which the lock must never write into\n"


def plant(lock: Path, how: str, victim: Path) -> None:
    """Put something other than a lock file batchscore made where the lock goes."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    if how == "symlink":
        lock.symlink_to(victim)
    elif how == "dangling symlink":
        lock.symlink_to(victim.with_name("not-yet"))
    elif how == "hard link":
        os.link(victim, lock)
    elif how == "foreign file":
        lock.write_text(VICTIM)
    elif how == "fifo":
        os.mkfifo(lock)
    elif how == "folder":
        lock.mkdir()
    elif how == "huge file of zeros":  # reads as "nothing" at its start, but is not a record
        with lock.open("wb") as fh:
            fh.truncate(1 << 30)


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("symlink", "is a symbolic link"),
        ("dangling symlink", "is a symbolic link"),
        ("hard link", "is a hard link"),
        ("foreign file", "holds something other than a lock record"),
        ("fifo", "is not a plain file"),
        ("folder", "is not a plain file"),
        ("huge file of zeros", "holds something other than a lock record"),
    ],
)
def test_a_planted_lock_is_refused_and_left_as_it_is(tmp_path: Path, how: str, said: str):
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    lock = tmp_path / "_batchscore" / "lock"
    plant(lock, how, victim)
    with pytest.raises(WriteError, match=rf"{lock}: {said}.*remove it and run again"):  # noqa: SIM117
        with hold_lock(lock, "mine"):
            pytest.fail("the lock was taken")
    assert victim.read_text() == VICTIM and victim.stat().st_nlink == (
        2 if how == "hard link" else 1
    )
    assert not victim.with_name("not-yet").exists()
    assert os.path.lexists(lock)  # left where it was, for the user to see
    if how == "foreign file":
        assert lock.read_text() == VICTIM
    if how == "huge file of zeros":
        assert lock.stat().st_size == 1 << 30


def test_the_lock_folder_is_never_reached_through_a_link(tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "_batchscore").symlink_to(elsewhere)
    with pytest.raises(WriteError, match=r"_batchscore: is a symbolic link"):  # noqa: SIM117
        with hold_lock(tmp_path / "out" / "_batchscore" / "lock", "mine"):
            pass
    assert list(elsewhere.iterdir()) == []


def test_an_earlier_holders_record_or_an_empty_file_is_taken_over(tmp_path: Path):
    lock = tmp_path / "_batchscore" / "lock"
    with hold_lock(lock, "first"):
        pass
    first = json.loads(lock.read_text())
    assert first["pid"] == os.getpid() and first["job"] == "first"
    lock.write_text("")  # a holder killed before it wrote its record
    for job in ("second", "third"):
        with hold_lock(lock, job):
            assert json.loads(lock.read_text())["job"] == job
    assert stat.S_IMODE(lock.stat().st_mode) == 0o644 and lock.stat().st_nlink == 1
