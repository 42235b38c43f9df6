"""The run's wall time split into phases, in the summary and the report, from a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batchscore.observe.phases import PHASES, Clock, process_start, split
from tests.commands import ROOT
from tests.reliability import make_job


def test_a_process_knows_when_it_started():
    code = "import time; from batchscore.observe.phases import process_start as p; "
    code += "print(time.time() - p())"
    age = float(
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        ).stdout
    )
    assert 0 < age < 60  # the interpreter's start and the imports, nothing older
    assert process_start() is not None


def test_finishing_is_what_the_timed_phases_leave():
    split_up = split({"start-up": 1.0, "preparing": 0.5, "measuring": 2.0}, wall_s=10.0)
    assert list(split_up) == ["start-up", "preparing", "measuring", "finishing"]
    assert split_up["finishing"] == 7.5  # start-up is before the run's wall time


def test_the_clock_times_blocks_and_moves_adopted_work():
    """A block adds to its phase when it ends; one that fails leaves it out; seconds one phase
    spent on another's work move, the first never below zero."""
    phases: dict[str, float] = {}
    clock = Clock(phases)
    with clock.phase("measuring") as block:
        time.sleep(0.01)
    assert phases["measuring"] == block.seconds >= 0.01
    with pytest.raises(RuntimeError), clock.phase("loading"):
        raise RuntimeError("the model did not load")
    assert "loading" not in phases
    clock.move(block.seconds / 2, "measuring", "loading")
    assert phases["loading"] == block.seconds / 2
    clock.move(10.0, "measuring", "scoring")
    assert phases["measuring"] == 0 and phases["scoring"] == 10.0


@pytest.mark.parametrize("precision", ["fp32", "auto"])
def test_a_run_says_where_its_time_went(tmp_path: Path, small_corpus, precision):
    job = make_job(tmp_path, small_corpus.slice(0, 45))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BATCHSCORE_CACHE_DIR": str(tmp_path / "c")}
    command = [
        sys.executable,
        "-m",
        "batchscore",
        "run",
        str(job),
        "--progress",
        "off",
        "--set",
        f"model.precision={precision}",
        "--set",
        "quality.sample_rows=16",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    report = json.loads(next((tmp_path / "out/_batchscore/runs").glob("*.json")).read_text())
    phases = report["phases"]
    assert set(phases) == set(PHASES)
    within = sum(v for k, v in phases.items() if k != "start-up")
    assert within == pytest.approx(report["wall_s"], abs=0.01)
    assert all(v >= 0 for v in phases.values()) and phases["start-up"] > 0
    if precision == "fp32":  # nothing left to measure
        assert phases["measuring"] == 0
    else:  # the gate's fp32 pass was adopted: the run's own loading and scoring
        assert report["from_gate"] == 16 and phases["loading"] > 0
        # measuring is what the run did not keep: the adopted load and pass are not in it
        assert report["tuning_s"] == pytest.approx(phases["measuring"], abs=0.01)
    line = next(x for x in done.stdout.splitlines() if x.startswith("  time: "))
    assert line.startswith("  time: start-up ") and "measuring" in line and "finishing" in line
