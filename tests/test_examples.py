"""The orchestration examples of docs/examples/ hold: the Dagster asset materializes through
Dagster's own ``materialize`` against a real job (dagster is in the dev set); the Airflow DAG
(Airflow is not: 134 packages, ~270 MB) is read with ``ast``, and each command it runs is a
batchscore command line that batchscore's own parser takes, read by the exit statuses the
docs give (12 skips, the run retries 75, 7 and 143, 13 fails)."""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType

import click
import pyarrow.parquet as pq
import pytest

from batchscore.cli import main
from batchscore.errors import (
    IncompleteError,
    LockHeldError,
    OverLimitError,
    TransientIOError,
)
from batchscore.output.lock import hold_lock
from tests.commands import ROOT
from tests.conftest import write_job

EXAMPLES = ROOT / "docs" / "examples"
SIGTERM, SIGHUP = 143, 129


# -- Airflow: read, never run ------------------------------------------------------------------


def constants(tree: ast.Module) -> dict[str, object]:
    """The module's constants (``NAME = literal``)."""
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    continue
    return found


def value(node: ast.expr, names: dict[str, object]) -> object:
    if isinstance(node, ast.Name):
        return names[node.id]
    return ast.literal_eval(node)


def operators(tree: ast.Module) -> dict[str, dict[str, object]]:
    """Each BashOperator's keywords (the literal ones), by its variable name."""
    names = constants(tree)
    found = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "BashOperator"
        ):
            keywords = {}
            for keyword in node.value.keywords:
                try:
                    keywords[keyword.arg] = value(keyword.value, names)
                except (ValueError, KeyError):
                    keywords[keyword.arg] = ast.unparse(keyword.value)
            found[node.targets[0].id] = keywords  # type: ignore[attr-defined]
    return found


def params(tree: ast.Module) -> dict[str, str]:
    """The DAG's ``params``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DAG":
            for keyword in node.keywords:
                if keyword.arg == "params":
                    return ast.literal_eval(keyword.value)
    raise AssertionError("the DAG names no params")


def command_line(template: str, given: dict[str, str]) -> list[str]:
    """A bash_command with its Jinja ``{{ params.X }}`` filled in, split as bash splits it."""
    text = re.sub(r"\{\{\s*params\.(\w+)\s*\}\}", lambda m: given[m.group(1)], template)
    return shlex.split(text)


def parsed(argv: list[str]) -> click.Context:
    """``argv`` through batchscore's own parser: a command or option it lacks raises."""
    assert argv[0] == "batchscore", argv
    command = main.commands[argv[1]]
    return command.make_context(argv[1], argv[2:], parent=click.Context(main))


def test_the_airflow_dag_runs_real_commands_read_by_their_exit_statuses():
    path = EXAMPLES / "airflow_dag.py"
    tree = ast.parse(path.read_text())
    tasks = operators(tree)
    assert set(tasks) == {"plan", "run", "check"}
    given = params(tree)
    lines = {name: command_line(str(task["bash_command"]), given) for name, task in tasks.items()}
    contexts = {name: parsed(argv) for name, argv in lines.items()}
    assert [lines[name][1] for name in ("plan", "run", "check")] == ["plan", "run", "status"]
    assert all(ctx.params["job"] == given["job"] for ctx in contexts.values())
    assert contexts["plan"].params["max_wall_s"] == 3600
    assert contexts["check"].params["check"] is True
    assert contexts["run"].params["metrics_file"] == given["metrics"]
    # plan's 12 skips (the gate held it back); the others fail the task
    assert tasks["plan"]["skip_on_exit_code"] == OverLimitError.exit_code
    # the run retries: what 75, 7 and 143 ask for (Airflow retries any failure)
    assert int(tasks["run"]["retries"]) >= 1
    said = ast.get_docstring(tree) or ""
    for code in (LockHeldError.exit_code, TransientIOError.exit_code, SIGTERM):
        assert f"{code} (" in said, code
    # status --check's 13 fails the DAG run: never skipped, never retried
    assert "skip_on_exit_code" not in tasks["check"] and "retries" not in tasks["check"]
    assert f"exits {IncompleteError.exit_code} unless the output is complete" in said
    chain = [
        n for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.BinOp)
    ]
    assert [ast.unparse(n) for n in chain] == ["plan >> run >> check"]


# -- Dagster: materialized ---------------------------------------------------------------------


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def dagster_job(tmp_path: Path, small_corpus, monkeypatch) -> Path:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    (tmp_path / "in").mkdir()
    for i in range(2):
        pq.write_table(small_corpus.slice(i * 20, 20), tmp_path / "in" / f"part-{i}.parquet")
    return write_job(
        tmp_path / "embed.toml",
        input={"path": "in", "id": "doc_id"},
        model={"task": "embed", "precision": "fp32", "threads": 1},
        output={"path": "out"},
    )


def materialized(module: ModuleType, job: Path, **config: object):
    import dagster as dg

    settings = module.BatchscoreJob(
        job=str(job), command=[sys.executable, "-m", "batchscore"], **config
    )
    run_config = dg.RunConfig({"embeddings": settings})
    return dg.materialize([module.embeddings], run_config=run_config, raise_on_error=False)


def test_the_dagster_asset_codes_are_batchscores():
    pytest.importorskip("dagster")
    module = example("dagster_assets")
    assert OverLimitError.exit_code == module.OVER_LIMIT
    assert IncompleteError.exit_code == module.INCOMPLETE
    retried = {LockHeldError.exit_code, TransientIOError.exit_code, SIGHUP, SIGTERM}
    assert set(module.RETRY_LATER) == retried


def test_the_dagster_asset_materializes_a_complete_output(dagster_job: Path):
    """plan, run and status --check, each in a process of its own: the asset is materialized
    with the output's numbers, and the folder is complete."""
    pytest.importorskip("dagster")
    result = materialized(example("dagster_assets"), dagster_job)
    assert result.success
    (done,) = result.asset_materializations_for_node("embeddings")
    assert done.metadata["rows"].value == 40 and done.metadata["bad_rows"].value == 0
    assert done.metadata["rows_scored_now"].value == 40
    assert done.metadata["precision"].value == "fp32"
    assert (dagster_job.parent / "out" / "_SUCCESS").is_file()


def test_the_dagster_asset_retries_a_held_lock_and_skips_over_its_window(dagster_job: Path):
    """Another run holding the job's lock (75) is a retry, never a failure at once; a plan
    over the window (12) leaves the asset unmaterialized and the step successful, the run
    never started."""
    pytest.importorskip("dagster")
    module = example("dagster_assets")
    out = dagster_job.parent / "out"
    (out / "_batchscore").mkdir(parents=True)
    with hold_lock(out / "_batchscore" / "lock", "embed"):
        held = materialized(module, dagster_job, retries=1, retry_wait_s=0.0)
    assert not held.success
    events = [event.event_type_value for event in held.all_events]
    assert "STEP_UP_FOR_RETRY" in events and events.count("STEP_START") == 1
    assert events.count("STEP_RESTARTED") == 1
    over = materialized(module, dagster_job, max_wall_s=0.001)
    assert over.success and over.asset_materializations_for_node("embeddings") == []
    assert not (out / "_SUCCESS").exists()
