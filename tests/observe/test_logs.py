"""`--log-format json`: one JSON object per line, errors included, for log collectors."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from batchscore.cli import main
from batchscore.observe.logs import JsonFormatter
from batchscore.version import __version__
from tests.commands import environment


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


def json_objects(text: str) -> list[dict]:
    """Every non-empty line of ``text`` as a JSON object; a line that is not one fails the test."""
    entries = []
    for line in text.splitlines():
        if line.strip():
            entry = json.loads(line)
            assert isinstance(entry, dict), line
            entries.append(entry)
    return entries


USAGE_ERRORS = [
    ["--log-format", "json", "rnu", "job.toml"],  # an unknown command
    ["rnu", "job.toml", "--log-format", "json"],  # ... with JSON asked after it
    ["--log-format", "xml", "run", "job.toml", "--log-format", "json"],  # a bad value first
    ["--log-format", "json", "run", "job.toml", "--log-format", "xml"],  # a bad value after
    ["--log-format", "json", "run", "job.toml", "--log-format"],  # a value missing
    ["--log-format", "json"],  # no command
    ["--log-format=json", "-v", "-q"],
    ["--log-format", "JSON", "run"],  # the job missing (the format's case is not a mistake)
    ["--log-format", "json", "validate", "--version"],  # a command has no --version
    ["-x", "--log-format", "json", "status"],
    # a NUL byte in any argument (click's own path check raised ValueError: a traceback)
    ["--log-format", "json", "check", "\x00"],
    ["--log-format", "json", "run", "jobs/a\x00.toml"],
    ["--log-format", "json", "run-batch", "-i", "\x00", "-o", "out.jsonl", "--model", "m"],
]


@pytest.mark.parametrize("args", USAGE_ERRORS, ids=" ".join)
def test_usage_errors_at_any_level_are_one_json_line(args: list[str]):
    """Wherever the mistake is (the group's options, the command's name, the command's own
    options) and wherever --log-format json is on the line, the error is one JSON log line on
    stderr with its exit code, 2, and nothing else is written."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    (entry,) = json_objects(result.stderr)
    assert entry["level"] == "error" and entry["exit_code"] == 2, entry
    assert "--help" in entry["message"] and "Usage:" not in entry["message"]


@pytest.mark.parametrize(
    "args, event",
    [
        (["--log-format", "json", "--help"], "help"),
        (["--help", "--log-format", "json"], "help"),
        (["-h", "--log-format=json"], "help"),
        (["--log-format", "json", "run", "-h"], "help"),
        (["run", "--help", "--log-format", "json"], "help"),
        (["status", "job.toml", "-h", "--log-format", "json"], "help"),
        (["--log-format", "json", "--version"], "version"),
        (["--version", "--log-format", "json"], "version"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else a,
)
def test_help_and_version_are_one_json_object_on_stdout(args: list[str], event: str):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    (entry,) = json_objects(result.stdout)
    assert entry["event"] == event and entry["level"] == "info"
    if event == "help":
        assert entry["message"].startswith("Usage: ") and "Example:" in entry["help"]
    else:
        assert entry["version"] == __version__ and __version__ in entry["message"]
    plain = CliRunner().invoke(main, [a for a in args if "json" not in a and a != "--log-format"])
    assert plain.exit_code == 0 and not plain.stdout.startswith("{")  # text, without JSON


COMMANDS = sorted(main.commands)
OPTIONS = ["-v", "-q", "-h", "--help", "--version", "--set", "--restart", "--json", "--check",
           "--progress", "--log-format", "--log-format=xml", "-o", "--max-wall-s", "--", "-x",
           "--no-such-option"]  # fmt: skip
tokens = st.one_of(
    st.sampled_from(COMMANDS),
    st.sampled_from(["rnu", "stauts", "missing.toml", "a=b", "model.precision=fp61", "1", ""]),
    st.sampled_from(OPTIONS),
    st.text(max_size=6).filter(lambda t: t.lower() not in ("text", "--log-format=text")),
)


@settings(max_examples=200, deadline=None)
@given(
    argv=st.lists(tokens, max_size=6),
    where=st.integers(min_value=0, max_value=6),
    joined=st.booleans(),
)
def test_any_command_line_asking_for_json_writes_only_json(argv, where, joined):
    """Whatever else is on the command line (commands, options, garbage, in any order), with
    --log-format json on it (before any ``--``) every non-empty line of stdout and stderr is
    one JSON object, and the exit status is 0 (help, version) or 2 (a usage error, or the
    job file that is not there)."""
    where = min(where, len(argv))
    assume("--" not in argv[:where])
    asked = ["--log-format=json"] if joined else ["--log-format", "json"]
    args = [*argv[:where], *asked, *argv[where:]]
    result = CliRunner().invoke(main, args)
    assert result.exit_code in (0, 2), (args, result.output, result.exception)
    said = json_objects(result.stdout)
    entries = json_objects(result.stderr)
    event(
        f"exit {result.exit_code}: {', '.join(e.get('event', e['level']) for e in said + entries)}"
    )
    if result.exit_code == 2:
        assert entries and entries[-1]["exit_code"] == 2, args


@pytest.mark.parametrize(
    "args, code",
    [
        (["--log-format", "json", "rnu", "job.toml"], 2),
        (["--log-format", "xml", "run", "job.toml", "--log-format", "json"], 2),
        (["--help", "--log-format", "json"], 0),
        (["--log-format", "json", "--version"], 0),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else str(a),
)
def test_a_real_process_writes_only_json(tmp_path: Path, args: list[str], code: int):
    """As cron starts it: ``python -m batchscore ARGS`` in a process of its own: one JSON
    object, whether it is the error or the help or the version."""
    out = subprocess.run(
        [sys.executable, "-m", "batchscore", *args],
        env=environment(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == code, out.stderr
    entries = json_objects(out.stdout) + json_objects(out.stderr)
    assert len(entries) == 1 and "Traceback" not in out.stderr
