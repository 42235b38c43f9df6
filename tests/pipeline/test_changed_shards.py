"""A shard rewritten or shortened while a real run reads it: that shard fails alone, named (exit
3), and no chunk of it is committed from a version other than the one its record names; the
next run scores it whole from the new version.

`batchscore run` runs in a subprocess over a tiny MLP (the tensor task), a shard of many small
chunks beside one that stays as it is. Once the run has committed its first chunk it is stopped
(SIGSTOP), the shard is written again in place, and the run is let go on (SIGCONT).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import save_file

from batchscore.job.parse import load_job
from batchscore.models.numeric.factories import mlp
from batchscore.recipes.status import job_status
from tests.commands import run, start, wait_for_commits
from tests.conftest import output_files, source_of, write_job

pytestmark = pytest.mark.slow
ARGS = {"in_features": 4, "out_features": 3, "hidden": [8]}
ROWS, CHUNK = 1200, 4


def shard(path: Path, version: str, rows: int) -> pa.Table:
    """A shard of ``rows`` rows whose ids say its version (``A-00001``: the same length in
    every version, so a rewrite of as many rows keeps about the file's size)."""
    x = np.random.default_rng(ord(version)).normal(size=(rows, 4)).astype(np.float32)
    features = {f"x{j}": x[:, j] for j in range(4)}
    table = pa.table({"id": [f"{version}-{i:05d}" for i in range(rows)], **features})
    pq.write_table(table, path, row_group_size=64)
    return table


@pytest.fixture
def job(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    save_file(mlp(**ARGS).eval().state_dict(), str(tmp_path / "mlp.safetensors"))
    (tmp_path / "in").mkdir()
    shard(tmp_path / "in/a.parquet", "A", ROWS)
    shard(tmp_path / "in/steady.parquet", "S", 10)
    hour_ago = time.time_ns() - 3600 * 10**9  # written long before the run, as shards are
    for path in (tmp_path / "in").iterdir():
        os.utime(path, ns=(hour_ago, hour_ago))
    return write_job(
        tmp_path / "job.toml",
        input={"path": "in", "id": "id", "features": ["x0", "x1", "x2", "x3"]},
        model={"task": "tensor", "path": "mlp.safetensors", "threads": 1},
        batching={"max_rows": 8, "window_rows": CHUNK},
        output={"path": "out", "chunk_rows": CHUNK},
        tensor={"output": "class", "factory": "mlp", "factory_args": ARGS},
    )


def run_changing(job: Path, change: object) -> subprocess.CompletedProcess:
    """Run the job in a subprocess; after its first commit, stop it, ``change()`` the input,
    and let it finish. The change must land while most of the shard is still to be read."""
    proc = start(job)
    try:
        wait_for_commits(job.parent / "out", 1, proc)
        proc.send_signal(signal.SIGSTOP)
        done = list((job.parent / "out/_batchscore/done").glob("*.json"))
        assert len(done) < ROWS // CHUNK // 2, "too late to change it"
        change()
    finally:
        proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())


def committed(out: Path) -> dict[str, list[tuple[dict, pa.Table]]]:
    """Each shard's commit records, with the data file each names."""
    found: dict[str, list[tuple[dict, pa.Table]]] = {}
    for path in (out / "_batchscore/done").glob("*.json"):
        record = json.loads(path.read_text())
        found.setdefault(record["shard"]["path"], []).append(
            (record, pq.read_table(out / record["file"]))
        )
    return found


def check_versions(out: Path, shard_path: Path, version: str) -> None:
    """Every committed chunk of the shard holds rows of the one version its record names."""
    st = shard_path.stat()
    for record, table in committed(out).get(str(shard_path), []):
        ids = set(table["id"].to_pylist())
        now = {"path": str(shard_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        if record["shard"] == now:
            assert {i[0] for i in ids} <= {version}, (record, sorted(ids)[:3])
        else:  # committed from the old version, under its identity
            assert {i[0] for i in ids} <= {"A"}, (record, sorted(ids)[:3])


@pytest.mark.parametrize(
    ("version", "rows"), [("B", ROWS), ("C", 9)], ids=["rewritten", "shortened"]
)
def test_a_shard_changed_mid_run_fails_alone_then_is_scored_whole(
    job: Path, version: str, rows: int
):
    out, path = job.parent / "out", job.parent / "in/a.parquet"
    new: dict[str, pa.Table] = {}
    result = run_changing(job, lambda: new.setdefault("table", shard(path, version, rows)))
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    assert f"{path}: changed while the run read it" in result.stderr
    assert "steady.parquet" not in result.stderr
    check_versions(out, path, version)
    steady = [f for f in output_files(out) if source_of(f).endswith("steady.parquet")]
    assert pa.concat_tables(pq.read_table(f) for f in steady).num_rows == 10
    assert not (out / "_SUCCESS").exists()
    states = {s["shard"]: s["state"] for s in job_status(load_job(job))["shards"]}
    assert states[str(path)] != "done"

    again = run(job)
    assert again.returncode == 0, again.stderr
    check_versions(out, path, version)
    files = [f for f in output_files(out) if source_of(f) == str(path)]
    got = pa.concat_tables(pq.read_table(f) for f in files)
    assert got["id"].to_pylist() == new["table"]["id"].to_pylist()  # whole, once, in order
    assert (out / "_SUCCESS").is_file()
