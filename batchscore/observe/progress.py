"""Live progress: a tqdm bar on a terminal, a periodic log line elsewhere; the run's timeline
(rows, tokens and model time over wall time) for the report page; and `stage`, which says a
slow step (loading the model, the quality gate, int8 calibration) has begun and when it ends.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

log = logging.getLogger("batchscore")
MAX_POINTS = 240  # timeline points kept: enough for a smooth chart, small in the report JSON


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
        self.rows, self.tokens = 0.0, 0
        self.first_batch_at: float | None = None  # wall clock: when the first batch was scored
        self.start = self.last = time.perf_counter()
        self.timeline = Timeline(busy)
        self.redirect: contextlib.AbstractContextManager[Any] | None = None
        self.bar = None
        if mode == "bar":
            self.redirect = logging_redirect_tqdm()  # the root logger's console handler
            self.redirect.__enter__()
            self.bar = tqdm(total=total_rows, unit="row", dynamic_ncols=True, delay=delay_s)

    def advance(self, rows: float, tokens: int) -> None:
        if self.first_batch_at is None and tokens:
            self.first_batch_at = time.time()
        self.rows += rows
        self.tokens += tokens
        self.timeline.sample(self.rows, self.tokens)
        now = time.perf_counter()
        rate = self.tokens / max(now - self.start, 1e-9)
        if self.bar is not None:
            self.bar.update(rows)
            self.bar.set_postfix_str(f"{rate:,.0f} tok/s", refresh=False)
        elif self.mode == "log" and now - self.last >= self.every_s:
            self.last = now
            log.info(
                "%.0f/%d rows (%.1f%%), %.1f rows/s, %.0f tokens/s",
                self.rows,
                self.total,
                100 * self.rows / max(self.total, 1),
                self.rows / (now - self.start),
                rate,
            )

    def close(self) -> None:
        self.timeline.sample(self.rows, self.tokens, force=True)
        if self.bar is not None:
            self.bar.close()
        if self.redirect is not None:
            self.redirect.__exit__(None, None, None)
            self.redirect = None


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
