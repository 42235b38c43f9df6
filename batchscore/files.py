"""Reading and making files in places other users or processes can reach: an output folder's
bookkeeping, a shared cache folder, a node_exporter textfile folder.

By the time batchscore looks, such a place may hold anything: a symbolic link (a read would
read whatever it points to; a write, from a cron job run as root, would overwrite it), a FIFO
(an open waits for a writer that never comes, while the run holds its lock), a device
(``/dev/zero`` reads without end) or a file far larger than anything batchscore writes. So:

- a file there is read only through `read_shared`: opened without following a link and without
  waiting (``O_NOFOLLOW | O_NONBLOCK``), checked on the open descriptor to be a regular file
  (so nothing can be swapped in between the check and the read), and read up to a cap;
- a temporary file there is only ever made new, at a name nobody can plant anything at in
  advance (`create_temp`: ``O_CREAT | O_EXCL | O_NOFOLLOW``, a random part in the name), and
  published by `replace_durably`: written, fsynced, renamed over the final name (a rename
  replaces a link there, never what it points to), then the folder fsynced so that the rename
  itself survives a power cut.

Everything here raises `Refused` for what it will not touch and `OSError` for the rest; each
caller says what that means for it (a cache: a warning and a cold run; bookkeeping: the run
stops naming the file).
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
READ = os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
KINDS = {  # what a non-regular file is, for messages
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symbolic link",
}


class Refused(ValueError):
    """A file batchscore will not read: a symbolic link, not a regular file, or over its cap
    (or, for a caller that vets who may change it, another user's)."""

    def __init__(
        self, path: Path, problem: str, *, link: bool = False, vetted: bool = False
    ) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem
        self.link = link  # a symbolic link
        self.vetted = vetted  # refused by the caller's `vet`: someone else could change it


def not_regular(mode: int) -> str | None:
    """Why a file of ``mode`` is not read or written as a file (None: it is a regular file)."""
    if stat.S_ISREG(mode):
        return None
    return f"is {KINDS.get(stat.S_IFMT(mode), 'not a file')}, not a regular file"


def read_shared(
    path: Path, limit: int, vet: Callable[[os.stat_result], str | None] | None = None
) -> bytes | None:
    """``path``'s bytes, or None when there is nothing there (nor a folder to hold it).

    Raises:
        Refused: ``path`` is a symbolic link, not a regular file, holds more than ``limit``
            bytes, or ``vet`` (given the open file's `os.fstat`) names a problem.
        OSError: it could not be read for another reason (permissions, I/O).
    """
    try:
        fd = os.open(path, READ)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link: it is not opened
            raise Refused(path, "is a symbolic link", link=True) from None
        raise
    try:
        info = os.fstat(fd)
        problem = not_regular(info.st_mode)
        if problem:
            raise Refused(path, problem)
        if vet and (problem := vet(info)):
            raise Refused(path, problem, vetted=True)
        if info.st_size > limit:
            raise Refused(path, f"holds {info.st_size:,} bytes, more than the {limit:,} read")
        data = bytearray()
        while chunk := os.read(fd, min(limit + 1 - len(data), 1 << 20)):
            data += chunk
            if len(data) > limit:
                raise Refused(path, f"grew past the {limit:,} bytes read while it was read")
        return bytes(data)
    finally:
        os.close(fd)


def writable_by_others(info: os.stat_result, *, folder: bool) -> str | None:
    """Why someone other than this user and root could change the file or folder ``info``
    describes (None: nobody can). A folder whose sticky bit is set (``/tmp``) lets others add
    names but not replace this user's; a file or folder writable by the user's own private
    group (the group of the user's name, no one else in it: what a 002 umask makes) is not
    writable by others."""
    if hasattr(os, "geteuid") and info.st_uid not in (os.geteuid(), 0):
        return f"belongs to another user (uid {info.st_uid})"
    mode = info.st_mode
    if folder and mode & stat.S_ISVTX:
        return None
    if mode & stat.S_IWOTH:
        return f"is writable by every user (mode {stat.filemode(mode)})"
    if mode & stat.S_IWGRP and not private_group(info.st_gid):
        return f"is writable by group {group_name(info.st_gid)} (mode {stat.filemode(mode)})"
    return None


def private_group(gid: int) -> bool:
    """Whether ``gid`` is this user's own group: named as the user, and no one else in it."""
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == os.getegid() and group.gr_name == user and set(group.gr_mem) <= {user}


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def create_temp(final: Path) -> tuple[int, Path]:
    """A new, empty temporary file beside ``final`` (so a rename publishes it), open for
    writing, and its path: ``.NAME.<pid>.<random>.tmp``, hidden from listings and from
    node_exporter by the leading dot, made by this call and never through a link."""
    for _ in range(100):
        tmp = final.with_name(f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, CREATE, 0o644), tmp
        except FileExistsError:  # someone's file at this name: never touched, another name
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name beside it", str(final))


def write_all(fd: int, data: bytes | memoryview, *, durable: bool = True) -> None:
    """Write ``data`` whole to the open file and (``durable``) force it to disk."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    if durable:
        os.fsync(fd)


def write_new(path: Path, data: bytes | memoryview, *, durable: bool = True) -> None:
    """Make ``path`` (which must not exist: never a link, never someone's file) holding
    ``data``, fsynced unless not ``durable``, through one descriptor: a Python file object
    adds a stat, a terminal check and a seek to each of the thousands of small files a group
    commit writes."""
    fd = os.open(path, CREATE, 0o644)
    try:
        write_all(fd, data, durable=durable)
    finally:
        os.close(fd)


def stage_temp(final: Path, data: bytes | memoryview) -> Path:
    """A new temporary file beside ``final`` holding ``data``, fsynced (`create_temp`); removed
    again when writing it fails."""
    fd, tmp = create_temp(final)
    try:
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp


def fsync_dir(path: Path) -> None:
    """Force a folder's entries (renames, creations) to disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(final: Path, data: bytes | memoryview) -> None:
    """Atomically and durably replace ``final`` with ``data``: a new temporary file beside it,
    fsynced, renamed into place, the folder fsynced. An `OSError` leaves no temporary file."""
    tmp = stage_temp(final, data)
    try:
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(final.parent)
