"""An Iceberg table output in S3 (moto's server on loopback), through the same standard AWS
variables as the Parquet output (pyiceberg's FileIO does not read them itself: the table is
handed the environment, `batchscore.output.iceberg_catalog.file_io`): its own SQL catalog on
this machine beside the lock, the table's metadata and data in the bucket; each append and
retirement idempotent; read back by pyiceberg and polars, and from the bucket alone by its
version hint once the local catalog is gone; and a job through `batchscore run`, resumed
after a kill between an Iceberg commit and its commit records without a row twice."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscore.job.parse import load_job
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.keys import keys_of, publish_keys
from batchscore.output.manifest import FileFacts
from batchscore.recipes.run import run_job
from batchscore.storage import open_store
from batchscore.storage.layout import catalog_file, chunk_key, part_name, shard_key
from tests.commands import run
from tests.output.tiny import tiny_job, write_shard

pyiceberg = pytest.importorskip("pyiceberg", reason="the Iceberg tests need pyiceberg (dev extra)")
pytestmark = pytest.mark.s3

from pyiceberg.table import StaticTable  # noqa: E402

from batchscore.output.iceberg import CHUNK, Table  # noqa: E402
from batchscore.output.iceberg_catalog import file_io  # noqa: E402


def upload(store, key: str, ids: list[str]) -> tuple[str, FileFacts]:
    """A chunk's data file and keys, published to the bucket as the committer publishes."""
    rows = pa.table({"id": ids, "score": pa.array([0.5] * len(ids), pa.float32())})
    sink = pa.BufferOutputStream()
    pq.write_table(rows, sink)
    store.prepare()
    local = store.staging / f"{key}.tmp"
    store.stage(local, sink.getvalue())
    store.publish(local, part_name(key))
    publish_keys(store, key, keys_of(rows, "id"))
    return key, FileFacts(store.size(part_name(key)), len(ids), "", "")


def test_iceberg_table_in_s3_is_written_read_and_found_again(bucket: str, monkeypatch):
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    url = f"{bucket}/scores"
    store = open_store(url)
    store.check()
    a, b = chunk_key(shard_key("a"), 0), chunk_key(shard_key("b"), 0)
    files = [upload(store, a, ["a-0", "a-1"]), upload(store, b, ["b-0"])]
    schema = pa.schema([("id", pa.string()), ("score", pa.float32())])
    table = Table(store, lineage={"batchscore.job": "s3"}, id_column="id", env=os.environ)
    for _ in range(2):
        table.append(files, schema=schema, metadata={})
    assert table.retire([b]) == 1 and table.retire([b]) == 0

    assert catalog_file(store.lock_path).is_file()  # on this machine: SQLite needs a disk
    assert table.loaded().metadata_location.startswith(f"{url}/metadata/")
    assert sorted(table.loaded().scan().to_arrow()["id"].to_pylist()) == ["a-0", "a-1"]
    assert sorted(pl.scan_iceberg(table.loaded()).collect()["id"].to_list()) == ["a-0", "a-1"]
    io = file_io(url, os.environ)  # only what the AWS variables say, as FileIO properties
    static = StaticTable.from_metadata(url, properties=io)
    assert sorted(static.scan().to_arrow()["id"].to_pylist()) == ["a-0", "a-1"]

    catalog_file(store.lock_path).unlink()  # another machine: its catalog lacks the table
    again = Table(store, lineage={}, id_column="id", env=os.environ)
    again.append(files[:1], schema=schema, metadata={})
    assert again.version_of(a) == 1 and again.version_of(b) == 2
    assert sorted(again.loaded().scan().to_arrow()["id"].to_pylist()) == ["a-0", "a-1"]


def test_iceberg_job_in_s3_is_written_read_and_resumed_after_a_kill(
    bucket: str, tmp_path: Path, monkeypatch
):
    """`batchscore run` of an ``s3://`` Iceberg job, SIGKILLed between a group's Iceberg
    commit and its commit records, then resumed: each row once, the table's files exactly the
    committed chunks' (each chunk's version odd), read from the bucket alone by pyiceberg
    and polars; lineage in the snapshots' summaries."""
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    url = f"{bucket}/scores"
    job = tiny_job(tmp_path, output=url)
    job.write_text(job.read_text().replace("[output]\n", '[output]\nformat = "iceberg"\n', 1))
    ids = write_shard(tmp_path / "in/a.parquet", 10) + write_shard(tmp_path / "in/b.parquet", 5)
    killed = run(job, faults="after-table-commit@2:kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    report = run_job(load_job(job), environ=os.environ)

    assert report["outcome"] == "ok" and report["rows"] < len(ids)  # the kill's group kept
    table = StaticTable.from_metadata(url, properties=file_io(url, os.environ))
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == sorted(ids)
    committed = Checkpoint(url).committed()
    files = {t.file.file_path for t in table.scan().plan_files()}
    assert files == {f"{url}/{part_name(key)}" for key in committed} and len(files) == 5
    assert all(int(table.properties[CHUNK + key]) % 2 == 1 for key in committed)
    assert sorted(pl.scan_iceberg(table).collect()["id"].to_list()) == sorted(ids)
    assert all(s.summary["batchscore.job"] == "job" for s in table.snapshots())
    assert run_job(load_job(job), environ=os.environ)["rows"] == 0
