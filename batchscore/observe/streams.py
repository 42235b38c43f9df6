"""The standard streams of a batchscore command: what it writes to stdout and stderr may fail
(a closed descriptor, ``>&-``; a full disk, ``> /dev/full``; a pipe whose reader left, ``|
head -1``), and such a failure must never stop the work: a log line or a progress bar that
cannot be written in the middle of a run must not keep its commits from completing.

`guard` puts a `Guarded` stream in front of each: a write or flush that fails is remembered and
the stream given up (later writes are dropped), so nothing that writes there, batchscore's
logs, tqdm's bar, a library's print, ever raises. `answered` then turns what became of stdout
into the exit status (docs/commands.md#when-stdout-or-stderr-fails): the work's own status,
unless the command's product, what it prints, did not reach its reader; and `leave` ends
the process with it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import sys
from dataclasses import dataclass
from typing import NoReturn, TextIO

from batchscore.errors import BROKEN_PIPE, WRITE_FAILED
from batchscore.observe.logs import json_line


class Guarded(io.TextIOBase):
    """A standard stream whose failures are remembered, never raised: the first write or flush
    that fails (the first write, where the descriptor was closed when the process started and
    ``stream`` is None) sets `failure`, and from then on what is written is dropped.
    `carries`: the command's product was written here (`batchscore.exits.deliver`), so losing
    it is the command's failure. ``owned``: the process's own stream (`guard`), whose
    descriptor may be redirected; a bar drawn on the stderr of a program that called
    batchscore leaves that program's descriptor alone."""

    def __init__(self, stream: TextIO | None, name: str, owned: bool = False) -> None:
        super().__init__()
        self.stream, self.name, self.owned = stream, name, owned
        self.failure: OSError | None = None
        self.carries = False

    @property
    def encoding(self) -> str:  # type: ignore[override]  # click writes text here only if set
        return getattr(self.stream, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "errors", None) or "strict"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        with contextlib.suppress(OSError, ValueError):
            return self.stream is not None and self.stream.isatty()
        return False

    def fileno(self) -> int:
        if self.stream is None:
            raise io.UnsupportedOperation(f"{self.name} was closed when the command started")
        return self.stream.fileno()

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # as a text file says it: click asks, telling text from bytes
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self.failure is None:
            try:
                if self.stream is None:
                    raise closed()
                self.stream.write(text)
            except (OSError, ValueError) as exc:
                self.give_up(exc)
        return len(text)

    def flush(self) -> None:
        if self.failure is None and self.stream is not None:
            try:
                self.stream.flush()
            except (OSError, ValueError) as exc:
                self.give_up(exc)

    def give_up(self, exc: OSError | ValueError) -> None:
        """Remember why, and point the descriptor at /dev/null: the text the stream still
        buffers would fail again when the interpreter flushes it at exit (Python's own advice:
        the note on SIGPIPE in the `signal` module's documentation)."""
        self.failure = exc if isinstance(exc, OSError) and exc.errno else closed()
        if not self.owned:
            return
        with contextlib.suppress(OSError, ValueError, AttributeError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.stream.fileno())  # type: ignore[union-attr]
            os.close(null)


def closed() -> OSError:
    """The failure of a stream that was closed (``>&-``) or closed under the writer."""
    return OSError(errno.EBADF, os.strerror(errno.EBADF))


@dataclass(frozen=True)
class Standard:
    """The process's guarded stdout and stderr."""

    stdout: Guarded
    stderr: Guarded


def guard() -> Standard:
    """Reserve descriptors 0, 1 and 2, and put a `Guarded` stream in front of sys.stdout and
    sys.stderr (once: called again, it returns the guards in place)."""
    reserve_descriptors()
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, Guarded):
            setattr(sys, name, Guarded(stream, name, owned=True))
    return Standard(sys.stdout, sys.stderr)  # type: ignore[arg-type]


def reserve_descriptors() -> None:
    """Open /dev/null as each of descriptors 0, 1 and 2 that was closed when the process
    started (``>&-``; Python then sets sys.stdout to None): else the next file the command
    opens (a data file, a checkpoint) takes that number, and what a C library writes to
    "stderr" (a warning) lands in it. As coreutils do (gnulib's stdopen)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)  # inheritable, as a standard descriptor is
                os.close(null)
            else:
                os.set_inheritable(fd, True)


def answered(code: int, streams: Standard, json: bool) -> int:
    """The exit status, once stdout is flushed: the work's own ``code``, unless the command's
    product did not reach its reader and the work had nothing worse to say (``code`` 0):
    `BROKEN_PIPE` (141) where the reader left (a pipe closed, as ``| head -1`` closes it; said
    nowhere, as a command killed by SIGPIPE says nothing), `WRITE_FAILED` (74) where stdout
    could not be written (closed, a full disk), said on stderr. A command whose work is files
    (`run`) keeps its status whatever became of its summary: a warning says it was lost. A
    failing stderr changes nothing: the status still tells."""
    sys.stdout.flush()  # what is still buffered goes now, so that its failure is known
    failure = streams.stdout.failure
    if failure is None:
        return code
    lost, status = streams.stdout.carries, code  # the work's own failure says more
    if lost and code == 0:
        status = BROKEN_PIPE if failure.errno == errno.EPIPE else WRITE_FAILED
    if failure.errno != errno.EPIPE:  # a reader that left asked for no more: nothing to say
        said = f"write error on stdout: {failure.strerror or os.strerror(failure.errno or 0)}"
        level = "error" if lost else "warning"
        if json:
            line = json_line(said, level=level, error=type(failure).__name__, exit_code=status)
        else:
            lost_what = "" if lost else " (what the command said there is lost; its work is not)"
            line = f"batchscore: {level}: {said}{lost_what}"
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    return status


def leave(done: SystemExit, streams: Standard | None = None, json: bool = False) -> NoReturn:
    """End the process with the command's exit status, without tearing the interpreter down:
    the work's status, unless the command's product did not reach stdout's reader
    (`answered`, with ``streams`` the process's guarded stdout and stderr; ``json``: the
    command line asked for JSON logs, so what it says of that is one JSON line).

    With torch, pyarrow and polars loaded, the teardown (every module's objects freed, one by
    one) takes 0.4 s on a 2-core Xeon: a seventh of an increment by rows over a million rows
    (BENCHMARKS.md). Nothing of the output waits on it: a command commits every file
    (or leaves it for the next start) before it returns, as the folder survives a SIGKILL at
    any moment; the log's handlers and the standard streams are flushed here. Where Ray was
    started, or the status is a message rather than a number, Python exits as usual.
    """
    code = done.code
    if streams is not None and (code is None or isinstance(code, int)):
        code = answered(code or 0, streams, json)
        done = SystemExit(code)
    if "ray" in sys.modules or not (code is None or isinstance(code, int)):
        raise done
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # guarded (`streams`); a test's own may fail
            stream.flush()
    os._exit(code or 0)
