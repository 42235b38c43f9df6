"""`batchscore models`' recipe: every model this machine can run, and what as.

Three places, as a job can name a model: the built-in (`[model].name`, shipped by its
package), local folders and files (`[model].path`: under ``./models`` and each ``--path``
folder, one level down, or the folder itself when it is a model), and the Hugging Face cache
(`[model].name`, and `.revision`, resolved offline: each commit the cache holds, as
huggingface_hub's ``scan_cache_dir`` sees it). Each entry says what its files run as
(`models.abilities`), its size on disk, where it is, and the keys a job names it by.
Nothing is loaded and nothing downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from batchscore.errors import JobError
from batchscore.models.abilities import Abilities, abilities
from batchscore.models.source.hub import cached_models, hub_cache
from batchscore.models.source.locate import BUILTIN, builtin_path

SOURCES = ("built-in", "local", "hub")


@dataclass(frozen=True)
class Entry:
    """One model a job can name: ``job`` holds the `[model]` keys that name it."""

    source: str  # built-in | local | hub
    name: str
    path: str
    size_bytes: int
    kind: str
    tasks: list[str]
    notes: list[str]
    job: dict[str, str]
    revision: str | None = None
    commit: str | None = None
    refs: list[str] = field(default_factory=list)


@dataclass
class Catalog:
    """What `batchscore models` found, for text or JSON."""

    models: list[Entry]
    hub_cache: str
    folders: list[str]
    warnings: list[str]


def catalog(folders: list[Path], *, environ: Mapping[str, str]) -> Catalog:
    """The models of the built-in packages, of ``folders`` (a folder that does not exist is
    passed over: ``./models`` need not be there) and of the Hugging Face cache ``environ``
    names."""
    entries = [*builtins(), *local(folders)]
    cache = hub_cache(environ)
    revisions, warnings = cached_models(cache)
    for revision in revisions:
        found = abilities(revision.path)
        if found is None:
            continue
        label = "main" if "main" in revision.refs else (revision.refs or (revision.commit,))[0]
        keys = {"name": revision.repo_id, **({"revision": label} if label != "main" else {})}
        entries.append(
            entry(
                "hub",
                revision.repo_id,
                revision.path,
                found,
                keys,
                size=revision.size,
                revision=label,
                commit=revision.commit,
                refs=list(revision.refs),
            )
        )
    return Catalog(entries, str(cache), [str(f) for f in folders], warnings)


def check_folders(folders: list[Path]) -> None:
    """Folders the command line named must be folders (``./models`` alone may be absent)."""
    bad = [f"--path {folder}: no such folder" for folder in folders if not folder.is_dir()]
    if bad:
        raise JobError(bad)


def builtins() -> list[Entry]:
    found = []
    for name, (_, dist) in BUILTIN.items():
        path = builtin_path(name)
        if path is None:
            missing = Abilities("not installed", (), (f"pip install {dist}",))
            found.append(entry("built-in", name, Path(dist), missing, {"name": name}, size=0))
            continue
        what = abilities(path) or Abilities("not a model folder", ())
        found.append(entry("built-in", name, path, what, {"name": name}, size=size_of(path)))
    return found


def local(folders: list[Path]) -> list[Entry]:
    """Each folder that is a model, else its children that are (one level down), once each."""
    found, seen = [], set()
    for folder in folders:
        if not folder.is_dir():
            continue
        own = abilities(folder)
        children = [folder] if own is not None else sorted(folder.iterdir())
        for path in children:
            key = os.path.realpath(path)
            what = own if path == folder else abilities(path)
            if what is None or key in seen or path.name.startswith((".", "_")):
                continue
            seen.add(key)
            where = path.resolve()  # a job's relative [model].path is the job file's, not ours
            found.append(entry("local", str(path), where, what, {"path": str(where)}))
    return found


def entry(
    source: str,
    name: str,
    path: Path,
    what: Abilities,
    job: dict[str, str],
    *,
    size: int | None = None,
    **extra: Any,
) -> Entry:
    return Entry(
        source=source,
        name=name,
        path=str(path),
        size_bytes=size_of(path) if size is None else size,
        kind=what.kind,
        tasks=list(what.tasks),
        notes=list(what.notes),
        job=job,
        **extra,
    )


def size_of(path: Path) -> int:
    """Bytes on disk of a file, or of the files under a folder (links to files followed, as a
    model's loader follows them; links to folders not)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:  # a dangling link: nothing there to count
                continue
    return total


def human(size: int) -> str:
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def format_catalog(found: Catalog) -> str:
    """A table for people: name, tasks, size, source and where; a model that runs as no task
    says why below it."""
    rows = [("model", "tasks", "size", "from", "where")]
    notes: dict[int, list[str]] = {}
    for model in found.models:
        name = model.name + (f" @{model.revision}" if model.revision not in (None, "main") else "")
        tasks = ", ".join(model.tasks) or "-"
        rows.append((name, tasks, human(model.size_bytes), model.source, model.path))
        if not model.tasks:
            notes[len(rows) - 1] = model.notes or [model.kind]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for number, row in enumerate(rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[4]]).rstrip())
        lines.extend(f"    not run: {note.splitlines()[0]}" for note in notes.get(number, []))
    count = len(found.models)
    lines.append(
        f"{count} model(s); hub cache {found.hub_cache}; a job names a built-in or hub model "
        "by [model].name (and .revision), a local one by [model].path"
    )
    lines.extend(f"warning: {warning}" for warning in found.warnings)
    return "\n".join(lines)


def catalog_data(found: Catalog) -> dict[str, Any]:
    return asdict(found)
