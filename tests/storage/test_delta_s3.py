"""A Delta table output in S3 (moto's server on loopback), through the same standard AWS
variables as the Parquet output: written, read by deltalake and polars, resumed after a kill
between the Delta commit and the commit records without a row twice."""

from __future__ import annotations

import signal
from pathlib import Path

import polars as pl
import pytest

from batchscore.job.parse import load_job
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.delta import app_id, storage_options
from batchscore.recipes.run import run_job
from tests.commands import run
from tests.output.tiny import tiny_job, write_shard

deltalake = pytest.importorskip("deltalake", reason="the Delta tests need deltalake (dev extra)")
pytestmark = pytest.mark.s3


def test_delta_table_in_s3_is_written_read_and_resumed_after_a_kill(bucket: str, tmp_path: Path):
    url = f"{bucket}/scores"
    job = tiny_job(tmp_path, output=url)
    job.write_text(job.read_text().replace("[output]\n", '[output]\nformat = "delta"\n', 1))
    ids = write_shard(tmp_path / "in/a.parquet", 10) + write_shard(tmp_path / "in/b.parquet", 5)
    killed = run(job, faults="after-table-commit@2:kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    report = run_job(load_job(job))

    assert report["outcome"] == "ok"
    options = storage_options(url)  # only what plain HTTP on loopback needs; the rest: AWS_*
    dt = deltalake.DeltaTable(url, storage_options=options)
    assert sorted(dt.to_pyarrow_table(columns=["id"])["id"].to_pylist()) == sorted(ids)
    committed = Checkpoint(url).committed()
    assert len(dt.file_uris()) == len(committed) == 5
    assert all(dt.transaction_version(app_id(key)) % 2 == 1 for key in committed)
    frame = pl.read_delta(url, storage_options=options)
    assert sorted(frame["id"].to_list()) == sorted(ids)
    assert any(h.get("batchscore.job") == "job" for h in dt.history())
