"""This user's private folder under the temp folder, for what an object-store output keeps on
this machine (its lock and staged files).

The temp folder is shared by every local user, and its path is predictable, so another user
could create it first: as their own folder (then they could plant a link where the lock goes,
and the run would write through it), or as a link to a folder of ours. Each level batchscore
makes is created 0700 and, made now or found, must be a real folder (not a link), owned by this
user and writable by nobody else; otherwise the run stops naming it, and touches nothing in it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from batchscore.errors import WriteError, write_error


def private_root() -> Path:
    """``$TMPDIR/batchscore-<uid>``: this user's folder of object-store outputs."""
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"batchscore-{uid}"


def private_folder(folder: Path) -> Path:
    """Create ``folder`` (under `private_root`) and its missing parents up to that root, each
    0700, and check every level from the root down; return ``folder``.

    Raises:
        WriteError: a level is a link, not a folder, someone else's, or writable by others.
    """
    root = private_root()
    levels = [root, *(p for p in reversed(folder.parents) if root in p.parents), folder]
    for level in dict.fromkeys(levels):
        try:
            with contextlib.suppress(FileExistsError):
                level.mkdir(mode=0o700)
        except OSError as exc:  # the temp folder itself unwritable, or full
            raise write_error(level, exc) from exc
        check_private(level)
    return folder


def check_private(folder: Path) -> None:
    """Refuse ``folder`` unless it is a real folder, this user's, writable by nobody else."""
    info = os.lstat(folder)
    problem = None
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a folder"
    elif hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        problem = f"belongs to another user (uid {info.st_uid})"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"is writable by other users (mode {stat.filemode(info.st_mode)})"
    if problem:
        raise WriteError(
            f"{folder}: {problem}; batchscore keeps an object-store output's lock and staged "
            "files there, so it stopped without touching it: remove it (it is made again, "
            "private), or point TMPDIR at a folder of your own"
        )
