"""Named fault points, for the fault-injection tests only.

Library code calls `hit("after-rename")` at each step of the commit protocol and in the model
loop. Nothing happens unless a test armed that point: in-process with `armed(...)`, or in a
subprocess through the ``BATCHSCORE_FAULTS`` variable, which only the CLI entry point reads
and passes to `arm`. A spec is ``point[@n]:action`` (comma-separated for several): on the n-th
hit of ``point`` (every hit when ``@n`` is absent), do ``action``:

- ``kill``: SIGKILL this process (a crash: no cleanup, no flush);
- ``stop``: SIGSTOP this process, so a test can act at a known point (send a signal, change
  the input) before it sends SIGCONT, however fast the machine would otherwise have finished;
- ``enospc`` / ``eacces`` / ``eio`` / ``epipe``: raise that OSError (disk full, permission,
  transient I/O, a pipe or socket whose reader left);
- ``oom``: raise ``torch.OutOfMemoryError``; ``oom>N``: only for batches over N padded tokens;
- ``sleep=S``: wait S seconds (a slow model, a slow disk), then go on.

`traced` counts every point a block passes, arming nothing: a test runs the next step once so
traced on a copy of its folder, then kills the real step at a hit it will really make (a kill
armed at a point the step never reaches would end as a normal run and pass unnoticed).
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

POINTS = (
    "after-temp-write",  # chunk rows written to the temporary file, not yet fsynced
    "after-fsync",  # temporary file durable, not yet renamed
    "after-rename",  # data file in place, no commit record yet
    "after-table-commit",  # format "delta": the data files are in the table, no record yet
    "before-record",  # about to write the commit record
    "after-record",  # chunk committed
    "write-chunk",  # while appending rows to the temporary file
    "write-record",  # while writing a commit record
    "read-window",  # while reading input rows
    "model-batch",  # before each model call
    "gate-batch",  # before each model call on the quality gate's sample (`static.run_sample`)
    "retire-move",  # after each file a retirement moves out of the data files (see output.retire)
    "rewrite",  # by rows: a file rewritten without its retired rows, its record not yet written
    "rewrite-table",  # by rows into Delta: the table swapped the old file for the new, no record
    "rewrite-record",  # by rows into Delta: the new record written, the old one and file not gone
    "restart-unrecorded",  # --restart: commit records removed, data files not yet
    "remove",  # before each file batchscore deletes (see output.checkpoint.Checkpoint.remove)
    "restart-remove",  # --restart: before each file it removes, once the records are gone
)
ERRORS = {"enospc": errno.ENOSPC, "eacces": errno.EACCES, "eio": errno.EIO, "epipe": errno.EPIPE}


@dataclass
class Fault:
    action: str
    nth: int | None = None
    over: int | None = None
    hits: int = 0
    seconds: float = 0.0


_armed: dict[str, Fault] = {}
_traced: list[Counter[str]] = []  # the counts of an open `traced` block, if any
_tracing = threading.Lock()  # points are hit from the reader, model and writer threads


def parse(spec: str) -> dict[str, Fault]:
    """Parse ``point[@n]:action,...``; unknown points and actions are errors (a typo'd test
    must fail, not silently pass)."""
    faults = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        where, _, action = item.partition(":")
        point, _, nth = where.partition("@")
        over, seconds = None, 0.0
        if action.startswith("oom>"):
            action, over = "oom", int(action[4:])
        if action.startswith("sleep="):
            action, seconds = "sleep", float(action[6:])
        if point not in POINTS or action not in ("kill", "stop", "oom", "sleep", *ERRORS):
            raise ValueError(f"bad fault spec {item!r}; points: {', '.join(POINTS)}")
        faults[point] = Fault(action, int(nth) if nth else None, over, seconds=seconds)
    return faults


def arm(spec: str) -> None:
    """Arm the faults of ``spec`` for the rest of this process."""
    _armed.clear()
    _armed.update(parse(spec))


@contextmanager
def armed(spec: str) -> Iterator[None]:
    """Arm faults for a block (in-process tests)."""
    arm(spec)
    try:
        yield
    finally:
        _armed.clear()


@contextmanager
def traced() -> Iterator[Counter[str]]:
    """Count the hits of every point in a block (in this process), by point."""
    counts: Counter[str] = Counter()
    _traced.append(counts)
    try:
        yield counts
    finally:
        _traced.remove(counts)


def hit(point: str, tokens: int = 0) -> None:
    """Fire the fault armed at ``point``, if any; a no-op dictionary lookup otherwise."""
    if _traced:
        with _tracing:
            for counts in _traced:
                counts[point] += 1
    fault = _armed.get(point)
    if fault is None:
        return
    fault.hits += 1
    if fault.nth is not None and fault.hits != fault.nth:
        return
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    if fault.action == "sleep":
        time.sleep(fault.seconds)
        return
    if fault.action == "oom":
        if fault.over is None or tokens > fault.over:
            import torch

            raise torch.OutOfMemoryError(f"simulated out of memory at {point} ({tokens} tokens)")
        return
    code = ERRORS[fault.action]
    raise OSError(code, f"{os.strerror(code)} (simulated at {point})")
