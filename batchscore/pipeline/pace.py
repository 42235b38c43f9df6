"""How many rows the next window takes, so that the model scores one in a share of
`[output].commit_s`.

A window's rows are sorted by length across its chunks, so none of its chunks is complete, or
can be committed, until the model has scored most of it: a window that takes longer than
``commit_s`` would hold every row it has past its commit bound, however small the chunks. The
model's thread measures how many input rows a second it scores (`took`); the reader sizes each
new window to a quarter of ``commit_s`` at that pace (`rows`), never past
`[batching].window_rows`. Before the first window is measured, a window holds one batch's
worth of rows (`[batching].max_rows`): the model's pace is not known yet.

A fast model keeps the full window (at the default 300 s, any model over 110 rows a second
keeps 8,192); a slow one (generation on a CPU) sorts fewer rows together, and commits on time.
"""

from __future__ import annotations

from dataclasses import dataclass

SHARE = 4  # a window is sized to take commit_s / SHARE (the committer cuts at half: see there)


@dataclass
class Pace:
    """The model's measured pace, shared by the model's thread (which measures) and the
    reader's (which sizes windows by it): one float, written whole."""

    commit_s: float
    first: int  # the rows of a window before any is measured
    rate: float | None = None  # input rows a second, over the last window

    def rows(self) -> int:
        """Input rows the next window may hold (at least one)."""
        if self.rate is None:
            return max(1, self.first)
        return max(1, int(self.rate * self.commit_s / SHARE))

    def took(self, rows: int, seconds: float) -> None:
        """The model scored a window of ``rows`` input rows in ``seconds``."""
        if rows > 0 and seconds > 0:
            self.rate = rows / seconds
