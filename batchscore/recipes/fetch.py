"""`batchscore fetch`'s recipe: a Hugging Face model into the local cache, for offline runs.

The only command that uses the network. The model goes into the standard Hugging Face cache
the environment names (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ~/.cache/huggingface/hub),
where every job naming it by `[model].name` finds it offline afterwards (`hub.snapshot`, which
this recipe asks before it says done); the hub is ``HF_ENDPOINT`` where set, and ``HF_TOKEN``
opens gated and private models. Only the files batchscore reads come down (`hub.read_patterns`).
A model already whole in the cache is not fetched again. A fetched model that runs as no task
(pickle weights only, an architecture no task runs) is kept, and the command fails, saying why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from batchscore.errors import JobError, ModelError
from batchscore.job.revision import revision_problem
from batchscore.models.abilities import abilities
from batchscore.models.source.download import download
from batchscore.models.source.hub import hub_cache, is_repo_id, snapshot
from batchscore.models.source.locate import BUILTIN, builtin_path
from batchscore.recipes.catalog import human, size_of

TRUE = ("1", "on", "yes", "true")  # how huggingface_hub reads HF_HUB_OFFLINE


@dataclass
class Fetched:
    """Where a model is now, and what a job can run it as."""

    name: str
    revision: str
    commit: str | None
    path: str
    files: int
    size_bytes: int
    kind: str
    tasks: list[str]
    notes: list[str] = field(default_factory=list)
    job: dict[str, Any] = field(default_factory=dict)  # the [model] keys that name it


def fetch(
    name: str,
    *,
    revision: str | None = None,
    allow_pickle: bool = False,
    progress: bool = True,
    verbose: bool = False,
    environ: Mapping[str, str],
) -> Fetched:
    """``name`` at ``revision`` in the cache ``environ`` names, fetched where it is not whole
    there. `JobError` for a name or revision that cannot be one (nothing asked of the hub),
    `ModelError` for one the hub does not have or a model that runs as no task."""
    if revision is None and name in BUILTIN and builtin_path(name) is not None:
        return described(name, "", None, builtin_path(name), {"name": name})  # type: ignore[arg-type]
    problems = []
    if not is_repo_id(name):
        problems.append(f'NAME: "{name}" is not a Hugging Face model id such as "org/name"')
    if revision is not None and (why := revision_problem(revision)):
        problems.append(f"--revision: {why}")
    if problems:
        raise JobError(problems)
    cache = hub_cache(environ)
    if environ.get("HF_HUB_OFFLINE", "").lower() in TRUE:
        path = snapshot(cache, name, revision, allow_pickle)  # what is here is all there is
        if path is None:
            raise ModelError(
                f'"{name}": HF_HUB_OFFLINE is set, which forbids the network that fetch needs, '
                f"and the cache ({cache}) does not hold it; unset HF_HUB_OFFLINE for this command"
            )
    else:
        path = download(
            name,
            revision,
            cache=cache,
            endpoint=environ.get("HF_ENDPOINT") or None,
            token=environ.get("HF_TOKEN") or None,
            allow_pickle=allow_pickle,
            progress=progress,
            verbose=verbose,
        )
    resolved = snapshot(cache, name, revision, allow_pickle)  # as a job will find it, offline
    if resolved is None:
        raise ModelError(f'"{name}": fetched into {path}, but not found there offline')
    keys: dict[str, Any] = {"name": name, **({"revision": revision} if revision else {})}
    if allow_pickle:
        keys["allow_pickle"] = True
    found = described(name, revision or "main", resolved.name, resolved, keys, allow_pickle)
    if not found.tasks:
        why = "; ".join(found.notes) or found.kind
        if not allow_pickle and not any(resolved.rglob("*.safetensors")):
            why += (
                "; the hub's copy may hold pickle weights alone (pytorch_model.bin): "
                "--allow-pickle fetches them, and a job loads them only with "
                "[model].allow_pickle = true"
            )
        raise ModelError(f'"{name}": fetched into {resolved}, but runs as no task: {why}')
    return found


def described(
    name: str,
    revision: str,
    commit: str | None,
    path: Path,
    job: dict[str, Any],
    allow_pickle: bool = False,
) -> Fetched:
    what = abilities(path, allow_pickle)
    files = sum(1 for p in path.rglob("*") if p.is_file()) if path.is_dir() else 1
    return Fetched(
        name=name,
        revision=revision,
        commit=commit,
        path=str(path),
        files=files,
        size_bytes=size_of(path),
        kind=what.kind if what else "no model files",
        tasks=list(what.tasks) if what else [],
        notes=list(what.notes) if what else [],
        job=job,
    )


def format_fetched(found: Fetched) -> str:
    at = f" at {found.revision}" if found.revision else " (built in: nothing to fetch)"
    commit = f"commit {found.commit[:12]}, " if found.commit else ""
    keys = ", ".join(f"{key} = {json.dumps(value)}" for key, value in found.job.items())
    lines = [
        f"{found.name}{at}: {commit}{found.files} files, {human(found.size_bytes)}",
        f"  in {found.path}",
        f"  runs as: {', '.join(found.tasks)} ({found.kind})",
        f"  a job names it{', offline from now on' if found.commit else ''}: [model] {keys}",
    ]
    lines.extend(f"  not as {note}" for note in found.notes)
    return "\n".join(lines)


def fetched_data(found: Fetched) -> dict[str, Any]:
    return asdict(found)
