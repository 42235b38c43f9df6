"""How many rows the next window takes, so that the model scores one in a share of
`[output].commit_s`.

A window's rows are sorted by length across its chunks, so none of its chunks is complete, or
can be committed, until the model has scored most of it: a window that takes longer than
``commit_s`` would hold every row it has past its commit bound, however small the chunks. The
model's thread measures how many input rows a second it scores (`took`); the reader sizes each
new window to a quarter of ``commit_s`` at that pace (`rows`), never past
`[batching].window_rows`. Before the first window is measured, a window holds one batch's
worth of rows (`[batching].max_rows`): the model's pace is not known yet. The reader then waits
for the model's first batch of it (`took`: the pace is known within a batch) before it sizes the
next: a reader running ahead with unmeasured windows cut every window of a short job to one
batch's worth of rows, sorted among themselves only (twice the batches, 8 % slower, at 3,640
texts).

A fast model keeps the full window (at the default 300 s, any model over 110 rows a second
keeps 8,192); a slow one (generation on a CPU) sorts fewer rows together, and commits on time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

SHARE = 4  # a window is sized to take commit_s / SHARE (the committer cuts at half: see there)
POLL_S = 0.05  # how often a waiting reader looks whether it was told to stop


@dataclass
class Pace:
    """The model's measured pace, shared by the model's thread (which measures) and the
    reader's (which sizes windows by it): one float, written whole, and an event for the
    window sized before it was known."""

    commit_s: float
    first: int  # the rows of a window before any is measured
    rate: float | None = None  # input rows a second, over the last window (or its first batch)
    stop: threading.Event = field(default_factory=threading.Event)  # the reader's: it stops
    scored: threading.Event = field(default_factory=threading.Event)  # a pace, or a pass, came
    unmeasured: bool = False  # a window sized before the pace was known is out

    def rows(self) -> int:
        """Input rows the next window may hold (at least one); before the pace is known, one
        batch's worth, and not a second such window until the first was measured (or the
        reader was told to stop)."""
        if self.rate is None and self.unmeasured:
            while not self.scored.wait(POLL_S) and not self.stop.is_set():
                pass
        if self.rate is None:
            self.scored.clear()
            self.unmeasured = True
            return max(1, self.first)
        return max(1, int(self.rate * self.commit_s / SHARE))

    def took(self, rows: int, seconds: float) -> None:
        """The model scored ``rows`` input rows in ``seconds`` (none: a window it had nothing
        to run for, which lets the reader size the next one all the same)."""
        if rows > 0 and seconds > 0:
            self.rate = rows / seconds
        self.scored.set()
