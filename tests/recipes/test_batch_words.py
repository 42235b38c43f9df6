"""run-batch's advice in its own options: every flag a message run-batch can raise names, once
reworded, is one run-batch takes."""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from batchscore.cli import main
from batchscore.errors import JobError
from batchscore.recipes.batch_words import batch_words, in_batch_words
from tests.commands import environment

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# flags named in a reachable module's strings that are no advice run-batch can give: the exit
# codes' table (a meaning per code, never a message), and the hub's own download command
NOT_ADVICE = {
    ("batchscore.errors", "--check"),
    ("batchscore.errors", "--max-wall-s"),
    ("batchscore.errors", "--max-tokens"),
    ("batchscore.errors", "--metrics-file"),
    ("batchscore.errors", "--json"),  # exit 74's meaning: `report --json` prints its product
    ("batchscore.models.source.hub", "--revision"),  # `batchscore fetch ID --revision R`
}


def run_batch_flags() -> set[str]:
    """What `batchscore run-batch` accepts: its own options and the global ones."""
    command = main.get_command(click.Context(main), "run-batch")
    flags = {"--help", "--version"}
    for param in [*command.params, *main.params]:
        flags.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("--"))
    return flags


def reachable() -> list[str]:
    """The batchscore modules run-batch imports (in a fresh interpreter: this one has more)."""
    code = "import batchscore.recipes.run_batch, sys, json; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=environment(), capture_output=True, check=True
    )
    return [m for m in json.loads(done.stdout) if m.startswith("batchscore")]


def strings(module: str) -> list[str]:
    """A module's string literals (an f-string with ``{}`` for each value), docstrings left
    out: what its messages can say."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            found.append(
                "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            )
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        ):
            found.append(node.value)
    return found


def test_every_flag_run_batch_can_advise_is_one_it_takes():
    """Every string of every module run-batch imports, said in run-batch's words, names only
    flags run-batch accepts (`run`'s --restart and --accept-quality are what it must not)."""
    takes = run_batch_flags()
    assert {"--work-dir", "--model", "--set"} <= takes and "--restart" not in takes
    wrong = sorted(
        (module, flag, text)
        for module in reachable()
        for text in strings(module)
        for flag in set(FLAG.findall(batch_words(text, "FOLDER")))
        if flag not in takes and (module, flag) not in NOT_ADVICE
    )
    assert not wrong, wrong


def test_a_changed_setting_is_advised_in_run_batch_words():
    message = (
        "/w/embeddings/output: committed output was made with other settings (changed: "
        "max_length); run with --restart to discard it and start over, or point "
        "[output].path at a new folder"
    )
    assert batch_words(message, "/w/embeddings") == (
        "/w/embeddings/output: committed output was made with other settings (changed: "
        "max_length); remove /w/embeddings to start its job over, or point --work-dir at a "
        "new folder"
    )
    kept = "Run with --restart to start over (files batchscore did not write are kept), or"
    assert batch_words(kept, "/w/x") == "Remove /w/x to start its job over, or"
    gate = "relax [quality], or pass --accept-quality to score anyway"
    assert (
        batch_words(gate, "/w/x")
        == "relax [quality], or pass --set quality.accept=true to score anyway"
    )
    need = "theirs are kept (new ranges or a new precision need --restart)"
    assert (
        batch_words(need, "/w/x")
        == "theirs are kept (new ranges or a new precision need /w/x removed)"
    )


def test_warnings_logged_while_a_job_runs_are_reworded_too(caplog: pytest.LogCaptureFixture):
    """A job's warnings reach the user as its errors do: in run-batch's words, and only
    while run-batch runs it."""
    log = logging.getLogger("batchscore")
    with caplog.at_level(logging.WARNING, logger="batchscore"):
        with in_batch_words("/w/x"):
            log.warning("%s: run with --restart to start over", "/w/x/output")
        log.warning("after: run with --restart to start over")
    assert [r.getMessage() for r in caplog.records] == [
        "/w/x/output: remove /w/x to start its job over",
        "after: run with --restart to start over",
    ]


def test_errors_raised_while_a_job_runs_are_reworded():
    with pytest.raises(JobError) as raised, in_batch_words("/w/x"):
        raise JobError(["[model].name: no such model", "run with --restart to start over"])
    assert raised.value.problems == ["--model: no such model", "remove /w/x to start its job over"]
    assert str(raised.value) == "--model: no such model\nremove /w/x to start its job over"
