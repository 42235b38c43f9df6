"""The fingerprint: everything that decides a job's output, recorded when the folder is claimed.

A run whose parts differ from the recorded ones would mix outputs made with other settings, so
it is refused (`batchscore.output.claim`) and told which parts changed. The parts are the job's
keys that decide the output (`task_options`), the model's files (`model_identity`), and what of
the model besides its files decides it (`model_parts`: its revision, and each adapter's own
parts, which the task table asks it for).

`model_identity` hashes what decides a model's outputs cheaply enough to run on every start-up:
configs and tokenizer files whole, weight files by size plus their first and last MiB. The model
is judged whole before its digest is taken: a file missing or unreadable is the model's error
naming it, never a file left out of the digest, nor a digest that differs and reads as other
settings.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchscore.errors import ModelError
from batchscore.job.sections import Job, ModelConfig
from batchscore.models.source.locate import PICKLE_SUFFIXES
from batchscore.models.tasks import TASKS, check_model, input_kinds
from batchscore.output.claim import Identity

WEIGHT_SUFFIXES = (".safetensors", *PICKLE_SUFFIXES)
SAMPLE_BYTES = 1 << 20


def fingerprint_parts(job: Job, model_path: Path, model_files: str | None = None) -> dict[str, Any]:
    """Everything that decides the output; a change means committed chunks no longer match.
    ``model_files``: the model's digest when it was read already."""
    return {
        "task": job.model.task,
        "task_options": task_options(job.options),
        "model": job.model.name or job.model.path,
        "model_files": model_files or model_identity(model_path),
        "precision": job.model.precision,
        "max_length": job.model.max_length or "model default",
        "columns": {
            # pairs, not a mapping: the order of feature columns matters
            "inputs": list(input_kinds(job.model.task, job.input, job.options).items()),
            "carried": list(job.input.carried),
        },
        "on_error": job.output.on_error,
        "chunk_rows": job.output.chunk_rows,
        # only when set, so outputs made before the key existed still resume
        **({"where": job.input.where} if job.input.where is not None else {}),
        **({"usage": True} if job.output.usage else {}),  # its columns are in the schema
        # a folder's files are a table's or not: a Parquet folder never turns into a Delta table
        **({"format": job.output.format} if job.output.format != "parquet" else {}),
        **({"increments": "rows"} if job.input.by_rows else {}),
        **model_parts(job.model, model_path, job.options),
    }


def identity(job: Job, model_path: Path) -> Identity:
    """The job's identity for its output folder: inputs and fingerprint, as JSON records them,
    with each of the model's files (recorded beside the fingerprint, so a later run names a
    file that went missing). `ModelError` for a model file that cannot be read, or a model that
    lacks a file it needs (its weights, its config), as loading it would say."""
    files = read_model_files(model_path)
    model, task = job.model, job.model.task
    check_model(task, model_path, options=job.options, allow_pickle=model.allow_pickle)
    parts = fingerprint_parts(job, model_path, files.digest)
    parts = json.loads(json.dumps(parts, default=str))
    return Identity(
        job.name,
        str(job.source),
        list(job.input.path),
        parts,
        files=files.each,
        model_path=str(model_path),
    )


def task_options(options: Any) -> dict[str, Any]:
    """The task section as the fingerprint records it: a prompt by its text (`model_parts`),
    not its name; a key added after folders were first written (`WHEN_SET`) only when it is
    set away from its default, so those folders still resume under a newer batchscore."""
    values = dataclasses.asdict(options)
    return {
        f.name: values[f.name]
        for f in dataclasses.fields(options)
        if f.name != "prompt_name"
        and not (
            f.metadata.get("fingerprint") == "when set" and getattr(options, f.name) == f.default
        )
    }


def model_parts(model: ModelConfig, path: Path, options: Any) -> dict[str, Any]:
    """What decides the output besides the model's files: the revision, how long texts are
    read, and the task's own parts (an encoder's stack and prompt). Each is recorded only when
    it is there, so outputs made before batchscore read them still resume."""
    parts: dict[str, Any] = {}
    if model.revision is not None:
        parts["revision"] = model.revision
    if model.long_text != "truncate":
        parts["long_text"] = model.long_text
    return {**parts, **TASKS[model.task].fingerprint_parts(model, path, options)}


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
            "up or pruned, or a download cut short?); put the model's files back (`batchscore "
            "fetch NAME` downloads a hub model again where the network allows; runs never do)"
        )
    if exc.errno == errno.ENOENT:
        return ModelError(f"{file}: the model's file is gone (removed while it was being read)")
    hint = "; check its permissions" if exc.errno in (errno.EACCES, errno.EPERM) else ""
    return ModelError(f"{file}: cannot read the model's file: {exc.strerror or exc}{hint}")
