"""The committer's time bound (`[output].commit_s`): rows are committed within ``commit_s`` of
their scoring, however large the chunk and the window, so a kill loses minutes, never the run.

Real subprocess runs, the model slowed by a fault hook (each batch sleeps), chunks larger than
the input and a sorting window across shards: the run is killed once a piece of a chunk is
committed (or at each step of that piece's commit), and the rerun scores only the rest; the
output equals a clean run's, every row once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sample_corpus

from batchscore.job.parse import load_job
from batchscore.models.fingerprint import fingerprint_parts
from batchscore.models.source.locate import locate
from batchscore.recipes.run import run_job
from tests.commands import invoke, run, start, wait_for_commits
from tests.conftest import read_output, write_job
from tests.output.formats import TABLES, table_ids
from tests.reliability import assert_complete_and_equal, assert_nothing_uncommitted_visible

COMMIT_S = 2.0
ROWS = 120  # two shards of 60 rows, each one chunk (chunk_rows = 1,000)
SLOW = "model-batch:sleep=0.2"  # a batch of at most 4 rows takes 0.2 s more: ~6 s of scoring
PIECE_POINTS = ["after-temp-write", "after-fsync", "after-rename", "before-record",
                "after-record"]  # fmt: skip


def slow_job(folder: Path, corpus: pa.Table, *, fmt: str = "parquet", by_rows: bool = False):
    """Two shards of 60 rows, one chunk each, a 64-row window across both."""
    sample_corpus.write_shards(corpus, folder / "in", shards=2, row_group_size=10)
    inp = {"path": "in", "text": "text", "id": "doc_id"}
    if by_rows:
        inp["increments"] = "rows"
    return write_job(
        folder / "job.toml",
        input=inp,
        model={"task": "embed", "max_length": 64, "threads": 1},
        batching={"max_tokens": 1024, "window_rows": 64, "max_rows": 4},
        output={"path": "out", "chunk_rows": 1000, "commit_s": COMMIT_S, "format": fmt},
    )


@pytest.fixture(scope="module")
def corpus120(small_corpus: pa.Table) -> pa.Table:
    return small_corpus.slice(0, ROWS)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, corpus120: pa.Table) -> pa.Table:
    """An undisturbed run's output (no commit bound reached: one file per shard)."""
    job = slow_job(tmp_path_factory.mktemp("clean"), corpus120)
    run_job(load_job(job))
    return read_output(job.parent / "out")


def records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (out / "_batchscore/done").glob("*.json")]


def attempted(out: Path) -> list[int]:
    """The rows of each data file a killed run left: staged, published or committed."""
    files = [*out.glob("*.parquet"), *(out / "_batchscore/tmp").glob("*.tmp")]
    return [pq.read_metadata(f).num_rows for f in files]


def last_report(out: Path) -> dict:
    return json.loads(sorted((out / "_batchscore/runs").glob("*.json"))[-1].read_text())


def loaded_at(proc: subprocess.Popen) -> tuple[threading.Event, dict[str, float]]:
    """Watch a run's JSON log (stderr) for the moment its model was loaded: its first batch
    starts then (the reader has windows ready), so this is its first scored row's time."""
    seen: dict[str, float] = {}
    ready = threading.Event()

    def watch() -> None:
        for line in proc.stderr:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") == "model loaded":
                when = datetime.fromisoformat(entry["time"].replace("Z", "+00:00"))
                seen["at"] = when.timestamp()
                ready.set()

    threading.Thread(target=watch, daemon=True).start()
    return ready, seen


def test_commit_s_decides_no_row_so_the_fingerprint_leaves_it_out(tmp_path: Path, corpus120):
    """A resumed run may use another ``commit_s``: it neither refuses the folder nor scores a
    committed piece again (`test_a_kill_keeps_what_commit_s_committed` resumes so)."""
    job = slow_job(tmp_path, corpus120)
    model = locate(load_job(job).model)
    parts = [
        fingerprint_parts(load_job(job, [f"output.commit_s={s}"]), model, "files")
        for s in (1, 300, 86_400)
    ]
    assert parts[0] == parts[1] == parts[2] and "commit_s" not in json.dumps(parts[0])


@pytest.mark.slow
def test_a_kill_keeps_what_commit_s_committed(tmp_path: Path, corpus120, clean):
    job = slow_job(tmp_path, corpus120)
    out = job.parent / "out"
    proc = start(job, "--log-format", "json", faults=SLOW)
    ready, seen = loaded_at(proc)
    wait_for_commits(out, 1, proc, timeout=120)
    first = min(r["committed_at"] for r in records(out))
    assert ready.wait(5)
    latency = first - seen["at"]
    print(f"first commit {latency:.2f} s after the first scored row (commit_s = {COMMIT_S})")
    assert latency <= COMMIT_S + 0.5, latency
    time.sleep(0.3)
    assert proc.poll() is None, "the run ended before it was killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = records(out)
    before = sum(r["rows"] for r in kept)
    assert 0 < before < ROWS
    assert any(r["stop"] - r["start"] < 60 for r in kept)  # a piece of a shard's one chunk
    assert_nothing_uncommitted_visible(out)
    status = json.loads(invoke("status", str(job), "--json").output)
    assert status["rows_done"] == before and not status["complete"]
    assert {s["state"] for s in status["shards"]} <= {"partial", "pending"}
    assert all(s["chunks_done"] == 0 for s in status["shards"])  # a piece is no whole chunk
    planned = json.loads(invoke("plan", str(job), "--json").output)
    assert planned["rows_committed"] == before and planned["rows_to_read"] == ROWS - before
    # another commit_s decides no row: the rerun resumes, and scores only what was not kept
    rerun = run(job, "--set", "output.commit_s=30")
    assert rerun.returncode == 0, rerun.stderr
    assert last_report(out)["rows"] == ROWS - before
    assert_complete_and_equal(out, clean)
    status = json.loads(invoke("status", str(job), "--json").output)
    assert status["complete"] and all(s["chunks_done"] == 1 for s in status["shards"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fmt", "by_rows", "point"),
    [("parquet", False, p) for p in PIECE_POINTS]
    + [("delta", False, p) for p in [*PIECE_POINTS, "after-table-commit"]]
    + [("parquet", True, p) for p in ["after-rename", "after-record"]]
    + [("delta", True, p) for p in ["after-table-commit", "after-record"]]
    # Iceberg's piece differs from Delta's at its table commit alone (CI's time: one case)
    + [("iceberg", True, "after-table-commit")],
)
def test_a_kill_in_a_pieces_commit_resumes_exactly_once(
    tmp_path: Path, corpus120, clean, fmt: str, by_rows: bool, point: str
):
    """The first commit of the run is a piece (no chunk is whole by then): killed at each step
    of it, the rerun finds every row once, each piece's rows in one file."""
    if fmt in TABLES:
        pytest.importorskip("deltalake" if fmt == "delta" else "pyiceberg")
    job = slow_job(tmp_path, corpus120, fmt=fmt, by_rows=by_rows)
    out = job.parent / "out"
    crashed = start(job, faults=f"{SLOW},{point}@1:kill")
    crashed.communicate(timeout=120)
    assert crashed.returncode == -signal.SIGKILL
    assert_nothing_uncommitted_visible(out)
    left = attempted(out)  # the commit it was killed in: a piece of a shard's one chunk
    assert left and all(rows < 60 for rows in left), left
    before = sum(r["rows"] for r in records(out))
    rerun = run(job)
    assert rerun.returncode == 0, rerun.stderr
    assert last_report(out)["rows"] == ROWS - before
    assert_complete_and_equal(out, clean)
    if fmt in TABLES:  # the table's readers read every row once
        ids = table_ids(out, fmt, column="doc_id")
        assert ids == sorted(clean["doc_id"].to_pylist())
