"""`--log-format json`: one JSON object per line, errors included, for log collectors."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from click.testing import CliRunner

from batchscore.cli import main
from batchscore.observe.logs import JsonFormatter


def test_formatter_keeps_extra_fields():
    record = logging.makeLogRecord({"msg": "%d rows", "args": (5,), "levelname": "INFO",
                                    "name": "batchscore", "shard": "a.parquet"})  # fmt: skip
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "5 rows" and entry["level"] == "info"
    assert entry["shard"] == "a.parquet" and entry["time"].endswith("Z")


def test_errors_are_json_lines_with_the_exit_code(tmp_path: Path):
    result = CliRunner().invoke(
        main, ["--log-format", "json", "validate", str(tmp_path / "x.toml")]
    )
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    entry = json.loads(line)
    assert entry["level"] == "error" and entry["exit_code"] == 2
    assert entry["error"] == "JobError" and "job file not found" in entry["message"]
