"""The command line through CliRunner: help, exit codes, and each command on a real job."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path

import click
import pytest
import sample_corpus
from click.testing import CliRunner

from batchscore.cli import main
from batchscore.output.lock import hold_lock
from tests import commands

ROOT = Path(__file__).resolve().parent.parent


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


COMMANDS = [[], *([name] for name in sorted(main.commands))]


def example_lines(command: click.Command) -> list[str]:
    """The lines of a command's ``Example:`` block, as its docstring writes them."""
    block = (command.help or "").split("Example:", 1)[1]
    return [line.strip() for line in block.splitlines() if line.strip()]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "batchscore")
@pytest.mark.parametrize("width", [60, 100])
def test_every_command_has_help_whose_examples_keep_their_lines(command, width):
    """click re-wraps help paragraphs to the terminal; an example block marked with \\b is
    kept line for line, so each example can be copied and run as printed."""
    result = CliRunner().invoke(main, [*command, "--help"], terminal_width=width)
    assert result.exit_code == 0
    assert "Example:" in result.output
    target = main.commands[command[0]] if command else main
    examples = example_lines(target)
    assert examples and all(line.startswith("batchscore ") for line in examples)
    printed = [line.strip() for line in result.output.splitlines()]
    for line in examples:
        assert line in printed, f"{line!r} was re-wrapped in:\n{result.output}"


def test_validate_ok_and_bad(embed_job: Path, tmp_path: Path):
    ok = invoke("validate", str(embed_job))
    assert ok.exit_code == 0, ok.output
    assert "3 shard(s), 360 rows" in ok.output
    bad = invoke("validate", str(embed_job), "--set", "model.precision=fp61",
                 "--set", "input.text=body")  # fmt: skip
    assert bad.exit_code == 2
    assert (
        '[model].precision: expected one of fp32, fp16, bf16, int8, auto, got "fp61"' in bad.stderr
    )


def test_validate_reports_missing_columns_and_inputs(embed_job: Path, tmp_path: Path):
    result = invoke("validate", str(embed_job), "--set", "input.text=body")
    assert result.exit_code == 3  # as `run` fails each shard that lacks the column
    assert "missing column(s) body" in result.stderr
    assert result.stderr.count("missing column(s) body") == 3  # every shard named
    (tmp_path / "in").rename(tmp_path / "gone")
    result = invoke("validate", str(embed_job))
    assert result.exit_code == 2 and "no such file or folder" in result.stderr


def test_run_then_status(embed_job: Path):
    result = invoke("run", str(embed_job), "--progress", "off")
    assert result.exit_code == 0, result.stderr
    assert "360 rows scored" in result.output and "padding efficiency" in result.output
    table = invoke("status", str(embed_job))
    assert table.exit_code == 0
    assert (
        table.output.count("done") == 3 and "360 of 360 rows committed - complete" in table.output
    )
    data = json.loads(invoke("status", str(embed_job), "--json").output)
    assert data["complete"] and data["rows_done"] == 360
    assert [s["state"] for s in data["shards"]] == ["done"] * 3


def test_status_before_any_run(embed_job: Path):
    data = json.loads(invoke("status", str(embed_job), "--json").output)
    assert [s["state"] for s in data["shards"]] == ["pending"] * 3 and data["last_run"] is None


def test_run_exits_75_while_another_run_holds_the_job(embed_job: Path, tmp_path: Path):
    with hold_lock(tmp_path / "out" / "_batchscore" / "lock", "other"):
        result = invoke("run", str(embed_job), "--progress", "off")
    assert result.exit_code == 75
    assert "another run of this job holds the lock" in result.stderr


def test_bad_job_file_exits_2(tmp_path: Path):
    result = invoke("run", str(tmp_path / "missing.toml"))
    assert result.exit_code == 2 and "job file not found" in result.stderr


@pytest.mark.parametrize("job", sorted((ROOT / "jobs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_job_validates(job: Path, tmp_path: Path, small_corpus, examples: Path):
    """Each job in jobs/ validates against the sample data laid out as the repo lays it out."""
    shutil.copytree(ROOT / "jobs", tmp_path / "jobs")
    shutil.copytree(examples, tmp_path, dirs_exist_ok=True)
    sample_corpus.write_shards(small_corpus, tmp_path / "data" / "docs", shards=4)
    result = invoke("validate", str(tmp_path / "jobs" / job.name))
    assert result.exit_code == 0, result.stderr


def test_readme_documents_every_exit_code():
    from batchscore.errors import EXIT_CODES

    readme = (ROOT / "README.md").read_text()
    for code in EXIT_CODES:
        assert f"\n| {code} | " in readme, f"exit code {code} missing from the README table"


# -- global options, before or after the command ------------------------------------------------


def test_global_options_count_before_and_after_the_command(embed_job: Path):
    """`-v`, `-q` and `--log-format` are options of the group and of every command: a cron line
    may put them after the job, as people write them."""
    after = invoke("validate", str(embed_job), "--log-format", "json", "-v")
    before = invoke("--log-format", "json", "-v", "validate", str(embed_job))
    for result in (after, before):
        assert result.exit_code == 0, result.output
        (line,) = result.stdout.splitlines()
        entry = json.loads(line)
        assert entry["event"] == "validated" and entry["message"] == f"{embed_job}: ok"
        assert entry["facts"][0] == "input: 3 shard(s), 360 rows"
    for command in COMMANDS[1:]:
        shown = CliRunner().invoke(main, [*command, "--help"]).output
        assert "-q, --quiet" in shown and "--log-format [text|json]" in shown, command


def test_quiet_says_only_warnings_and_errors(embed_job: Path):
    quiet = invoke("run", str(embed_job), "-q", "--progress", "log")
    assert quiet.exit_code == 0, quiet.stderr
    assert quiet.output == ""  # no summary, no log line
    again = invoke("-q", "run", str(embed_job), "--set", "model.precision=fp61")
    assert again.exit_code == 2 and "[model].precision" in again.stderr  # errors still said


def test_verbose_and_quiet_together_is_a_usage_error(embed_job: Path):
    result = invoke("-v", "validate", str(embed_job), "-q")
    assert result.exit_code == 2 and "-v and -q ask for opposite things" in result.stderr
    result = invoke("validate", str(embed_job), "-q", "-v", "--log-format", "json")
    assert result.exit_code == 2
    entry = json.loads(result.stderr)
    assert entry["level"] == "error" and entry["exit_code"] == 2
    assert "-v and -q" in entry["message"]


def test_what_other_libraries_write_is_json_too(embed_job: Path, monkeypatch):
    """A library that logs through a handler of its own (transformers stops its records
    reaching the root logger) or prints: under --log-format json each line is a JSON object
    carrying it; without, it passes as it was written."""
    import sys

    from batchscore.recipes import validate

    real = validate.preflight

    def chatty(job):
        library = logging.getLogger("chatty-library")
        library.propagate = False
        library.handlers[:] = [logging.StreamHandler()]  # sys.stderr as it is now, as theirs
        library.warning("Some weights were not initialized")
        print("a stray print", file=sys.stderr, end="")
        print(" ends here\r 10%|#   |\r100%|####|", file=sys.stderr)
        print("to stdout")
        return real(job)

    monkeypatch.setattr(validate, "preflight", chatty)
    result = invoke("validate", str(embed_job), "--log-format", "json")
    assert result.exit_code == 0, result.output
    err = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(e["logger"], e["level"], e["message"]) for e in err] == [
        ("stderr", "warning", "Some weights were not initialized"),
        ("stderr", "warning", "a stray print ends here"),
        ("stderr", "warning", " 10%|#   |"),
        ("stderr", "warning", "100%|####|"),
    ]
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(e["logger"], e["message"]) for e in out] == [
        ("stdout", "to stdout"),
        ("batchscore", f"{embed_job}: ok"),
    ]
    plain = invoke("validate", str(embed_job))
    assert "Some weights were not initialized\n" in plain.stderr
    assert plain.stdout.startswith("to stdout\n")


@pytest.mark.parametrize(
    "args",
    [
        ["--log-format", "json", "run", "job.toml", "--no-such-option"],
        ["run", "--log-format=json"],  # the job argument missing
        ["--log-format", "json", "--bogus", "run", "job.toml"],
    ],
)
def test_usage_errors_are_json_lines_when_json_is_asked_for(args: list[str]):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    entry = json.loads(line)
    assert entry["level"] == "error" and entry["error"] in ("NoSuchOption", "MissingParameter")
    assert entry["exit_code"] == 2 and "--help" in entry["message"]


# -- saying what happened ----------------------------------------------------------------------


def test_a_run_with_nothing_to_do_says_so(embed_job: Path):
    assert invoke("run", str(embed_job), "--progress", "off").exit_code == 0
    again = invoke("run", str(embed_job), "--progress", "off")
    assert again.exit_code == 0, again.stderr
    assert again.stdout.splitlines() == [
        "batchscore: embed: nothing to do: every row is committed (360 rows in 9 chunks)",
        f"  output: {embed_job.parent / 'out'}",
    ]
    as_json = invoke("run", str(embed_job), "--log-format", "json", "--progress", "off")
    summary = json.loads(as_json.stdout)
    assert summary["event"] == "summary" and summary["nothing_to_do"] is True
    assert summary["rows"] == 0 and summary["rows_already_done"] == 360


def test_no_line_of_a_run_is_said_twice(embed_job: Path):
    """Everything a run says, at -v, on both streams: each line once."""
    auto = 'model.precision="auto"'
    result = invoke("-v", "run", str(embed_job), "--progress", "log", "--set", auto)
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.output.splitlines() if line.strip()]
    repeated = {line for line in lines if lines.count(line) > 1}
    assert not repeated, repeated


# -- exit codes a scheduler can gate on -------------------------------------------------------


def test_validate_exits_with_the_code_run_would_use(embed_job: Path, tmp_path: Path):
    """A corrupt shard is the data's problem: `run` exits 3 for it, and so does `validate`;
    a job-file problem beside it is the job's (2), and both are listed."""
    (tmp_path / "in" / "docs-001.parquet").write_bytes(b"PAR1 not parquet at all")
    checked = invoke("validate", str(embed_job))
    assert checked.exit_code == 3, checked.stderr
    assert "docs-001.parquet: not a readable Parquet file" in checked.stderr
    ran = invoke("run", str(embed_job), "--progress", "off")
    assert ran.exit_code == 3
    both = invoke("validate", str(embed_job), "--set", "input.keep=['embedding']")
    assert both.exit_code == 2, both.stderr
    assert "not a readable Parquet file" in both.stderr and "embedding" in both.stderr


def test_status_check_exits_13_until_the_output_is_complete(embed_job: Path, tmp_path: Path):
    before = invoke("status", str(embed_job), "--check")
    assert before.exit_code == 13
    assert "not complete (0 of 360 rows committed): 3 shard(s) pending" in before.stderr
    (tmp_path / "in" / "docs-002.parquet").write_bytes(b"PAR1 not parquet at all")
    assert invoke("run", str(embed_job), "--progress", "off").exit_code == 3
    failed = invoke("status", str(embed_job), "--check", "--json")
    assert failed.exit_code == 13 and "1 shard(s) failed" in failed.stderr
    assert json.loads(failed.stdout)["complete"] is False
    shutil.copy(tmp_path / "in" / "docs-000.parquet", tmp_path / "in" / "docs-002.parquet")
    assert invoke("run", str(embed_job), "--progress", "off").exit_code == 0
    assert invoke("status", str(embed_job), "--check").exit_code == 0
    other = invoke("status", str(embed_job), "--check", "--set", "model.max_length=64")
    # refused, as the run refuses it: exit 5, the run's message (tests/recipes/test_verdict.py)
    assert other.exit_code == 5 and "made with other settings" in other.stderr


class Left(Exception):
    """`os._exit`, caught: the status the process would have ended with."""


@pytest.mark.parametrize(
    ("done", "ends"),
    [(SystemExit(0), 0), (SystemExit(None), 0), (SystemExit(13), 13), (SystemExit("no"), None)],
)
def test_the_command_ends_its_process_at_once_with_its_status(monkeypatch, done, ends):
    """`console` ends the process with `os._exit` (the interpreter's teardown, 0.4 s with torch
    loaded, is skipped), the command's status kept; a status that is a message exits as Python
    does; where Ray was started, its shutdown hooks run (Python exits as usual)."""
    import sys

    from batchscore.observe import streams

    def exit_now(code: int) -> None:
        raise Left(code)

    monkeypatch.setattr(streams.os, "_exit", exit_now)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    if ends is None:
        with pytest.raises(SystemExit):
            streams.leave(done)
    else:
        with pytest.raises(Left) as left:
            streams.leave(done)
        assert left.value.args == (ends,)
    monkeypatch.setitem(sys.modules, "ray", sys)  # any module: Ray was imported
    with pytest.raises(SystemExit) as usual:
        streams.leave(done)
    assert usual.value is done


def test_a_command_in_its_own_process_says_everything_before_it_ends(embed_job: Path):
    """A real process through pipes: the run's last summary line, `status --json` whole, and
    each command's own exit status (2 for a job file that is not there, 13 from `status
    --check` before the run) arrive although the process skips the interpreter's teardown."""
    before = subprocess.run(
        commands.command(embed_job, "--check", verb="status"), capture_output=True, text=True,
        env=commands.environment(),
    )  # fmt: skip
    assert before.returncode == 13, before.stderr
    done = subprocess.run(
        commands.command(embed_job), capture_output=True, text=True, env=commands.environment()
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().splitlines()[-1].startswith("  output: "), done.stdout
    status = subprocess.run(
        commands.command(embed_job, "--json", verb="status"), capture_output=True, text=True,
        env=commands.environment(),
    )  # fmt: skip
    assert status.returncode == 0 and json.loads(status.stdout)["complete"] is True
    missing = subprocess.run(
        commands.command(embed_job.parent / "none.toml", verb="validate"), capture_output=True,
        text=True, env=commands.environment(),
    )  # fmt: skip
    assert missing.returncode == 2 and "job file not found" in missing.stderr
