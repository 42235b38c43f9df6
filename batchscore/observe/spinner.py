"""A log handler for a terminal: while a slow step runs (a `stage` record has started and not
ended), a spinner line shows what it is and for how long; every other line prints above it.

Nothing here decides what to log: the library logs stage records (`observe.progress.stage`),
and the command line picks this handler when stderr is a terminal.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TextIO

FRAMES = "|/-\\"
CLEAR = "\r\033[K"  # back to the line's start, erase it


class SpinnerHandler(logging.StreamHandler):
    """Stage starts become a spinner line (not printed); other records print as usual."""

    def __init__(self, stream: TextIO, every_s: float = 0.1) -> None:
        super().__init__(stream)
        self.stages: list[tuple[str, float]] = []  # open stages, innermost last
        self.drawn = False
        self.every_s = every_s
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def handle(self, record: logging.LogRecord) -> bool:
        with self.lock:
            stage, phase = getattr(record, "stage", None), getattr(record, "phase", None)
            if phase == "start":
                self.stages.append((str(stage), time.monotonic()))
                self.redraw()
                self.start_thread()
                return True
            if phase == "end":
                found = [i for i, (s, _) in enumerate(self.stages) if s == stage]
                if found:
                    del self.stages[found[-1]]
        return super().handle(record)

    def emit(self, record: logging.LogRecord) -> None:
        self.clear()
        super().emit(record)
        self.redraw()

    def clear(self) -> None:
        if self.drawn:
            self.stream.write(CLEAR)
            self.drawn = False

    def redraw(self) -> None:
        """Draw the innermost open stage, if any (the caller holds the lock)."""
        self.clear()
        if self.stages:
            what, since = self.stages[-1]
            seconds = time.monotonic() - since
            frame = FRAMES[int(seconds / self.every_s) % len(FRAMES)]
            self.stream.write(f"{frame} {what} ({seconds:.0f} s)")
            self.stream.flush()
            self.drawn = True

    def start_thread(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self.spin, name="batchscore-spinner", daemon=True)
            self.thread.start()

    def spin(self) -> None:
        while not self.stop.wait(self.every_s):
            with self.lock:
                if self.stages:
                    self.redraw()

    def close(self) -> None:
        self.stop.set()
        with self.lock:
            self.clear()
        super().close()
