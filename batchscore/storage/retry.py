"""Transient I/O errors are retried, with bounded exponential backoff, before the run gives up.

An error is transient when it says nothing about the data: a local errno such as EIO or a
timeout, or an object store's network, throttling or server error (which pyarrow reports
without an errno). Corrupt data, a missing key or a denied request is never retried. One
`Retry` serves a run: it counts the retries for the run report. An output store gives up
through `GiveUp`: a transient error that outlasts the retries stops the run with the package's
`TransientIOError` (exit 7: run again later) naming the URL, never a bare `OSError`.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from batchscore.errors import TransientIOError

log = logging.getLogger("batchscore")
T = TypeVar("T")
TRANSIENT = {
    errno.EIO, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED,
    errno.ENETDOWN, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ESTALE, errno.EINTR,
}  # fmt: skip
# object-store errors that a retry will not fix: the object is gone or may not be read
STORE_DATA_ERRORS = ("ACCESS_DENIED", "NO_SUCH_KEY", "NO_SUCH_BUCKET", "RESOURCE_NOT_FOUND")


def is_transient(exc: BaseException) -> bool:
    """An I/O error that says nothing about the data (see the module docstring)."""
    if not isinstance(exc, OSError):
        return False
    if exc.errno in TRANSIENT:
        return True
    text = str(exc)
    return "AWS Error" in text and not any(s in text for s in STORE_DATA_ERRORS)


class Retry:
    """Bounded exponential backoff for transient errors: ``attempts`` tries in all, waiting
    ``first_delay_s``, then twice that, and so on between them."""

    def __init__(self, attempts: int = 5, first_delay_s: float = 0.5) -> None:
        self.attempts, self.first_delay_s = attempts, first_delay_s
        self.count = 0  # retries so far, for the run report (from any thread)
        self.lock = threading.Lock()

    def __getstate__(self) -> dict:
        """Pickled (for a Ray actor) without its lock; the copy counts its own retries."""
        return {"attempts": self.attempts, "first_delay_s": self.first_delay_s, "count": 0}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()

    def again(self, exc: BaseException, attempt: int, what: str) -> bool:
        """After failed try number ``attempt`` (from 1): wait and return True to try again,
        or False when the error is not transient or the tries are used up."""
        if not is_transient(exc) or attempt >= self.attempts:
            return False
        with self.lock:
            self.count += 1
        delay = self.first_delay_s * 2 ** (attempt - 1)
        log.warning(
            "%s: %s; retrying in %.1f s (try %d of %d)",
            what,
            exc,
            delay,
            attempt + 1,
            self.attempts,
        )
        time.sleep(delay)
        return True

    def call(self, fn: Callable[[], T], what: str) -> T:
        """``fn()``, tried again on transient errors."""
        attempt = 1
        while True:
            try:
                return fn()
            except OSError as exc:
                if not self.again(exc, attempt, what):
                    raise
                attempt += 1


class GiveUp:
    """A run's `Retry` for one output store: the same tries (counted in the run's `Retry`),
    then a transient error that outlasted them becomes `TransientIOError` naming the URL. Any
    other error passes as it is, for the caller to judge (a missing file, a denied request)."""

    def __init__(self, retry: Retry) -> None:
        self.retry = retry

    def call(self, fn: Callable[[], T], what: str) -> T:
        """``fn()``, tried again on transient errors; ``what`` is the URL it works on."""
        try:
            return self.retry.call(fn, what)
        except OSError as exc:
            if not is_transient(exc):
                raise
            raise TransientIOError(
                f"{what}: the object store did not answer after {self.retry.attempts} tries "
                f"({exc}); nothing was lost: run again once it is reachable"
            ) from exc
