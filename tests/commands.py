"""Running batchscore as the tests run it: in this process through click's runner (fast, for
what a command says and how it exits), or as a real subprocess, the way cron starts it (for
kills, stops and fault points, armed through the ``BATCHSCORE_FAULTS`` test hook).

One place, so that every test starts a run the same way and a change to how runs are started
(an option, an environment variable) is made once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner, Result

from batchscore.cli import main

ROOT = Path(__file__).resolve().parent.parent


def invoke(*args: str, catch: bool = True) -> Result:
    """``batchscore ARGS`` in this process; ``catch=False`` lets an exception reach the test."""
    return CliRunner().invoke(main, list(args), catch_exceptions=catch)


def environment(faults: str = "", **extra: str) -> dict[str, str]:
    """This process's environment, with the checkout importable, ``faults`` armed and
    ``extra`` variables set (``TMPDIR``, the S3 variables)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "BATCHSCORE_FAULTS": faults, **extra}


def command(job: Path, *args: str, verb: str = "run") -> list[str]:
    """The command line of ``batchscore VERB JOB ARGS``, progress off for ``run``."""
    quiet = ["--progress", "off"] if verb == "run" else []
    return [sys.executable, "-m", "batchscore", verb, str(job), *quiet, *args]


def start(job: Path, *args: str, faults: str = "", **extra: str) -> subprocess.Popen:
    """``batchscore run JOB ARGS`` started in a subprocess (its output on pipes)."""
    return subprocess.Popen(
        command(job, *args),
        env=environment(faults, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def run(
    job: Path, *args: str, faults: str = "", timeout: float = 300, **extra: str
) -> subprocess.CompletedProcess:
    """``batchscore run JOB ARGS`` in a subprocess, to its end (text output); a run that does
    not end within ``timeout`` seconds fails the test."""
    return subprocess.run(
        command(job, *args),
        env=environment(faults, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_for_commits(out: Path, count: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Until ``count`` commit records are in ``out``; the run ending first, or the time
    running out, fails the test (with the run's stderr)."""
    done = out / "_batchscore" / "done"
    deadline = time.time() + timeout
    while not done.is_dir() or len(list(done.glob("*.json"))) < count:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else proc.returncode
        assert time.time() < deadline, f"fewer than {count} commits in {timeout} s"
        time.sleep(0.002)
