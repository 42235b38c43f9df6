"""The command line through CliRunner: help, exit codes, and each command on a real job."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click
import pytest
import sample_corpus
from click.testing import CliRunner

from batchscore.cli import main
from batchscore.output.lock import hold_lock

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
    assert result.exit_code == 2
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


@pytest.fixture(scope="session")
def examples(tmp_path_factory: pytest.TempPathFactory, small_corpus) -> Path:
    """What `make setup` builds besides the corpus (data/tabular, models/), by the same scripts,
    trained only briefly: validation needs the files, not good models."""
    import classify_example
    import generate_example
    import tabular_example

    root = tmp_path_factory.mktemp("examples")
    models = root / "models"
    tabular_example.build(root / "data" / "tabular", models / "breast-cancer-mlp.safetensors",
                          epochs=2)  # fmt: skip
    classify_example.build(small_corpus, models / "docstring-kind", per_kind=4)
    generate_example.build(small_corpus, models / "toy-gpt2", steps=1)
    return root


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
