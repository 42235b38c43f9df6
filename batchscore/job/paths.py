"""Input and output never overlap: an output folder equal to, inside, or containing an input.

Checked when the job loads (so `validate` and `run` refuse it before anything is read or
written), on paths already resolved (``..`` and symlinks), and by prefix for object stores.
An output inside an input would be read back as input by the next run; an input inside the
output would be a file in a folder batchscore writes.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path, PurePosixPath

GLOB_CHARS = frozenset("*?[")


def has_glob(path: str) -> bool:
    return any(c in path for c in GLOB_CHARS)


def glob_root(pattern: str) -> str:
    """The folder a glob starts from: everything before the first component with a glob."""
    head = pattern[: min(pattern.index(c) for c in GLOB_CHARS if c in pattern)]
    return head.rsplit("/", 1)[0] or "/"


def is_within(inner: PurePosixPath, outer: PurePosixPath) -> bool:
    return inner == outer or outer in inner.parents


def reaches_into(pattern: str, folder: PurePosixPath) -> bool:
    """Whether a glob could match a file somewhere under ``folder``."""
    parts = PurePosixPath(pattern).parts
    if "**" in parts:  # any depth below the root: anything under the root may match
        return is_within(folder, PurePosixPath(glob_root(pattern)))
    inside = folder.parts
    # a file under the folder has more parts than the folder; the pattern must have as many
    return len(inside) < len(parts) and all(
        fnmatch.fnmatchcase(name, part) for name, part in zip(inside, parts, strict=False)
    )


def relation(entry: str, output: str) -> str | None:
    """How ``output`` overlaps the input ``entry`` ("the same as", "inside", "a folder
    containing"), or None when it does not."""
    if ("://" in entry) != ("://" in output):
        return None
    if "://" in entry:  # object stores: by key prefix
        root = (glob_root(entry) if has_glob(entry) else entry).rstrip("/")
        out = output.rstrip("/")
        if out == root:
            return "the same as"
        return (
            "inside"
            if out.startswith(root + "/")
            else ("a folder containing" if root.startswith(out + "/") else None)
        )
    out = PurePosixPath(Path(output).resolve())
    if has_glob(entry):
        root = PurePosixPath(Path(glob_root(entry)).resolve())
        if is_within(root, out):
            return "the same as" if root == out else "a folder containing"
        return "inside" if reaches_into(entry, out) else None
    path = PurePosixPath(Path(entry).resolve())
    if path == out:
        return "the same as"
    if is_within(out, path):
        return "inside"
    return "a folder containing" if is_within(path, out) else None


def names_input(entry: str, path: str) -> bool:
    """Whether ``path`` (a resolved file or URL) is one of the files the input entry names."""
    if has_glob(entry):
        return fnmatch.fnmatchcase(path, entry)
    return path == entry or path.startswith(entry.rstrip("/") + "/")


def overlap_problem(inputs: tuple[str, ...], output: str) -> str | None:
    """The first overlap between the job's inputs and its output folder, said for the user."""
    for entry in inputs:
        found = relation(entry, output)
        if found:
            return (
                f"[output].path: {output} is {found} the input {entry}; the next run would read "
                "its own output as input (or write among the input files). Point [output].path "
                "at a folder outside the input"
            )
    return None
