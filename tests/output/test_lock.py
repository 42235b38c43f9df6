"""The lock: one holder at a time, and a killed holder leaves no stale lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batchscore.errors import LockHeldError
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
