"""Fault injection: crashes at every step of the commit protocol, random SIGKILLs, failed
writes, out-of-memory, and transient read errors. After each, the job completes with every row
exactly once, in order, equal to a clean run."""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest

from batchscore import faults
from batchscore.errors import InputDataError, TransientIOError, WriteError
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from tests.commands import start
from tests.conftest import read_output
from tests.reliability import (
    assert_complete_and_equal,
    assert_nothing_uncommitted_visible,
    make_job,
)

SOAK_CHUNK = 5  # rows per chunk in the kill soaks: many commits, so kills land all through a run
CRASH_POINTS = ["after-temp-write", "after-fsync", "after-rename", "before-record",
                "after-record", "model-batch"]  # fmt: skip


@pytest.fixture(scope="module")
def corpus120(small_corpus) -> pa.Table:
    return small_corpus.slice(0, 120)


@pytest.fixture(scope="module")
def clean(tmp_path_factory, corpus120) -> pa.Table:
    """The output of an undisturbed run of the same job."""
    job = make_job(tmp_path_factory.mktemp("clean"), corpus120)
    run_job(load_job(job))
    return read_output(job.parent / "out")


@pytest.fixture
def job(tmp_path: Path, corpus120) -> Path:
    return make_job(tmp_path, corpus120)


def test_fault_specs_are_checked():
    assert faults.parse("after-rename@3:kill, model-batch:oom>100")["model-batch"].over == 100
    assert faults.parse("model-batch:sleep=0.25")["model-batch"].seconds == 0.25
    with pytest.raises(ValueError, match="bad fault spec"):
        faults.parse("after-renam:kill")


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_at_each_step_then_resume(job: Path, clean, point: str):
    crashed = start(job, faults=f"{point}@4:kill")
    crashed.communicate(timeout=300)
    assert crashed.returncode == -signal.SIGKILL
    out = job.parent / "out"
    assert_nothing_uncommitted_visible(out)
    resumed = start(job)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()
    assert_complete_and_equal(out, clean)


def soak(job: Path, clean: pa.Table, kills: int, seed: int) -> None:
    """SIGKILL the job `kills` times in a row at random moments of its work (so most kills land
    in a resume), checking after each that nothing uncommitted is visible; then finish it."""
    rng = random.Random(seed)
    out = job.parent / "out"
    done = out / "_batchscore/done"
    landed: list[int] = []

    def commits() -> int:
        return len(list(done.glob("*.json")))

    while len(landed) < kills:
        before = commits()
        assert before < len(clean) // SOAK_CHUNK, "the job finished before every kill landed"
        proc = start(job)
        # Wait for 0-2 more commits, then a delay shorter than one 5-row chunk takes, so a kill
        # lands anywhere in the load, the model loop or the commit protocol, yet each costs at
        # most a few chunks of progress however fast the machine is.
        wanted = before + rng.choice([0, 1, 1, 2])
        while proc.poll() is None and commits() < wanted:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.02))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            landed.append(commits())
        proc.wait()
        assert_nothing_uncommitted_visible(out)
    final = start(job)
    _, err = final.communicate(timeout=300)
    assert final.returncode == 0, err.decode()
    assert_complete_and_equal(out, clean)
    assert len(set(landed)) >= kills // 4, landed  # kills spread over the whole run


@pytest.fixture(scope="module")
def corpus360(small_corpus) -> pa.Table:
    return small_corpus


@pytest.fixture(scope="module")
def clean360(tmp_path_factory, corpus360) -> pa.Table:
    job = make_job(tmp_path_factory.mktemp("clean360"), corpus360, chunk_rows=SOAK_CHUNK)
    run_job(load_job(job))
    return read_output(job.parent / "out")


@pytest.fixture
def job360(tmp_path: Path, corpus360) -> Path:
    return make_job(tmp_path, corpus360, chunk_rows=SOAK_CHUNK)


def test_random_kills(job360: Path, clean360):
    soak(job360, clean360, kills=20, seed=20261202)


@pytest.mark.soak
@pytest.mark.timeout(1800)  # 101 fresh processes, each paying torch's start-up (about 6 s here)
def test_random_kills_soak(tmp_path: Path, small_corpus, corpus):
    """100 kills: a job over 1,500 texts in 5-row chunks (300 chunks)."""
    bigger = corpus.slice(0, 1500)
    reference = make_job(tmp_path / "clean", bigger, chunk_rows=SOAK_CHUNK)
    run_job(load_job(reference))
    job = make_job(tmp_path / "soak", bigger, chunk_rows=SOAK_CHUNK)
    soak(job, read_output(tmp_path / "clean/out"), kills=100, seed=1)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("write-chunk@4:enospc", "the disk is full"),
        ("write-record@2:enospc", "the disk is full"),
        ("write-chunk@3:eacces", "permission denied"),
        ("write-record@1:eacces", "permission denied"),
    ],
)
def test_write_failure_stops_cleanly_and_next_run_completes(job: Path, clean, fault, message):
    """Simulated: this machine cannot fill a disk or deny root a write for real."""
    with faults.armed(fault), pytest.raises(WriteError, match=message):
        run_job(load_job(job))
    out = job.parent / "out"
    assert_nothing_uncommitted_visible(out)
    assert {p.name for p in out.glob("*.parquet")} <= {
        f"part-{p.stem}.parquet" for p in (out / "_batchscore/done").glob("*.json")
    }
    report = run_job(load_job(job))
    assert report["outcome"] == "ok"
    assert_complete_and_equal(out, clean)


def test_a_transient_read_error_is_retried_and_reading_resumes(job: Path, clean):
    with faults.armed("read-window@5:eio"):
        report = run_job(load_job(job))
    assert report["retries"] == 1 and report["outcome"] == "ok"
    assert_complete_and_equal(job.parent / "out", clean)  # resumed where it stopped: no row twice


def test_a_transient_read_error_that_persists_fails_the_run_not_the_rows(job: Path, clean):
    with faults.armed("read-window:eio"), pytest.raises(TransientIOError, match="5 tries"):
        run_job(load_job(job))
    runs = [json.loads(p.read_text()) for p in (job.parent / "out/_batchscore/runs").glob("*")]
    assert runs[0]["retries"] == 4  # bounded: 5 tries, then the run stops (exit 7)
    assert run_job(load_job(job))["rows"] <= 120  # what was committed is kept
    assert_complete_and_equal(job.parent / "out", clean)


def test_out_of_memory_splits_batches_and_loses_nothing(job: Path, clean, caplog):
    """Simulated CUDA out-of-memory (no GPU here): any batch over 300 padded tokens fails."""
    with faults.armed("model-batch:oom>300"):
        report = run_job(load_job(job))
    assert "out of memory on" in caplog.text
    assert report["padded_tokens"] > 0
    assert_complete_and_equal(job.parent / "out", clean)


def test_out_of_memory_on_the_quality_gates_sample_splits_it_and_the_run_goes_on(
    job: Path, clean, caplog
):
    """Simulated CUDA out-of-memory (no GPU here) in the gate's fp32 pass ("auto"), whose
    batches are cut under the trial's own budget: halved as the run's are, never fatal. The
    rows are too few for a faster precision to repay trying it, so the run adopts fp32's."""
    with faults.armed("gate-batch:oom>300"):
        report = run_job(load_job(job, ["model.precision=auto"]))
    assert report["settled"]["precision"]["precision"] == "fp32"
    assert "out of memory on" in caplog.text
    assert_complete_and_equal(job.parent / "out", clean)


def test_row_too_big_even_alone_is_a_row_error(job: Path):
    """Rows over 40 tokens 'cannot fit': with on_error = skip they are written with an error."""
    with faults.armed("model-batch:oom>40"):
        report = run_job(load_job(job, ["output.on_error=skip", "output.max_bad_share=1.0"]))
    out = read_output(job.parent / "out")
    assert out.num_rows == 120 and report["bad_rows"] > 0
    failed = [e for e in out["error"].to_pylist() if e]
    assert len(failed) == report["bad_rows"]
    assert all(e == "out of memory even as a batch of one row" for e in failed)
    nulls = out["embedding"].is_null().to_pylist()
    assert nulls == [e is not None for e in out["error"].to_pylist()]


def test_row_too_big_fails_its_shard_under_fail(job: Path):
    with faults.armed("model-batch:oom>40"), pytest.raises(InputDataError, match="out of memory"):
        run_job(load_job(job))
