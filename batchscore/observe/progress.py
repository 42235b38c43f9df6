"""Live progress: a tqdm bar on a terminal, a periodic log line elsewhere; the run's timeline
(rows, tokens and model time over wall time) for the report page; and `stage`, which says a
slow step (loading the model, the quality gate, int8 calibration) has begun and when it ends.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from batchscore.observe.streams import Guarded

log = logging.getLogger("batchscore")
MAX_POINTS = 240  # timeline points kept: enough for a smooth chart, small in the report JSON
ROUNDING = 1e-6  # thirds of a row that add up to 0.9999999 still make a whole row
FALLBACK_COLUMNS = 80
FALLBACK_ROWS = 20  # tqdm's own default, where the terminal says nothing


class Timeline:
    """Cumulative rows, tokens and model-busy seconds, sampled at most every `every_s` seconds.

    When the points fill up, every other one is dropped and the interval doubles, so a run of
    any length keeps between half and all of `MAX_POINTS`, evenly spread.
    """

    def __init__(self, busy: Callable[[], float], every_s: float = 0.5) -> None:
        self.busy, self.every_s = busy, every_s
        self.start = time.perf_counter()
        self.points: list[tuple[float, float, int, float]] = [(0.0, 0.0, 0, 0.0)]

    def sample(self, rows: float, tokens: int, force: bool = False) -> None:
        t = time.perf_counter() - self.start
        if not force and t - self.points[-1][0] < self.every_s:
            return
        self.points.append((t, rows, tokens, self.busy()))
        if len(self.points) > MAX_POINTS:
            self.points = [*self.points[:-1:2], self.points[-1]]  # the first and last stay
            self.every_s *= 2

    def to_json(self) -> dict[str, list[float]]:
        """Columns: ``t`` (seconds since scoring began), ``rows``, ``tokens``, ``busy_s``."""
        columns = zip(*self.points, strict=True)
        names = ("t", "rows", "tokens", "busy_s")
        return {n: [round(v, 3) for v in c] for n, c in zip(names, columns, strict=True)}


class Progress:
    """A tqdm bar on a terminal; elsewhere (cron, CI logs) a log line every `every_s` seconds.

    ``busy`` reads the model's busy seconds so far, for the timeline; log lines that arrive
    while the bar is drawn are printed above it instead of through it. ``delay_s``: the bar
    shows only once scoring has taken that long (a quick call says nothing).
    """

    def __init__(
        self,
        total_rows: int,
        mode: str,
        every_s: float = 10.0,
        busy: Callable[[], float] = lambda: 0.0,
        delay_s: float = 0.0,
    ) -> None:
        self.mode, self.every_s, self.total = mode, every_s, total_rows
        # a row scored as several units (sentences, windows) advances by fractions; the bar
        # and the log lines count whole rows, `shown` of them so far
        self.rows, self.tokens, self.shown = 0.0, 0, 0
        self.first_batch_at: float | None = None  # wall clock: when the first batch was scored
        self.start = self.last = time.perf_counter()
        self.timeline = Timeline(busy)
        self.redirect: contextlib.AbstractContextManager[Any] | None = None
        self.bar = None
        if mode == "bar":
            self.redirect = logging_redirect_tqdm()  # the root logger's console handler
            self.redirect.__enter__()
            # the stderr of a call from Python is the caller's, not guarded for the process
            # (`streams.guard`): a bar that cannot be drawn must not stop the scoring
            stream = sys.stderr
            stream = stream if isinstance(stream, Guarded) else Guarded(stream, "stderr")
            self.bar = tqdm(
                total=total_rows, unit="row", delay=delay_s, file=stream, **bar_width(stream)
            )

    def advance(self, rows: float, tokens: int) -> None:
        if self.first_batch_at is None and tokens:
            self.first_batch_at = time.time()
        self.rows += rows
        self.tokens += tokens
        self.timeline.sample(self.rows, self.tokens)
        now = time.perf_counter()
        rate = self.tokens / max(now - self.start, 1e-9)
        whole = min(math.floor(self.rows + ROUNDING), self.total)
        if self.bar is not None:
            self.bar.set_postfix_str(f"{rate:,.0f} tok/s", refresh=False)
            self.bar.update(whole - self.shown)
        elif self.mode == "log" and now - self.last >= self.every_s:
            self.last = now
            log.info(
                "%d/%d rows (%.1f%%), %.1f rows/s, %.0f tokens/s",
                whole,
                self.total,
                100 * whole / max(self.total, 1),
                whole / (now - self.start),
                rate,
            )
        self.shown = whole

    def close(self) -> None:
        self.timeline.sample(self.rows, self.tokens, force=True)
        if self.bar is not None:
            self.bar.close()
        if self.redirect is not None:
            self.redirect.__exit__(None, None, None)
            self.redirect = None


def bar_width(stream: TextIO) -> dict[str, Any]:
    """tqdm's width: the terminal's, followed as it is resized; or, on a terminal that reports
    no size (a serial console, some containers and CI runners, where tqdm would draw an empty
    line), a fixed `FALLBACK_COLUMNS`. The rows too: tqdm reads such a terminal as -1 rows high
    and then draws no bar at all."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        columns = 0
    if columns:
        return {"dynamic_ncols": True}
    return {"ncols": FALLBACK_COLUMNS, "nrows": FALLBACK_ROWS}


@contextlib.contextmanager
def stage(what: str, done: str, event: str | None = None, **fields: Any) -> Iterator[None]:
    """Log that a slow step begins (``what``) and, when it ends, ``done`` with its seconds.

    The two records carry ``stage``/``phase`` fields, which the terminal handler turns into a
    spinner for as long as the step runs (`batchscore.observe.logs`); elsewhere they are two
    plain lines. ``event`` names the end record's event for JSON logs ("model loaded").
    """
    log.info("%s ...", what, extra={"stage": what, "phase": "start", **fields})
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        log.debug(
            "%s: stopped after %.1f s",
            what,
            time.perf_counter() - start,
            extra={"stage": what, "phase": "end"},
        )
        raise
    seconds = round(time.perf_counter() - start, 3)
    extra = {"stage": what, "phase": "end", "seconds": seconds, **fields}
    if event:
        extra["event"] = event
    log.info("%s in %.1f s", done, seconds, extra=extra)
