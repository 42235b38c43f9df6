"""One run per output folder at a time, with an OS lock that dies with its process.

``flock`` is released by the kernel when the holder exits, however it exits (SIGKILL included),
so there is never a stale lock to clean up; the file itself stays and only says who holds it.
The lock is a local file: for an output in an object store it lives on this machine (see
`batchscore.storage.objects`), so it keeps runs on one machine apart, not across machines.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from batchscore.errors import LockHeldError


@contextmanager
def hold_lock(path: Path, job_name: str, output: str | None = None) -> Iterator[None]:
    """Hold the lock at ``path`` for the block, or raise `LockHeldError` naming the holder.

    ``output`` names what the lock guards in the message (default: the folder above the
    lock's own folder, i.e. a local output folder).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeldError(
                f"{output or path.parent.parent}: another run of this job holds the lock "
                f"({describe_holder(fd)}); wait for it to finish, or stop it"
            ) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "job": job_name}
        holder["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def describe_holder(fd: int) -> str:
    """Who holds the lock, from what the holder wrote into the lock file."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return (
            f"pid {holder['pid']} on {holder['host']}, job {holder['job']}, "
            f"since {holder['started']}"
        )
    except (ValueError, KeyError, OSError):
        return "holder unknown"
