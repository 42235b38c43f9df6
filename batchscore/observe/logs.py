"""Log lines for people (``batchscore: ...``) or for log collectors (one JSON object a line).

A run's stage events (``event``: start, model loaded, precision chosen, shard committed, run
finished) carry the job's name and the run's id (`run_context`). JSON logs carry every event,
whatever the level; text shows the routine ones (a shard committed, the run's choices and
their reasons) only with ``-v``; ``-q`` leaves warnings and errors alone, in either format.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

from batchscore.observe.spinner import SpinnerHandler

# LogRecord attributes that are not extra fields a caller attached
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "detail"}
log = logging.getLogger("batchscore")
LINE_BREAK = re.compile(r"\r\n|\r|\n")


def json_entry(
    message: str, *, level: str = "info", created: float | None = None, **fields: Any
) -> dict[str, Any]:
    """One JSON log line's object: ``{"time", "level", "logger", "message", ...fields}``, the
    shape every line of a JSON log has, a command's result on stdout included."""
    created = time.time() if created is None else created
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return {
        "time": f"{stamp}.{int(created * 1000) % 1000:03d}Z",
        "level": level,
        "logger": "batchscore",
        "message": message,
        **fields,
    }


def json_line(message: str, **fields: Any) -> str:
    """`json_entry` as one line of text (values JSON cannot hold are written as strings)."""
    return json.dumps(json_entry(message, **fields), default=str)


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ...extra}``: what Loki, Fluent Bit or
    CloudWatch parse without a custom pattern."""

    def format(self, record: logging.LogRecord) -> str:
        entry = json_entry(
            record.getMessage(), level=record.levelname.lower(), created=record.created
        )
        entry["logger"] = record.name
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class JsonLines(io.TextIOBase):
    """A text stream through which every line comes out one JSON object: a line that is one
    already (a batchscore log line, a command's result) as it is, any other as a log line of
    ``level`` that carries it as its ``message``.

    With ``--log-format json`` it stands in for sys.stderr and sys.stdout, for what other
    libraries write there themselves: transformers logs through its own handler (it stops
    its records reaching ours), a library may print. Writes that bypass Python (C code
    writing to the file descriptor) are not seen.
    """

    def __init__(self, stream: TextIO, level: str, logger: str) -> None:
        super().__init__()
        self.stream, self.level, self.logger = stream, level, logger
        self.partial = ""  # text after the last line break, until its line ends
        self.turn = threading.Lock()

    @property
    def encoding(self) -> str:  # type: ignore[override]  # click writes text here only if set
        return "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "strict"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False  # no bar, no spinner, no colour: JSON lines only

    def fileno(self) -> int:
        return self.stream.fileno()

    def write(self, text: str) -> int:
        with self.turn:
            # a carriage return ends a line too: a bar redrawn in place is one line each time
            *lines, self.partial = LINE_BREAK.split(self.partial + text)
            for line in lines:
                if line.strip():
                    self.stream.write(self.as_json(line) + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def as_json(self, line: str) -> str:
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                if isinstance(json.loads(line), dict):
                    return line
        return json_line(line.rstrip(), level=self.level, logger=self.logger)


def json_streams(on: bool) -> None:
    """Put `JsonLines` in front of sys.stdout and sys.stderr (``on``), or take it away."""
    for name, level in (("stdout", "info"), ("stderr", "warning")):
        stream = getattr(sys, name)
        inner = stream.stream if isinstance(stream, JsonLines) else stream
        setattr(sys, name, JsonLines(inner, level, name) if on else inner)


class Threshold(logging.Filter):
    """batchscore's records at ``level`` and above, less those marked ``detail`` unless at
    debug level; and for JSON every stage event, whatever its level, unless quiet (``level``
    above INFO: warnings and errors only)."""

    def __init__(self, level: int, events: bool) -> None:
        super().__init__()
        self.level, self.events = level, events

    def filter(self, record: logging.LogRecord) -> bool:
        if self.events and self.level <= logging.INFO and hasattr(record, "event"):
            return True
        if getattr(record, "detail", False) and self.level > logging.DEBUG:
            return False  # routine detail (a shard committed): text shows it with -v only
        return record.levelno >= self.level


def setup_logging(level: int, fmt: str, terminal: bool = False) -> None:
    """Log to stderr at ``level`` (DEBUG with ``-v``, INFO, WARNING with ``-q``), as text or
    JSON lines; on a terminal, text shows a spinner while a slow step runs. Python warnings
    (a library's ``UserWarning``) go through the same handler, and what other libraries
    write to stdout and stderr themselves passes through `JsonLines`, so a JSON log holds no
    line that is not JSON. Called again (an option given after the command), it replaces its
    handler."""
    json_streams(fmt == "json")
    handler = SpinnerHandler(sys.stderr) if terminal and fmt != "json" else None
    handler = handler or logging.StreamHandler(sys.stderr)
    text = logging.Formatter("batchscore: %(message)s")
    handler.setFormatter(JsonFormatter() if fmt == "json" else text)
    root = logging.getLogger()
    for old in root.handlers:
        old.close()
    root.handlers[:] = [handler]
    # other libraries' INFO is their chatter ("Loaded FileIO"): shown with -v only
    root.setLevel(level if level <= logging.DEBUG else max(level, logging.WARNING))
    logging.captureWarnings(True)
    # batchscore logs its events at any level; the filter decides which are shown
    log.setLevel(logging.DEBUG)
    log.filters[:] = [f for f in log.filters if not isinstance(f, Threshold)]
    log.addFilter(Threshold(level, events=fmt == "json"))


@contextlib.contextmanager
def run_context(**fields: Any) -> Iterator[None]:
    """Every batchscore record logged within (from any thread) carries these fields."""

    def add(record: logging.LogRecord) -> bool:
        for key, value in fields.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True

    log.addFilter(add)
    try:
        yield
    finally:
        log.removeFilter(add)


class SlowSteps(logging.Handler):
    """Says each slow step (a `stage`: loading the model, the quality gate, calibration) once
    it has run ``after_s`` seconds, and then when it ended; quick steps pass unsaid. Warnings and
    errors are said at once, as Python says them when nothing else logs."""

    def __init__(self, after_s: float, stream: TextIO) -> None:
        super().__init__(logging.INFO)
        self.after_s, self.stream = after_s, stream
        self.pending: dict[str, threading.Timer] = {}
        self.said: set[str] = set()
        self.turn = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.say(record.getMessage())
            return
        stage, phase = getattr(record, "stage", None), getattr(record, "phase", None)
        if stage is None:
            return
        with self.turn:
            if phase == "start":
                timer = threading.Timer(self.after_s, self.begun, (stage, record.getMessage()))
                timer.daemon = True
                self.pending[stage] = timer
                timer.start()
            elif phase == "end":
                timer = self.pending.pop(stage, None)
                if timer is not None:
                    timer.cancel()
                if stage in self.said:
                    self.said.discard(stage)
                    self.say(record.getMessage())

    def begun(self, stage: str, message: str) -> None:
        with self.turn:
            if self.pending.pop(stage, None) is not None:  # not ended meanwhile
                self.said.add(stage)
                self.say(message)

    def say(self, message: str) -> None:
        """Said if stderr takes it: one that cannot (a pipe whose reader left, a full disk, a
        program started without stderr) never stops the caller's call."""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.stream.write(f"batchscore: {message}\n")
            self.stream.flush()

    def close(self) -> None:
        with self.turn:
            for timer in self.pending.values():
                timer.cancel()
            self.pending.clear()
        super().close()


@contextlib.contextmanager
def slow_steps(after_s: float = 1.0, stream: TextIO | None = None) -> Iterator[bool]:
    """While a call from Python runs (`batchscore.score` in a notebook), say on ``stream``
    (stderr) each step that takes longer than ``after_s``, unless the program has set up
    logging itself: then its handlers and levels decide. Yields whether it is saying."""
    if log.hasHandlers():
        yield False
        return
    handler, level = SlowSteps(after_s, stream or sys.stderr), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield True
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        handler.close()
