"""Durable file primitives: publish by writing a temporary file, fsyncing it, then renaming.

A rename within one folder is atomic on POSIX, so a reader sees the old file or the new one,
never half of either; fsyncing the folder afterwards makes the rename itself survive a power cut.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from batchscore.errors import WriteError


def fsync_file(path: Path) -> None:
    """Force a file's data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Force a folder's entries (renames, creations) to disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path) -> None:
    """Atomically move a finished, fsynced temporary file into place and persist the rename."""
    os.replace(tmp, final)
    fsync_dir(final.parent)


def write_json(path: Path, data: Any) -> None:
    """Atomically replace ``path`` with ``data`` as JSON (temp, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        publish(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(path, exc) from exc


def write_error(path: Path | str, exc: OSError) -> WriteError:
    """A `WriteError` that says what failed and what the user can do about it."""
    hint = {
        errno.ENOSPC: "the disk is full; free space and run again",
        errno.EDQUOT: "the disk quota is exceeded; free space and run again",
        errno.EACCES: "permission denied; check the output folder's permissions",
        errno.EROFS: "the file system is read-only",
    }.get(exc.errno or 0, "run again once the cause is fixed")
    return WriteError(f"{path}: cannot write: {exc.strerror or exc}; {hint}")
