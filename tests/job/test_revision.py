"""`[model].revision` is a branch, a tag or a commit hash: git's rules for ref names decide,
and anything else (an absolute path above all) is refused at `validate`, naming the key."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.errors import JobError
from batchscore.job.parse import job_from_dict
from batchscore.models.source.hub import snapshot
from tests.commands import invoke

COMMIT = "3" * 40
# characters that make or break a ref name, mixed with ordinary ones and any other character
TRICKY = st.sampled_from([*"ab9.-/@{}~^:?*[]\\ \t\x01\x7f\u00e9", ".lock", "..", "@{"])
REVISIONS = st.lists(TRICKY | st.characters(exclude_categories=("Cs",)), max_size=12).map("".join)


def git_accepts(name: str) -> bool:
    """What git itself says of ``name`` as a one-level-or-more ref name (a branch or tag)."""
    if name.startswith("-"):  # git reads it as an option; a branch may not start with one
        return False
    done = subprocess.run(
        ["git", "check-ref-format", "--allow-onelevel", name], capture_output=True, check=False
    )
    return done.returncode == 0


def job_with(revision: str) -> dict:
    return {
        "input": {"path": "in"},
        "model": {"task": "embed", "name": "acme/tiny-embed", "revision": revision},
        "output": {"path": "out"},
    }


@settings(max_examples=400, deadline=None)
@given(revision=REVISIONS)
def test_a_revision_is_accepted_exactly_when_git_takes_it_as_a_ref_name(revision, tmp_path_factory):
    folder = tmp_path_factory.getbasetemp()
    # no process argument holds a NUL, and no ref name does either
    accepted = "\x00" not in revision and git_accepts(revision)
    try:
        job = job_from_dict(job_with(revision), folder / "job.toml")
    except JobError as exc:
        assert not accepted, f"{revision!r} is a ref name git accepts: {exc}"
        assert any("[model].revision: " in p for p in exc.problems), exc.problems
        assert len(exc.problems) == 1
    else:
        assert accepted, f"{revision!r} is no ref name, but was accepted"
        assert job.model.revision == revision


def test_an_absolute_path_is_refused_by_validate_and_never_read(tmp_path: Path, shards):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(COMMIT)  # holds a commit, as a ref file would
    cache = tmp_path / "hub"
    (cache / "models--acme--tiny-embed" / "snapshots" / COMMIT).mkdir(parents=True)
    for revision in (str(elsewhere), "../../../elsewhere", "v1\\..\\x", "main\n"):
        job = tmp_path / "job.toml"
        job.write_text(  # a TOML basic string, escaped as JSON escapes one
            f'[input]\npath = {json.dumps(str(shards))}\n[output]\npath = "out"\n'
            f'[model]\ntask = "embed"\nname = "acme/tiny-embed"\n'
            f"revision = {json.dumps(revision)}\n"
        )
        result = invoke("validate", str(job), catch=False)
        assert result.exit_code == 2, result.output
        assert "[model].revision: " in result.stderr
        assert "expected a branch, a tag or a commit hash" in result.stderr
        # the cache never reads what such a revision names, whoever calls it
        assert snapshot(cache, "acme/tiny-embed", revision) is None


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "release/2024-01", COMMIT])
def test_branches_tags_and_commits_pass(revision: str, tmp_path: Path):
    job = job_from_dict(job_with(revision), tmp_path / "job.toml")
    assert job.model.revision == revision
