"""Telling the user what is happening: a line (a spinner on a terminal) per slow step, the run's
choices and each shard's commit at ``-v``, and one JSON event per stage with job and run id."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchscore.cli import main
from batchscore.observe.progress import MAX_POINTS, Timeline
from batchscore.observe.spinner import CLEAR, SpinnerHandler
from batchscore.precision.int8_linear import int8_available
from tests.reliability import make_job


@pytest.fixture
def job(tmp_path: Path, small_corpus) -> Path:
    return make_job(tmp_path, small_corpus.slice(0, 45))  # 3 shards of 15 rows, one chunk each


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.stderr
    return result


def test_json_logs_one_event_per_stage_with_job_and_run_id(job: Path):
    result = run("--log-format", "json", "run", str(job), "--progress", "off")
    entries = [json.loads(line) for line in result.stderr.splitlines()]
    events = [e["event"] for e in entries if "event" in e]
    assert events == ["start", "model loaded", "precision chosen", *["shard committed"] * 3,
                      "run finished"]  # fmt: skip
    (report_file,) = (job.parent / "out/_batchscore/runs").glob("*.json")
    for entry in entries:
        assert entry["job"] == "job" and entry["run_id"] == report_file.stem
    finished = next(e for e in entries if e.get("event") == "run finished")
    assert finished["report"]["rows"] == 45 and finished["report"]["run_id"] == report_file.stem
    loaded = next(e for e in entries if e.get("event") == "model loaded")
    assert loaded["seconds"] > 0
    assert {e["shard"] for e in entries if e.get("event") == "shard committed"} == {
        str(p) for p in (job.parent / "in").glob("*.parquet")
    }


def test_text_says_what_loads_and_verbose_says_why(job: Path):
    quiet = run("run", str(job), "--progress", "off").stderr
    assert "loading the model all-MiniLM-L6-v2 (cpu, fp32) ..." in quiet
    assert "model loaded in" in quiet
    assert "shard committed" not in quiet and "device cpu" not in quiet
    loud = run("-v", "run", str(job), "--progress", "off", "--restart").stderr
    assert loud.count("shard committed: ") == 3
    assert "precision fp32: the job's: the reference, nothing to gate" in loud
    assert "precision fp32, why: the job's [model].precision" in loud
    assert "max_tokens 1024: the job's [batching].max_tokens" in loud
    assert "device cpu: auto: no CUDA GPU here" in loud or "device cpu: the job's" in loud
    assert "torch threads 1: [model].threads" in loud


@pytest.mark.skipif(not int8_available(), reason="needs oneDNN int8 CPU kernels")
def test_the_gate_and_int8_calibration_say_they_run(job: Path):
    sets = ["--set", "model.precision=int8", "--set", "quality.sample_rows=16"]
    err = run("run", str(job), "--progress", "off", *sets).stderr
    assert "quality gate: scoring 16 rows in fp32 and int8 ..." in err
    assert "int8 calibration: choosing the Linear layers on 8 rows ..." in err
    assert "int8 calibrated in" in err and "quality gate done in" in err
    assert re.search(r"precision int8: the job's: \d+\.\d\dx fp32, cosine min \S+ on 16 rows", err)
    assert "int8 passes the quality gate" not in err  # the reasoning: -v only
    assert "model ready (the quality gate loaded it)" in err


def record(msg: str, **extra) -> logging.LogRecord:
    return logging.makeLogRecord({"msg": msg, "levelno": logging.INFO, "levelname": "INFO",
                                  **extra})  # fmt: skip


def test_the_spinner_runs_while_a_stage_is_open_and_clears_after():
    stream = io.StringIO()
    handler = SpinnerHandler(stream, every_s=0.01)
    handler.setFormatter(logging.Formatter("batchscore: %(message)s"))
    handler.handle(record("loading ...", stage="loading the model", phase="start"))
    time.sleep(0.1)
    assert stream.getvalue().count("loading the model (0 s)") > 2  # redrawn as it spins
    assert "loading ..." not in stream.getvalue()  # the start is the spinner, not a line
    handler.handle(record("a line in between"))
    assert stream.getvalue().endswith("loading the model (0 s)")  # drawn again below it
    handler.handle(record("model loaded in 0.1 s", stage="loading the model", phase="end"))
    handler.close()
    text = stream.getvalue()
    assert text.endswith(f"{CLEAR}batchscore: model loaded in 0.1 s\n")
    assert f"{CLEAR}batchscore: a line in between\n" in text


def test_the_timeline_stays_small_and_keeps_its_ends():
    busy = iter(range(10_000))
    timeline = Timeline(lambda: float(next(busy)), every_s=0)
    for i in range(1, 2000):
        timeline.sample(i, 10 * i)
    timeline.sample(2000, 20000, force=True)
    data = timeline.to_json()
    assert MAX_POINTS // 2 <= len(data["t"]) <= MAX_POINTS
    assert data["rows"][0] == 0 and data["rows"][-1] == 2000 and data["tokens"][-1] == 20000
    assert data["t"] == sorted(data["t"])
