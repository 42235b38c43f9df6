"""Transient object-store errors are retried: a real job against moto's S3 server on loopback,
reached through a proxy that answers some requests with 503 SlowDown (S3's throttling), more
times in a row than the S3 client's own retries absorb (it absorbs a few dozen)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchscore.errors import TransientIOError
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from tests.storage.conftest import Flaky
from tests.storage.test_storage import s3_job, upload_shards

pytestmark = pytest.mark.s3


def test_throttled_reads_are_retried_and_counted(bucket, flaky_s3, tmp_path, small_corpus):
    rules = flaky_s3
    upload_shards(small_corpus.slice(0, 45), tmp_path / "in", f"{bucket}/in")
    # reads of one shard fail 60 times in a row: more than the S3 client's own retries absorb
    rules.append(Flaky("GET", "/in/docs-001.parquet", failures=60))
    job = s3_job(tmp_path, f"{bucket}/in", f"{bucket}/out")
    report = run_job(load_job(job))
    assert rules[0].failed and report["outcome"] == "ok" and report["rows"] == 45
    assert report["retries"] >= 1


def test_a_store_that_keeps_failing_stops_the_run_after_bounded_retries(
    bucket, flaky_s3, tmp_path, small_corpus
):
    rules = flaky_s3
    upload_shards(small_corpus.slice(0, 15), tmp_path / "in", f"{bucket}/in")
    rules.append(Flaky("PUT", "/_batchscore/done/", failures=10_000))
    job = s3_job(tmp_path, f"{bucket}/in", f"{bucket}/out")
    with pytest.raises(TransientIOError, match=r"/out/_batchscore/done/.* did not answer"):
        run_job(load_job(job))
    assert not Path(tmp_path / "out").exists()
