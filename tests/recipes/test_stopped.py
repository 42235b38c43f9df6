"""A run that stops before it begins still writes its metrics: a job file that does not load
(`recipes.stopped.write_unloaded`) turns the last run into a failure and keeps the series."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.commands import invoke
from tests.output.tiny import tiny_job, write_shard


def sample(metrics: Path, name: str) -> tuple[str, float]:
    """The job label and value of the series ``name`` in a metrics file."""
    found = re.search(rf'^{name}\{{job="([^"]*)"\}} (\S+)$', metrics.read_text(), re.M)
    assert found, metrics.read_text()
    return found.group(1), float(found.group(2))


@pytest.mark.parametrize(
    "breakage", ["no_such_key = 1\n", "[not toml\n"], ids=["unknown key", "not TOML"]
)
def test_a_job_file_that_does_not_load_writes_a_failed_run(tmp_path: Path, breakage: str):
    """The label and the last success time are the earlier file's (a named job's too, whose
    name the broken file no longer tells), and the last run is a failure, exit 2 as always."""
    job = tiny_job(tmp_path)
    job.write_text('name = "embed-docs"\n' + job.read_text())
    write_shard(tmp_path / "in/a.parquet", 9)
    metrics = tmp_path / "embed-docs.prom"
    ran = invoke("run", str(job), "--progress", "off", "--metrics-file", str(metrics))
    assert ran.exit_code == 0, ran.output
    label, succeeded = sample(metrics, "batchscore_last_success_timestamp_seconds")
    assert label == "embed-docs" and succeeded > 0
    job.write_text(job.read_text() + breakage)
    broken = invoke("run", str(job), "--progress", "off", "--metrics-file", str(metrics))
    assert broken.exit_code == 2 and "Traceback" not in broken.output
    assert sample(metrics, "batchscore_last_run_success") == ("embed-docs", 0.0)
    assert sample(metrics, "batchscore_last_success_timestamp_seconds") == (label, succeeded)
    _, ended = sample(metrics, "batchscore_last_run_timestamp_seconds")
    assert ended > succeeded


def test_without_an_earlier_file_the_label_is_the_job_files_stem(tmp_path: Path):
    """A job's first run, its file broken: the default name (the stem), never a success."""
    job = tiny_job(tmp_path)
    job.write_text(job.read_text() + "[not toml\n")
    metrics = tmp_path / "job.prom"
    broken = invoke("run", str(job), "--progress", "off", "--metrics-file", str(metrics))
    assert broken.exit_code == 2
    assert sample(metrics, "batchscore_last_run_success") == ("job", 0.0)
    assert sample(metrics, "batchscore_last_success_timestamp_seconds") == ("job", 0.0)
