"""A call from Python says what it is doing once a step has run a second, and nothing else."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import time

from batchscore.observe.logs import SlowSteps, slow_steps
from batchscore.observe.progress import stage
from tests.commands import ROOT


def test_a_slow_step_is_said_and_a_quick_one_is_not():
    out, log = io.StringIO(), logging.getLogger("batchscore")
    handler, level = SlowSteps(0.2, out), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with stage("quick step", "quick step done"):
            pass
        with stage("slow step", "slow step done"):
            time.sleep(0.6)
        log.warning("a warning is said at once")
        time.sleep(0.3)  # a timer that fired late would write now
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        handler.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "batchscore: slow step ..."
    assert lines[1].startswith("batchscore: slow step done in 0.")
    assert lines[2] == "batchscore: a warning is said at once" and len(lines) == 3


def test_a_program_that_logs_for_itself_decides(caplog):
    with caplog.at_level(logging.INFO, logger="batchscore"), slow_steps(0.0) as saying:
        assert not saying  # the program's handlers (here pytest's) say what they say
    assert not any(isinstance(h, SlowSteps) for h in logging.getLogger("batchscore").handlers)


def test_a_notebooks_first_call_says_what_it_is_doing(tmp_path):
    """score() in a fresh process with no logging set up and an empty cache folder: the model's
    load and the gate are said on stderr (here every step, the threshold set to 0)."""
    code = (
        "import pyarrow as pa, batchscore, batchscore.api as api\n"
        "api.SAY_AFTER_S = 0.0\n"
        "texts = [f'sentence number {i} about parquet' for i in range(40)]\n"
        "out = batchscore.score(pa.table({'text': texts}), task='embed', precision='auto')\n"
        "print(out.num_rows)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BATCHSCORE_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "40"
    said = done.stderr
    assert "batchscore: quality gate: scoring 40 rows in fp32" in said
    assert "batchscore: quality gate done in " in said
    assert "Traceback" not in said


def test_a_failing_stderr_never_stops_the_call():
    """A warning, or a slow step said, onto a stderr that cannot take it (a pipe whose reader
    left; a process started without stderr) is dropped, never raised into the caller's call."""
    read, write = os.pipe()
    os.close(read)
    record = logging.makeLogRecord({"msg": "a warning", "levelno": logging.WARNING})
    with io.TextIOWrapper(open(write, "wb", buffering=0), write_through=True) as gone:
        SlowSteps(0.0, gone).emit(record)
    SlowSteps(0.0, None).emit(record)  # type: ignore[arg-type]  # sys.stderr is None
