"""One verdict everywhere: `run`, `status`, `status --check`, `plan` and the metrics file agree
on the state of an output folder.

Each state is made for real (a run, a run cut off by a failed write, a data file damaged,
rows over `[output].max_bad_share`, settings a run refuses, a job file that does not load),
by shards and by rows, with the tiny tensor job; then EVERY command is asked, `run` last (it
changes the folder), and their exits are held to one table and to each other.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import Result

from batchscore import faults
from batchscore.errors import BadRowsError
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from tests.commands import invoke
from tests.conftest import write_job
from tests.output.tiny import ARGS, tiny_job

# state -> the exit of each command, and whether the metrics file says the run succeeded
AGREED = {
    "complete": {"status": 0, "check": 0, "plan": 0, "run": 0, "success": 1},
    "partial": {"status": 0, "check": 13, "plan": 0, "run": 0, "success": 1},
    "refused settings": {"status": 5, "check": 5, "plan": 5, "run": 5, "success": 0},
    "fingerprint changed": {"status": 5, "check": 5, "plan": 5, "run": 5, "success": 0},
    "failed bad-row gate": {"status": 0, "check": 13, "plan": 3, "run": 3, "success": 0},
    "damaged file": {"status": 0, "check": 13, "plan": 0, "run": 0, "success": 1},
    "job file does not load": {"status": 2, "check": 2, "plan": 2, "run": 2, "success": 0},
}
MODES = ("shards", "rows")


def job_file(root: Path, mode: str, **output: object) -> Path:
    """The tiny tensor job (`tests.output.tiny`) by ``mode``, with ``output`` keys added."""
    tiny_job(root)  # its model file
    return write_job(
        root / "job.toml",
        input={"path": "in", "id": "id", "features": ["x0", "x1", "x2", "x3"], "increments": mode},
        model={"task": "tensor", "path": "mlp.safetensors", "threads": 1},
        batching={"max_rows": 8, "window_rows": 4},
        output={"path": "out", "chunk_rows": 4, **output},
        tensor={"output": "class", "factory": "mlp", "factory_args": ARGS},
    )


def shard(path: Path, rows: int, *, seed: int = 0, bad: int = 0) -> None:
    """A shard of ``rows`` rows, its first ``bad`` with a NaN feature (each a row error)."""
    x = np.random.default_rng(seed).normal(size=(rows, 4)).astype(np.float32)
    x[:bad, 0] = np.nan
    ids = [f"{path.stem}-{i}" for i in range(rows)]
    pq.write_table(pa.table({"id": ids, **{f"x{j}": x[:, j] for j in range(4)}}), path)


def make(root: Path, mode: str, state: str) -> tuple[Path, list[str]]:
    """An output folder in ``state``; returns the job file and the options each command
    gets (the settings a run refuses, for those states)."""
    bad = state == "failed bad-row gate"
    job = job_file(root, mode, **({"on_error": "skip", "max_bad_share": 0.1} if bad else {}))
    shard(root / "in/a.parquet", 9)
    shard(root / "in/b.parquet", 4, seed=1, bad=2 if bad else 0)
    if state == "partial":  # the second commit's record cannot be written: the run stops
        with faults.armed("before-record@2:enospc"), pytest.raises(OSError):
            run_job(load_job(job))
        return job, []
    try:
        run_job(load_job(job))
    except BadRowsError:
        # 2 of 13 rows failed, over 10%, in the last chunk: every row is committed, and the
        # run fails (exit 3) without `_SUCCESS`
        assert bad and not (root / "out/_SUCCESS").exists()
    args: list[str] = []
    if state == "refused settings":
        args = ["--set", f'input.increments="{"rows" if mode == "shards" else "shards"}"']
    elif state == "fingerprint changed":
        args = ["--set", 'tensor.output="value"']
    elif state == "damaged file":
        data = sorted((root / "out").glob("part-*.parquet"))[0]
        data.write_bytes(data.read_bytes()[:-20] + b"not a Parquet footer")
    elif state == "job file does not load":
        job.write_text(job.read_text() + "no_such_key = 1\n")  # in [tensor], the last table
    return job, args


def no_traceback(result: Result) -> int:
    """The command's exit status, once it is sure no Python traceback reached the user."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output, result.output
    return result.exit_code


def last_run_success(metrics: Path) -> int:
    found = re.search(
        r'^batchscore_last_run_success\{job="[^"]*"\} (\S+)$', metrics.read_text(), re.M
    )
    assert found, metrics.read_text()
    return int(float(found.group(1)))


@pytest.mark.parametrize("state", list(AGREED))
@pytest.mark.parametrize("mode", MODES)
def test_every_command_gives_the_folder_one_verdict(tmp_path: Path, mode: str, state: str):
    job, args = make(tmp_path, mode, state)
    metrics = tmp_path / "job.prom"
    metrics.write_text('batchscore_last_run_success{job="job"} 1.0\n')  # an earlier run's
    said = {
        "status": no_traceback(invoke("status", str(job), *args)),
        "check": no_traceback(invoke("status", str(job), "--check", *args)),
        "plan": no_traceback(invoke("plan", str(job), "--no-timing", *args)),
    }
    ran = invoke("run", str(job), "--progress", "off", "--metrics-file", str(metrics), *args)
    said["run"] = no_traceback(ran)
    said["success"] = last_run_success(metrics)
    assert said == AGREED[state], (ran.output, said)
    # and whatever the table says, the commands agree with each other:
    assert (said["run"] == 0) == (said["success"] == 1)
    if said["run"] in (0, 3):  # the run judged the folder (a refused one is another job's)
        assert (tmp_path / "out/_SUCCESS").exists() == (said["run"] == 0)
    if said["check"] == 0:  # complete before the run: the run found nothing to do
        assert "nothing to do" in ran.stdout
    for verb in ("status", "check", "plan"):  # a command that refuses, refuses as run does
        assert said[verb] in (0, 13, said["run"]), (verb, said)
