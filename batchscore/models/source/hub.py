"""Hugging Face ids, found offline in the local Hugging Face cache by huggingface_hub itself.

Inside the cache, the layout (``models--{org}--{name}``, ``refs/{branch or tag}`` naming a
commit, ``snapshots/{commit}/``) is huggingface_hub's to read: `snapshot` asks
``snapshot_download(local_files_only=True)``, which resolves a branch, tag or commit hash to its
snapshot folder as transformers and sentence-transformers would, and knows a snapshot its own
download left incomplete. Nothing is downloaded here: `batchscore fetch` alone does that
(`download.py`), into this same cache, so that jobs naming a model resolve it offline after.

The cache folder itself is named here, per call, from the variables the caller passes
(`hub_cache`, by huggingface_hub's own rules): huggingface_hub reads ``HF_HOME`` and
``HF_HUB_CACHE`` once, when it is imported, so a process that sets them later (a notebook, a
test, a scheduler's wrapper) would be searched in the old place; and no module here reads the
environment behind its caller's back.

huggingface_hub is imported on the first look-up of an id (0.17 to 0.3 s, measured with
``python -X importtime``), so a job with the built-in model or a local path never pays for it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from batchscore.errors import ModelError
from batchscore.job.revision import revision_problem

COMMIT = re.compile(r"[0-9a-f]{40}")
# The files of a hub repository batchscore reads (fnmatch patterns, as huggingface_hub takes
# them; "*" spans folders, so a sentence-transformers module's own files match too): configs
# (config.json, tokenizer_config.json, modules.json, generation_config.json, ...), safetensors
# weights and their shard index, and tokenizer files (tokenizer.json, vocab.txt, merges.txt,
# sentencepiece models, chat_template.jinja). `batchscore fetch` downloads these, and a
# snapshot is complete when it holds these of its commit's files: a README, ONNX or OpenVINO
# exports, or pickle weights left on the hub are not missing.
READ_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja")
PICKLE_PATTERNS = ("*pytorch_model*.bin",)  # transformers' pickle weights: asked for only


@dataclass(frozen=True)
class CachedRevision:
    """One commit of a model the cache holds: the refs (branches, tags) naming it, its snapshot
    folder, and its files' size on disk."""

    repo_id: str
    commit: str
    refs: tuple[str, ...]
    path: Path
    size: int


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
    """Whether ``name`` can be a Hugging Face model id ("org/name", or a bare legacy "name"),
    by huggingface_hub's own rule."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def repo_folder(cache: Path, repo_id: str) -> Path:
    """The folder one model's files live in, inside the cache (for messages)."""
    from huggingface_hub.file_download import repo_folder_name

    return cache / repo_folder_name(repo_id=repo_id, repo_type="model")


def read_patterns(allow_pickle: bool = False) -> list[str]:
    """The files of a repository batchscore reads; pickle weights only where a job allows them."""
    return [*READ_PATTERNS, *(PICKLE_PATTERNS if allow_pickle else ())]


def snapshot(
    cache: Path, repo_id: str, revision: str | None, allow_pickle: bool = False
) -> Path | None:
    """The snapshot folder of ``repo_id`` at ``revision`` (default "main") in ``cache``, or None
    when the cache does not hold it; `ModelError` for a snapshot the cache knows is incomplete
    (a file batchscore reads missing from it: `read_patterns`).

    A revision that is no ref name (an absolute path, a "..": `[model].revision` refuses them)
    is never handed on, and a ref that names anything but a commit finds nothing: no file
    outside the repository's own snapshots is ever read as a model.
    """
    if revision is not None and revision_problem(revision):
        return None
    if not is_repo_id(repo_id):
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        found = Path(
            snapshot_download(
                repo_id,
                revision=revision,
                cache_dir=cache,
                local_files_only=True,
                allow_patterns=read_patterns(allow_pickle),
            )
        )
    except LocalEntryNotFoundError as exc:
        incomplete = getattr(exc, "snapshot_path", None)  # IncompleteSnapshotError's
        if incomplete is not None:
            raise ModelError(f'[model].name: "{repo_id}": {exc}') from None
        return None
    # huggingface_hub resolves the cache folder (links included) before it joins the rest
    inside = found.parent == repo_folder(cache.expanduser().resolve(), repo_id) / "snapshots"
    return found if inside and COMMIT.fullmatch(found.name) and found.is_dir() else None


def cached_models(cache: Path) -> tuple[list[CachedRevision], list[str]]:
    """Every model commit ``cache`` holds, as huggingface_hub's ``scan_cache_dir`` sees them
    (datasets and spaces left out), and what it could not read there, in words. A cache that
    does not exist holds none."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(cache)
    except CacheNotFound:
        return [], []
    found = [
        CachedRevision(
            repo.repo_id,
            revision.commit_hash,
            tuple(sorted(revision.refs)),
            revision.snapshot_path,
            revision.size_on_disk,
        )
        for repo in info.repos
        if repo.repo_type == "model"
        for revision in repo.revisions
    ]
    found.sort(key=lambda r: (r.repo_id.lower(), "main" not in r.refs, r.refs, r.commit))
    return found, [str(warning) for warning in info.warnings]


def fetch_command(repo_id: str, revision: str | None) -> str:
    """The command that puts ``repo_id`` in the cache, where the network reaches the hub."""
    return f"batchscore fetch {repo_id}" + (f" --revision {revision}" if revision else "")
