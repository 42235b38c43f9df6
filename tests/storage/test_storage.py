"""Output and input in an object store, against a real S3-compatible server on loopback (moto's):
the store's primitives, a whole job in S3 equal to a local run, and a crash between upload
and commit record that the next run cleans up."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import sample_corpus

from batchscore.errors import JobError, LockHeldError
from batchscore.job.parse import load_job
from batchscore.job.sections import InputConfig
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.lock import hold_lock
from batchscore.recipes.run import run_job
from batchscore.storage import open_store
from batchscore.storage.disk import LocalStore
from batchscore.storage.fs import filesystem
from batchscore.work.shards import find_shards
from tests.commands import start
from tests.conftest import read_output, write_job

pytestmark = pytest.mark.s3


def read_s3_output(url: str) -> pa.Table:
    """Read an output folder in S3 as the contract says: every data file, in the input order
    their footers name (source shard, then row range)."""
    fs, base = filesystem(url)
    infos = fs.get_file_info(pafs.FileSelector(base))
    parts = [i.path for i in infos if i.base_name.endswith(".parquet")]

    def source(path: str) -> tuple[bytes, int]:
        meta = pq.read_metadata(fs.open_input_file(path)).metadata
        return meta[b"batchscore.shard"], int(meta[b"batchscore.rows"].split(b"-")[0])

    return pa.concat_tables(pq.read_table(p, filesystem=fs) for p in sorted(parts, key=source))


def s3_names(url: str) -> list[str]:
    fs, base = filesystem(url)
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    return sorted(i.path[len(base) + 1 :] for i in fs.get_file_info(selector) if i.is_file)


def upload_shards(corpus: pa.Table, local: Path, url: str) -> None:
    sample_corpus.write_shards(corpus, local, shards=3, row_group_size=10)
    (local / "_SUCCESS").write_text("")  # a marker a Spark job leaves: not a shard
    pafs.copy_files(str(local), url)


def s3_job(folder: Path, input_url: str, output_url: str) -> Path:
    return write_job(
        folder / "job.toml",
        input={"path": input_url, "text": "text", "id": "doc_id"},
        model={"task": "embed", "max_length": 64, "threads": 1},
        batching={"max_tokens": 1024, "window_rows": 15},
        output={"path": output_url, "chunk_rows": 15},
    )


def test_store_primitives_round_trip(bucket: str, tmp_path: Path):
    store = open_store(f"{bucket}/out")
    store.prepare()
    assert store.read_text("_batchscore/job.json") is None and store.names("_batchscore") == []
    store.write_json("_batchscore/done/a.json", {"x": [1, 2]})
    assert json.loads(store.read_text("_batchscore/done/a.json")) == {"x": [1, 2]}
    staged = store.staging / "part.tmp"
    pq.write_table(pa.table({"n": list(range(1000))}), staged)
    store.publish(staged, "part-00000-00000.parquet")
    assert not staged.exists()  # the staged copy is gone once the object is whole in place
    assert store.names("") == ["part-00000-00000.parquet"]  # direct children only
    assert store.names("_batchscore/done") == ["a.json"]
    fs, base = filesystem(f"{bucket}/out")
    assert pq.read_table(f"{base}/part-00000-00000.parquet", filesystem=fs).num_rows == 1000
    store.delete("part-00000-00000.parquet")
    store.delete("part-00000-00000.parquet")  # already gone: fine
    assert store.names("") == []
    assert store.where("x/y") == f"{bucket}/out/x/y"


def test_lock_is_local_and_keyed_by_the_output_url(bucket: str):
    one, same = open_store(f"{bucket}/out"), open_store(f"{bucket}/out/")
    assert one.lock_path == same.lock_path != open_store(f"{bucket}/other").lock_path
    with hold_lock(one.lock_path, "first"), pytest.raises(LockHeldError):  # noqa: SIM117
        with hold_lock(same.lock_path, "second"):
            pass


def test_outputs_only_where_a_file_is_published_whole(tmp_path: Path):
    assert isinstance(open_store(f"file://{tmp_path}/out"), LocalStore)
    with pytest.raises(JobError, match=r"cannot write output to hdfs://"):
        open_store("hdfs://namenode/out")


def test_input_urls_are_listed_like_folders(bucket: str, tmp_path: Path, small_corpus):
    upload_shards(small_corpus.slice(0, 30), tmp_path / "in", f"{bucket}/in")
    shards = find_shards(InputConfig(path=(f"{bucket}/in",)))
    assert [s.path for s in shards] == [f"{bucket}/in/docs-00{i}.parquet" for i in range(3)]
    assert all(s.size > 0 and s.mtime_ns > 0 for s in shards)
    globbed = find_shards(InputConfig(path=(f"{bucket}/in/*-001.parquet",)))
    assert [s.path for s in globbed] == [f"{bucket}/in/docs-001.parquet"]
    with pytest.raises(JobError, match="no such file or folder"):
        find_shards(InputConfig(path=(f"{bucket}/nothing",)))


@pytest.fixture(scope="module")
def local_clean(tmp_path_factory, small_corpus) -> pa.Table:
    """The job's output from local files, the reference the S3 runs must equal."""
    folder = tmp_path_factory.mktemp("clean")
    sample_corpus.write_shards(small_corpus.slice(0, 90), folder / "in", shards=3,
                               row_group_size=10)  # fmt: skip
    run_job(load_job(s3_job(folder, "in", "out")))
    return read_output(folder / "out")


def assert_equal(got: pa.Table, want: pa.Table) -> None:
    assert got["doc_id"].to_pylist() == want["doc_id"].to_pylist()
    a, b = np.array(got["embedding"].to_pylist()), np.array(want["embedding"].to_pylist())
    assert np.allclose(a, b, atol=1e-6)


def test_job_in_s3_equals_local_run_and_resumes(bucket, tmp_path, small_corpus, local_clean):
    upload_shards(small_corpus.slice(0, 90), tmp_path / "in", f"{bucket}/in")
    job = s3_job(tmp_path, f"{bucket}/in", f"{bucket}/out")
    report = run_job(load_job(job))
    assert report["rows"] == 90 and report["chunks_committed"] == 6
    assert report["output"] == f"{bucket}/out"
    assert_equal(read_s3_output(f"{bucket}/out"), local_clean)
    names = s3_names(f"{bucket}/out")
    assert sum(n.startswith("part-") for n in names) == 6
    assert sum(n.startswith("_batchscore/done/") for n in names) == 6
    assert any(n.startswith("_batchscore/runs/") for n in names)
    again = run_job(load_job(job))
    assert again["rows"] == 0 and again["chunks_already_done"] == 6
    status = Checkpoint(f"{bucket}/out").committed()
    assert {r["shard"]["path"] for r in status.values()} == {
        f"{bucket}/in/docs-00{i}.parquet" for i in range(3)
    }


def test_crash_between_upload_and_record_then_resume(bucket, tmp_path, small_corpus, local_clean):
    """The object of the killed run's last chunk is whole in S3 but has no record: the next
    run deletes it, scores that chunk again, and the output equals a local run."""
    upload_shards(small_corpus.slice(0, 90), tmp_path / "in", f"{bucket}/in")
    job = s3_job(tmp_path, f"{bucket}/in", f"{bucket}/out")
    crashed = start(job, faults="after-rename@3:kill")
    _, err = crashed.communicate(timeout=600)
    assert crashed.returncode == -signal.SIGKILL, err.decode()
    names = s3_names(f"{bucket}/out")
    parts = [n for n in names if n.startswith("part-")]
    records = [n for n in names if n.startswith("_batchscore/done/")]
    assert len(parts) == 3 and len(records) == 2  # uploaded whole, not yet committed
    fs, base = filesystem(f"{bucket}/out")
    assert pq.read_metadata(f"{base}/{parts[-1]}", filesystem=fs).num_rows == 15
    report = run_job(load_job(job))
    assert report["chunks_committed"] == 4 and report["chunks_already_done"] == 2
    assert_equal(read_s3_output(f"{bucket}/out"), local_clean)
