"""Hugging Face ids, found offline in the local Hugging Face cache, where transformers finds them.

The cache is the one `huggingface_hub` fills: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub`` (``$XDG_CACHE_HOME`` moves ``~/.cache``). A model lives in
``models--{org}--{name}``: its files in ``snapshots/{commit}/`` (links into ``blobs/``), and each
branch or tag it has fetched in ``refs/{revision}``, a file holding that revision's commit. Only
files are read; nothing is ever downloaded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from batchscore.job.revision import revision_problem

COMMIT = re.compile(r"[0-9a-f]{40}")
# What huggingface_hub accepts as a repository id: an optional namespace, then a name.
REPO_ID = re.compile(r"(?:[\w][\w.-]{0,95}/)?[\w][\w.-]{0,95}")


def hub_cache(env: Mapping[str, str]) -> Path:
    """The cache folder the standard variables in ``env`` name, as huggingface_hub reads them."""
    folder = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not folder:
        home = env.get("HF_HOME") or os.path.join(
            env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"
        )
        folder = os.path.join(home, "hub")
    return Path(os.path.expanduser(os.path.expandvars(folder)))


def is_repo_id(name: str) -> bool:
    """Whether ``name`` can be a Hugging Face model id ("org/name", or a bare legacy "name")."""
    return bool(REPO_ID.fullmatch(name)) and "--" not in name and ".." not in name


def repo_folder(cache: Path, repo_id: str) -> Path:
    """The folder one model's files live in, inside the cache."""
    return cache / ("models--" + repo_id.replace("/", "--"))


def snapshot(cache: Path, repo_id: str, revision: str | None) -> Path | None:
    """The snapshot folder of ``repo_id`` at ``revision`` (default "main"), or None when the
    cache does not hold it. A commit hash names its snapshot; a branch or tag goes through refs."""
    folder = repo_folder(cache, repo_id)
    revision = revision or "main"
    if COMMIT.fullmatch(revision):
        commit = revision
    else:
        ref = folder / "refs" / revision
        # an absolute path or a "..", say, is no ref name: never read (validate refuses it)
        if revision_problem(revision) or not ref.is_file():
            return None
        commit = ref.read_text(encoding="utf-8").strip()
    found = folder / "snapshots" / commit
    return found if COMMIT.fullmatch(commit) and found.is_dir() else None


def fetch_command(repo_id: str, revision: str | None) -> str:
    """The command that puts ``repo_id`` in the cache, on a machine that can reach the hub."""
    return f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
