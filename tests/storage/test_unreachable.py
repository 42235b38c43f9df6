"""An object-store output that nobody answers, or whose server keeps failing, stops `batchscore
run` with exit 7 naming the URL after bounded retries, never a traceback; and what is planted
where its local lock goes (a link, a folder of another user's) stops it with exit 6, untouched.
Each through the command line, in a subprocess, as a user meets it."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscore.storage import open_store
from batchscore.storage.objects import local_folder
from tests.commands import run
from tests.conftest import write_job
from tests.storage.conftest import Flaky

TRIES = "did not answer after 5 tries"
OTHER_UID = 54321


def closed_port() -> int:
    """A loopback port nobody listens on (bound for a moment, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def small_job(tmp_path: Path, small_corpus: pa.Table, output: str) -> Path:
    (tmp_path / "in").mkdir()
    pq.write_table(small_corpus.slice(0, 20), tmp_path / "in" / "docs.parquet")
    return write_job(
        tmp_path / "job.toml",
        input={"path": "in", "text": "text", "id": "doc_id"},
        model={"task": "embed", "max_length": 64, "threads": 1},
        output={"path": output},
    )


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own temp folder, here and (as TMPDIR) in the runs it starts."""
    folder = tmp_path / "tmp"
    folder.mkdir(mode=0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_an_output_store_nobody_answers_stops_the_run_with_exit_7(tmp_path, temp, small_corpus):
    job = small_job(tmp_path, small_corpus, "s3://nobody-answers/out")
    done = run(
        job,
        timeout=400,
        TMPDIR=str(temp),
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{closed_port()}",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    assert done.returncode == 7, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("batchscore: error: s3://nobody-answers/out/") and TRIES in last
    assert "run again" in last


@pytest.mark.s3
def test_a_store_whose_server_keeps_failing_stops_the_run_with_exit_7(
    bucket, flaky_s3, tmp_path, temp, small_corpus
):
    name = bucket.removeprefix("s3://")
    flaky_s3.extend(Flaky(method, f"/{name}", failures=10**6) for method in ("GET", "HEAD", "PUT"))
    job = small_job(tmp_path, small_corpus, f"{bucket}/out")
    done = run(job, timeout=400, TMPDIR=str(temp), AWS_ENDPOINT_URL=os.environ["AWS_ENDPOINT_URL"])
    assert done.returncode == 7, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"batchscore: error: {bucket}/out/") and TRIES in last


@pytest.mark.s3
def test_what_is_planted_where_the_lock_goes_stops_the_run_untouched(
    bucket, tmp_path, temp, small_corpus
):
    url = f"{bucket}/out"
    job = small_job(tmp_path, small_corpus, url)
    store = open_store(url)
    store.check()  # the private folder, as an earlier run leaves it
    folder, lock = local_folder(url), store.lock_path
    victim = tmp_path / "victim.txt"
    victim.write_text("another user's file\n")

    os.chown(folder, OTHER_UID, -1)  # another user's folder where ours goes
    lock.symlink_to(victim)
    done = run(job, timeout=400, TMPDIR=str(temp))
    assert done.returncode == 6, done.stderr
    assert f"{folder}: belongs to another user (uid {OTHER_UID})" in done.stderr
    assert "Traceback" not in done.stderr

    os.chown(folder, os.geteuid(), -1)  # ours again, but the link is still there
    done = run(job, timeout=400, TMPDIR=str(temp))
    assert done.returncode == 6, done.stderr
    assert f"{lock}: is a symbolic link" in done.stderr and "Traceback" not in done.stderr
    assert victim.read_text() == "another user's file\n" and lock.is_symlink()

    lock.unlink()
    done = run(job, timeout=400, TMPDIR=str(temp))
    assert done.returncode == 0, done.stderr
    assert lock.is_file() and not lock.is_symlink()
