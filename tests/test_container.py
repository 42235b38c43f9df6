"""The Dockerfile builds the image docs/production.md describes: torch's CPU build from PyTorch's
CPU index before batchscore (so pip never fetches the CUDA build), the extras the shipped jobs
use, a user that is not root, and `batchscore` as the entrypoint with the sample job as the
default command. No Docker engine runs here, so the file is read, not built: hadolint (with
shellcheck for its RUN lines, both from the dev set) lints it, and the checks below hold it to
what the Makefile and the docs say.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) in order, continuation lines joined, comments dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).strip().partition(" ")
        found.append((keyword.upper(), " ".join(rest.split())))
        pending = ""
    return found


STEPS = instructions(DOCKERFILE.read_text())


def stages() -> list[list[tuple[str, str]]]:
    """The build's stages, each from its FROM on (the global ARGs before the first are left)."""
    starts = [i for i, (keyword, _) in enumerate(STEPS) if keyword == "FROM"]
    return [STEPS[a:b] for a, b in zip(starts, [*starts[1:], len(STEPS)], strict=True)]


def args(steps: list[tuple[str, str]]) -> dict[str, str]:
    """Each ARG's default (ARG NAME=value)."""
    found = {}
    for keyword, rest in steps:
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            found[name] = value.strip('"')
    return found


def makefile(name: str) -> str:
    match = re.search(rf"^{name}\s*\??:?=\s*(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert match, f"the Makefile no longer sets {name}"
    return match.group(1).strip()


def test_hadolint_finds_nothing():
    """hadolint at its strictest threshold (style), with shellcheck on every RUN line."""
    bin_dir = Path(sys.executable).parent
    hadolint = bin_dir / "hadolint"
    if not hadolint.exists() or not (bin_dir / "shellcheck").exists():
        why = "hadolint and shellcheck (the dev set: make test) are not installed"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    linted = subprocess.run(
        [str(hadolint), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"},
        capture_output=True,
        text=True,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_the_image_is_python_slim_with_the_cpu_torch_first():
    """The last stage starts from python:3.11-slim, installs torch from PyTorch's CPU index at
    the Makefile's CPU pin, and only then batchscore, so pip keeps that torch."""
    final = stages()[-1]
    versions = args(STEPS[: STEPS.index(stages()[0][0])])
    base = final[0][1].replace("${PYTHON_VERSION}", versions["PYTHON_VERSION"])
    assert base == "python:3.11-slim"
    defaults = args(final)
    assert defaults["TORCH_INDEX"] == CPU_INDEX
    pin = makefile("TORCH_CPU")  # torch==2.13.0+cpu
    assert f"torch=={defaults['TORCH_VERSION']}+cpu" == pin
    runs = [rest for keyword, rest in final if keyword == "RUN"]
    torch = next(i for i, run in enumerate(runs) if '--index-url "${TORCH_INDEX}"' in run)
    assert '"torch==${TORCH_VERSION}"' in runs[torch]
    package = next(i for i, run in enumerate(runs) if "batchscore-*.whl" in run)
    assert torch < package and "--index-url" not in runs[package]


def test_the_image_installs_the_extras_make_score_installs():
    assert args(stages()[-1])["EXTRAS"] == makefile("JOB_EXTRAS")
    assert "[${EXTRAS}]" in next(r for k, r in stages()[-1] if k == "RUN" and "batchscore-" in r)


def test_it_runs_as_a_user_that_is_not_root():
    """The image's USER is set before the entrypoint, by number (a cluster's runAsNonRoot
    checks numbers), and is not 0; the user exists (useradd with that uid)."""
    final = stages()[-1]
    users = [(i, rest) for i, (keyword, rest) in enumerate(final) if keyword == "USER"]
    assert users, "no USER: the image would run as root"
    index, user = users[-1]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert any(k == "RUN" and f"--uid {uid}" in r for k, r in final[:index])
    entry = next(i for i, (keyword, _) in enumerate(final) if keyword == "ENTRYPOINT")
    assert index < entry


def test_batchscore_is_the_entrypoint_and_the_sample_job_the_default():
    """`docker run IMAGE` runs the shipped summarize job on the corpus the image built; any
    other command line is batchscore's (`docker run IMAGE run jobs/embed.toml`)."""
    final = dict((keyword, rest) for keyword, rest in stages()[-1])
    assert json.loads(final["ENTRYPOINT"]) == ["batchscore"]
    command = json.loads(final["CMD"])
    assert command[0] == "run" and (ROOT / command[1]).is_file()
    job = (ROOT / command[1]).read_text()
    assert 'path = "../data/docs"' in job
    assert any(k == "RUN" and "sample_corpus.py data/docs" in r for k, r in stages()[-1])


def test_every_copied_path_passes_the_dockerignore():
    """Each path a COPY reads from the context is one .dockerignore lets through (it ignores
    everything else), so the build never misses a file nor sends the environments."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"

    def sent(path: str) -> bool:
        keep = True
        for pattern in patterns:
            negated = pattern.startswith("!")
            bare = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, bare) or path.startswith(bare + "/"):
                keep = negated
        return keep

    copied = []
    for keyword, rest in STEPS:
        words = shlex.split(rest)
        if keyword != "COPY" or any(w.startswith("--from") for w in words):
            continue
        copied += [w for w in words[:-1] if not w.startswith("--")]
    assert copied
    for source in copied:
        assert (ROOT / source).exists(), source
        assert sent(source), f"{source} is copied but .dockerignore leaves it out"
    for left_out in (".venv", "data", "models", "out", ".git", "tests"):
        assert not sent(left_out), f"{left_out} would be sent to the build"
