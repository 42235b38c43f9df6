"""One run per output folder at a time, with an OS lock that dies with its process.

``flock`` is released by the kernel when the holder exits, however it exits (SIGKILL included),
so there is never a stale lock to clean up; the file itself stays and only says who holds it.
The lock is a local file: for an output in an object store it lives on this machine (see
`batchscore.storage.objects`), so it keeps runs on one machine apart, not across machines.

The lock file is opened without following a link (``O_NOFOLLOW``, its folder too) and must be
a plain file with no other name: a link or a hard link planted where it goes would otherwise
make the run write into the file it points to. What the holder writes replaces the file's
content only when batchscore made the file, or the file holds nothing but an earlier holder's
record; anything else there is left as it is, and the run stops naming it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from batchscore.errors import LockHeldError, WriteError, write_error

OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
RECORD = b'{"pid": '  # how every holder's record starts (`json.dumps` of `holder`)
RECORD_BYTES = 4096  # a record is a line of JSON: a lock file past this is not one


@contextmanager
def hold_lock(path: Path, job_name: str, output: str | None = None) -> Iterator[None]:
    """Hold the lock at ``path`` for the block, or raise `LockHeldError` naming the holder.

    ``output`` names what the lock guards in the message (default: the folder above the
    lock's own folder, i.e. a local output folder). Raises `WriteError` when something other
    than a lock file batchscore made is where the lock goes.
    """
    fd, made = open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeldError(
                f"{output or path.parent.parent}: another run of this job holds the lock "
                f"({describe_holder(fd)}); wait for it to finish, or stop it"
            ) from None
        if not made and not is_record(fd):
            raise not_a_lock(path, "holds something other than a lock record")
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "job": job_name}
        holder["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.ftruncate(fd, 0)  # ours: made now, or an earlier holder's record
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def open_lock(path: Path) -> tuple[int, bool]:
    """The lock file open for reading and writing, and whether this call made it; never
    through a link, and only a plain file with no other name (`WriteError` otherwise)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EEXIST, errno.ENOTDIR):
            link = os.path.islink(path.parent)
            what = "is a symbolic link" if link else "is not a folder"
            raise not_a_lock(path.parent, what) from None
        raise write_error(path, exc) from exc
    try:
        fd, made = open_in(folder, path)
    finally:
        os.close(folder)
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "is not a plain file"
    elif info.st_nlink != 1:
        problem = "is a hard link: the file has another name too"
    if problem:
        os.close(fd)
        raise not_a_lock(path, problem)
    return fd, made


def open_in(folder: int, path: Path) -> tuple[int, bool]:
    """Open the lock file ``path.name`` in the open ``folder``: made new (exclusively), else
    the one there; never a link."""
    while True:
        try:
            return os.open(path.name, OPEN | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=folder), True
        except FileExistsError:
            pass
        except OSError as exc:
            raise write_error(path, exc) from exc
        try:
            return os.open(path.name, OPEN | os.O_NONBLOCK, dir_fd=folder), False
        except FileNotFoundError:
            continue  # removed in between: make it
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise not_a_lock(path, "is a symbolic link") from None
            if exc.errno == errno.EISDIR:
                raise not_a_lock(path, "is not a plain file") from None
            raise write_error(path, exc) from exc


def is_record(fd: int) -> bool:
    """Whether the open lock file holds a holder's record, or nothing (a holder killed before
    it wrote one, or a file system that lost it); a file past `RECORD_BYTES` holds neither."""
    if os.fstat(fd).st_size > RECORD_BYTES:
        return False
    content = os.pread(fd, RECORD_BYTES, 0)
    return content.startswith(RECORD) or not content.strip(b"\0 \n")


def not_a_lock(path: Path, problem: str) -> WriteError:
    return WriteError(
        f"{path}: {problem}; it is where this job's lock goes, and batchscore never writes "
        "through a link nor into a file it did not make, so it stopped and left it as it is: "
        "remove it and run again"
    )


def describe_holder(fd: int) -> str:
    """Who holds the lock, from what the holder wrote into the lock file."""
    try:
        holder = json.loads(os.pread(fd, RECORD_BYTES, 0) or b"{}")
        return (
            f"pid {holder['pid']} on {holder['host']}, job {holder['job']}, "
            f"since {holder['started']}"
        )
    except (ValueError, KeyError, OSError):
        return "holder unknown"
