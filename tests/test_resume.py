"""A real run in a subprocess, SIGKILLed midway, resumes to exactly a clean run's output."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest

from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from tests.commands import start, wait_for_commits
from tests.conftest import read_output


def test_sigkill_midway_then_resume_equals_clean_run(embed_job: Path, tmp_path: Path):
    clean = run_job(load_job(embed_job, ['output.path="clean"']))
    proc = start(embed_job)
    try:
        wait_for_commits(tmp_path / "out", 3, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    committed = len(list((tmp_path / "out/_batchscore/done").glob("*.json")))
    assert 3 <= committed < 9, "killed midway"
    resumed = start(embed_job)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()
    assert f"{9 - committed} committed now, {committed} already done" in out.decode()
    got, want = read_output(tmp_path / "out"), read_output(Path(clean["output"]))
    assert got["doc_id"].to_pylist() == want["doc_id"].to_pylist()
    a, b = np.array(got["embedding"].to_pylist()), np.array(want["embedding"].to_pylist())
    assert np.allclose(a, b, atol=1e-6)
    assert not list((tmp_path / "out/_batchscore/tmp").iterdir())


def test_two_runs_of_one_job_cannot_overlap(embed_job: Path, tmp_path: Path):
    first = start(embed_job)
    try:
        wait_for_commits(tmp_path / "out", 1, first)
        first.send_signal(signal.SIGSTOP)  # mid-run, lock held, however fast the rest would go
        second = start(embed_job)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 75
        assert f"pid {first.pid}" in err.decode()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()


@pytest.mark.slow
def test_killed_during_resume_too(embed_job: Path, tmp_path: Path):
    clean = run_job(load_job(embed_job, ['output.path="clean"']))
    for target in (2, 5):
        proc = start(embed_job)
        try:
            wait_for_commits(tmp_path / "out", target, proc)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    final = start(embed_job)
    assert final.wait(timeout=300) == 0
    got, want = read_output(tmp_path / "out"), read_output(Path(clean["output"]))
    assert got["doc_id"].to_pylist() == want["doc_id"].to_pylist()
    a, b = np.array(got["embedding"].to_pylist()), np.array(want["embedding"].to_pylist())
    assert np.allclose(a, b, atol=1e-6)
