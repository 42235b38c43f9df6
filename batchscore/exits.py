"""Where errors become messages and exit statuses: the command line's boundary.

Library code raises the package's exceptions; here each becomes one clear message on stderr
(or one JSON log line) and the documented exit status, and SIGTERM and SIGHUP stop a run the
way Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from batchscore.errors import BatchscoreError

log = logging.getLogger("batchscore")


def json_logs() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().params.get("log_format") == "json")


def reports_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors into one clear message on stderr and the documented exit code
    (with ``--log-format json``, one JSON log line carrying the message and the code)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BatchscoreError as exc:
            if json_logs():
                extra = {"error": type(exc).__name__, "exit_code": exc.exit_code}
                log.error("%s", exc, extra=extra)
                sys.exit(exc.exit_code)
            lines = str(exc).splitlines() or [type(exc).__name__]
            click.echo(f"batchscore: error: {lines[0]}", err=True)
            for line in lines[1:]:
                click.echo(f"  {line}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            code, how = (128 + exc.signum, exc.name) if isinstance(exc, Stopped) else (130, "")
            message = f"{'stopped by ' + how if how else 'interrupted'}; committed chunks are kept"
            if json_logs():
                log.error(message, extra={"exit_code": code})
            else:
                click.echo(f"batchscore: {message}, the next run resumes", err=True)
            sys.exit(code)

    return wrapper


class Stopped(KeyboardInterrupt):
    """SIGTERM (what systemd, Kubernetes and `timeout` send) or SIGHUP, handled like Ctrl-C:
    the in-flight chunk is abandoned, the report and metrics are written, the lock released."""

    def __init__(self, signum: int) -> None:
        self.signum, self.name = signum, signal.Signals(signum).name
        super().__init__(self.name)


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise `Stopped` in the main thread (a second one
    waits for the clean-up the first started); the previous handlers come back after."""
    numbers = (signal.SIGTERM, signal.SIGHUP)

    def handler(signum: int, frame: object) -> None:
        for number in numbers:
            signal.signal(number, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {number: signal.signal(number, handler) for number in numbers}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)
