"""Hostile input, damaged state and signals: a clear error, the good rows kept, never a traceback.

Real shards, the real MiniLM (or a tiny TorchScript model for numeric edge cases), real
subprocesses for signals, a real read-only file system and a real unprivileged user. Every
command and the Python API over one hostile corpus, in both formats and increment modes:
`tests/test_doors.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from batchscore.cli import main
from batchscore.errors import InputDataError, JobError
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from batchscore.recipes.status import job_status
from tests.conftest import read_output, record_of, write_job
from tests.reliability import make_job

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def job(tmp_path: Path, small_corpus) -> Path:
    """30 real texts in 3 shards of 10 rows, 2 chunks a shard."""
    return make_job(tmp_path, small_corpus.slice(0, 30), chunk_rows=5)


def shard(job: Path, n: int) -> Path:
    return sorted((job.parent / "in").glob("*.parquet"))[n]


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def no_traceback(result) -> None:
    assert "Traceback" not in result.output and not isinstance(result.exception, AssertionError)
    assert result.exit_code in (0, 2, 3, 4, 5, 6, 7, 8, 10, 11), (result.exit_code, result.output)


# -- rows -------------------------------------------------------------------------------------


def with_texts(path: Path, texts: list, kind: pa.DataType = pa.string()) -> None:
    """Rewrite a shard's text column (raw bytes go in as they are, valid UTF-8 or not)."""
    table = pq.read_table(path)
    if any(isinstance(t, bytes) for t in texts):
        raw = pa.array([t.encode() if isinstance(t, str) else t for t in texts], pa.binary())
        column = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())  # unchecked bytes
    else:
        column = pa.array(texts, pa.string()).cast(kind)
    pq.write_table(table.set_column(table.schema.get_field_index("text"), "text", column), path)


def test_undecodable_and_invisible_texts_are_row_errors(job: Path):
    path = shard(job, 1)
    texts = pq.read_table(path)["text"].to_pylist()
    texts[2] = b"\xff\xfe not UTF-8"
    texts[3] = b"\xed\xa0\x80 an encoded surrogate"
    texts[4] = "\u200b\ufeff\x00 \u2060\t"  # zero-width space, BOM, NUL, whitespace, word joiner
    with_texts(path, texts)
    result = cli("run", str(job), "--progress", "off")  # on_error = "fail": the shard fails alone
    no_traceback(result)
    assert result.exit_code == 3 and "docs-001.parquet: row 2, column 'text': not valid UTF-8" in (
        result.stderr
    )
    assert read_output(job.parent / "out").num_rows == 20  # the other shards committed
    report = run_job(load_job(job, ["output.on_error=skip"]), restart=True)
    out = read_output(job.parent / "out")
    errors = {i: e for i, e in enumerate(out["error"].to_pylist()) if e}
    assert errors == {
        12: "column 'text': not valid UTF-8 (byte 0)",
        13: "column 'text': not valid UTF-8 (byte 0)",
        14: "column 'text': text is empty",
    }
    assert report["bad_rows"] == 3 and out["embedding"][15].as_py() is not None


@pytest.mark.parametrize("layout", ["large_string", "string_view", "dictionary", "chunked"])
def test_every_arrow_string_layout_is_text(job: Path, tmp_path: Path, layout: str):
    reference = read_output(Path(run_job(load_job(job))["output"]))
    for n in range(3):
        table = pq.read_table(shard(job, n))
        column = table["text"].combine_chunks()
        column = {
            "large_string": lambda c: c.cast(pa.large_string()),
            "string_view": lambda c: c.cast(pa.string_view()),
            "dictionary": lambda c: c.dictionary_encode(),
            "chunked": lambda c: pa.chunked_array([c.slice(0, 3), c.slice(3)]),
        }[layout](column)
        table = table.set_column(table.schema.get_field_index("text"), "text", column)
        assert table.schema.field("text").type != pa.string() or layout == "chunked"
        pq.write_table(table, shard(job, n), row_group_size=4)
        assert pq.read_schema(shard(job, n)).field("text").type == table.schema.field("text").type
    report = run_job(load_job(job, ['output.path="out2"']))
    again = read_output(Path(report["output"]))
    assert again["doc_id"].to_pylist() == reference["doc_id"].to_pylist()
    a, b = (np.array(t["embedding"].to_pylist()) for t in (reference, again))
    assert np.allclose(a, b, atol=1e-5)


def test_a_shard_with_two_columns_of_one_name_fails_alone(job: Path):
    path = shard(job, 0)
    table = pq.read_table(path)
    twice = pa.Table.from_arrays([*table.columns, table["text"]], [*table.column_names, "text"])
    pq.write_table(twice, path)
    result = cli("validate", str(job))
    no_traceback(result)
    assert result.exit_code == 3 and "docs-000.parquet: column 'text' appears 2 times" in (
        result.stderr
    )  # the data's problem: `validate` exits as `run` does
    with pytest.raises(InputDataError, match=r"docs-000\.parquet: column 'text' appears 2 times"):
        run_job(load_job(job))
    assert read_output(job.parent / "out").num_rows == 20


def nan_model(folder: Path) -> Path:
    """A TorchScript model whose output is NaN or inf for rows with a non-positive x0."""

    class LogOfFirst(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.stack([torch.log(x[:, 0]), x.sum(dim=1)], dim=1)

    path = folder / "log.pt"
    torch.jit.save(torch.jit.script(LogOfFirst()), str(path))
    return path


def test_non_finite_outputs_and_float32_overflow_are_row_errors(tmp_path: Path):
    x = np.abs(np.random.default_rng(0).normal(size=(12, 2))) + 0.5
    x[3, 0] = 0.0  # log(0) = -inf
    x[5, 0] = -1.0  # log(-1) = nan
    x[7, 1] = 1e39  # finite in float64, inf in float32
    (tmp_path / "in").mkdir()
    ids = [f"r{i}" for i in range(12)]
    pq.write_table(pa.table({"id": ids, "x0": x[:, 0], "x1": x[:, 1]}), tmp_path / "in/t.parquet")
    job = write_job(
        tmp_path / "job.toml",
        input={"path": "in", "id": "id", "features": ["x0", "x1"]},
        model={"task": "tensor", "path": str(nan_model(tmp_path)), "threads": 1},
        output={"path": "out", "on_error": "skip", "max_bad_share": 0.5},
        tensor={"output": "class"},
    )
    report = run_job(load_job(job))
    out = read_output(tmp_path / "out")
    errors = {i: e for i, e in enumerate(out["error"].to_pylist()) if e}
    assert errors == {
        3: "non-finite output (NaN or inf) from the model",
        5: "non-finite output (NaN or inf) from the model",
        7: "column 'x1': value too large for float32",
    }
    assert report["bad_rows"] == 3 and out["scores"][3].as_py() is None
    scores = np.array([s for s in out["scores"].to_pylist() if s is not None])
    assert np.isfinite(scores).all()  # no NaN is ever written as a score
    x[7, 1] = 1.0  # under on_error = "fail", the model's NaN fails the shard, naming it
    pq.write_table(pa.table({"id": ids, "x0": x[:, 0], "x1": x[:, 1]}), tmp_path / "in/t.parquet")
    with pytest.raises(InputDataError, match=r"t\.parquet: row 3, non-finite output"):
        run_job(load_job(job, ["output.on_error=fail", 'output.path="strict"']))


def test_a_where_that_fails_on_the_rows_names_expression_and_shard_not_rows(job: Path):
    result = cli("run", str(job), "--set", 'input.where="CAST(text AS INT) > 3"')
    no_traceback(result)
    assert result.exit_code == 2
    assert "[input].where = 'CAST(text AS INT) > 3' cannot be evaluated on" in result.stderr
    assert "docs-000.parquet" in result.stderr
    first_text = pq.read_table(shard(job, 0))["text"][0].as_py()
    assert first_text[:20] not in result.stderr  # no input row's text in the message


# -- the output location ----------------------------------------------------------------------


def test_an_output_path_that_is_a_file_is_refused_before_work(job: Path):
    (job.parent / "out").write_text("not a folder")
    for command in ("validate", "run"):
        result = cli(command, str(job))
        no_traceback(result)
        assert result.exit_code == 2 and "is a file, not a folder" in result.stderr
    assert (job.parent / "out").read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a read-only file system (needs root)")
def test_a_read_only_file_system_is_refused_before_work(job: Path):
    target = job.parent / "ro"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(target)], check=True)
    try:
        for command in ("validate", "run"):
            result = cli(command, str(job), "--set", 'output.path="ro/out"')
            no_traceback(result)
            assert result.exit_code == 6 and "is on a read-only file system" in result.stderr
    finally:
        subprocess.run(["umount", str(target)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="runs batchscore as another user (needs root)")
def test_an_unwritable_output_folder_is_refused_before_work(small_corpus):
    """As an unprivileged user (root may write anywhere), in a folder only root may write.

    The job lives in a folder of its own under the system's temporary folder, not under
    pytest's: another pytest session starting meanwhile (the CI's soak, say) takes others'
    access to pytest's folders away again, and the other user could no longer read the job."""
    home = Path(tempfile.mkdtemp(prefix="batchscore-other-user-"))
    try:
        home.chmod(0o755)  # others may read and enter, not write
        job = make_job(home, small_corpus.slice(0, 30), chunk_rows=5)
        (home / "locked").mkdir(mode=0o755)
        done = as_other_user(job)
    finally:
        shutil.rmtree(home)
    assert done.returncode == 6, done.stderr
    assert "cannot write in" in done.stderr and "permission denied" in done.stderr
    assert "Traceback" not in done.stderr


def as_other_user(job: Path) -> subprocess.CompletedProcess:
    """`batchscore validate` of ``job`` as uid 65534, its output in the folder "locked"."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": "/tmp"}
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    validate = [sys.executable, "-m", "batchscore", "validate", str(job)]
    command = [*nobody, *validate, "--set", 'output.path="locked/out"']
    # the checkout may sit in a folder only its owner may enter (a `mktemp -d`): let the other
    # user pass through the checkout's parents for this call, then put their modes back
    parents = [p for p in ROOT.parents if not p.stat().st_mode & 0o001]
    modes = {p: p.stat().st_mode for p in parents}
    try:
        for folder, mode in modes.items():
            folder.chmod(mode | 0o001)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    finally:
        for folder, mode in modes.items():
            folder.chmod(mode)
    return done


# -- damaged bookkeeping ----------------------------------------------------------------------


def test_damaged_bookkeeping_is_named_and_repaired_from_the_data_files(job: Path):
    out = job.parent / "out"
    run_job(load_job(job, ["model.precision=auto", "quality.sample_rows=10"]))
    clean = read_output(out)
    record = record_of(out, shard=1, chunk=0)
    record.write_text(record.read_text()[:40])  # a truncated commit record
    (out / "_batchscore/job.json").write_text("{")  # a truncated job record
    (out / "_batchscore/settled.json").write_text('{"precision": ')
    next((out / "_batchscore/runs").glob("*.json")).write_text("")
    status = job_status(load_job(job))
    assert not status["complete"] and "damaged" in status["damaged_bookkeeping"][0]
    result = cli("run", str(job), "--set", "model.precision=auto", "--progress", "off")
    no_traceback(result)
    assert result.exit_code == 0, result.stderr
    assert "was damaged and is removed; its chunk is scored again" in result.stderr
    assert "rewritten from the data files' footers" in result.stderr
    assert "recovered from the data files' footers" in result.stderr
    assert "chunks: 1 committed now" in result.output  # the one chunk, not the job
    assert read_output(out)["doc_id"].to_pylist() == clean["doc_id"].to_pylist()
    assert json.loads((out / "_batchscore/job.json").read_text())["name"] == "job"


def test_a_damaged_job_record_the_data_files_do_not_prove_stops_the_run(job: Path):
    out = job.parent / "out"
    run_job(load_job(job))
    (out / "_batchscore/job.json").write_text("not json")
    result = cli("run", str(job), "--set", "model.max_length=32")  # another fingerprint
    no_traceback(result)
    assert result.exit_code == 10
    assert "job.json: damaged (not JSON" in result.stderr and "--restart" in result.stderr


# -- signals and metrics ----------------------------------------------------------------------


def start(job: Path, *args: str, faults: str = "") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BATCHSCORE_FAULTS": faults}
    command = [sys.executable, "-m", "batchscore", "run", str(job), "--progress", "off", *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_until_stopped(proc: subprocess.Popen) -> None:
    """Until the process is stopped (its own SIGSTOP, from a ``stop`` fault)."""
    deadline = time.time() + 240
    stat = Path(f"/proc/{proc.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() < deadline, "the run never reached its stop"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_stop_cleanly_and_the_next_run_resumes(
    tmp_path: Path, small_corpus, signum: int, code: int
):
    job = make_job(tmp_path, small_corpus.slice(0, 120), chunk_rows=5)
    metrics = tmp_path / "run.prom"
    # the run stops itself after its second commit, so the signal meets it mid-run on a fast
    # machine too (signalled while it ran, it could finish first)
    proc = start(job, "--metrics-file", str(metrics), faults="after-record@2:stop")
    wait_until_stopped(proc)
    proc.send_signal(signum)
    proc.send_signal(signal.SIGCONT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr.decode()
    assert f"stopped by {signal.Signals(signum).name}" in stderr.decode()
    assert b"Traceback" not in stderr
    runs = [json.loads(p.read_text()) for p in (tmp_path / "out/_batchscore/runs").glob("*")]
    assert [r["outcome"] for r in runs] == ["interrupted"]
    assert "batchscore_last_run_success{" in metrics.read_text()
    report = run_job(load_job(job))  # the lock was released; resumes
    assert report["chunks_already_done"] >= 2 and read_output(tmp_path / "out").num_rows == 120


def test_an_unwritable_metrics_file_is_a_warning_and_its_own_exit_status(job: Path):
    (job.parent / "metrics").mkdir()  # a folder where the file should go
    result = cli("run", str(job), "--progress", "off", "--metrics-file",
                 str(job.parent / "metrics" / "no" / "such" / "run.prom"))  # fmt: skip
    no_traceback(result)
    assert result.exit_code == 11, result.output
    assert "rows scored" in result.stdout  # the run's own summary still shows
    assert "run.prom: cannot write" in result.stderr
    assert read_output(job.parent / "out").num_rows == 30 and (job.parent / "out/_SUCCESS").exists()
    failed = cli("run", str(job), "--set", "model.max_length=32", "--metrics-file",
                 str(job.parent / "metrics" / "no" / "run.prom"))  # fmt: skip
    assert failed.exit_code == 5  # a failed run reports its own error; metrics only warn


def test_bad_input_never_shows_a_traceback_in_status(job: Path):
    (job.parent / "in/broken.parquet").write_bytes(b"PAR1 not really")
    for command in ("validate", "status"):
        result = cli(command, str(job))
        no_traceback(result)
    run = cli("run", str(job), "--progress", "off")
    no_traceback(run)
    assert run.exit_code == 3 and "broken.parquet: not a readable Parquet file" in run.stderr
    with pytest.raises(JobError):
        load_job(job, ['output.path="in"'])
