"""What the quality gate promises, and when the rows it has scored are enough to keep it.

The promise, for a precision the gate passes: no row it scored falls below `[quality]`'s
threshold, and, with `[quality].confidence` (0.95), fewer than `[quality].max_share_below`
(0.05) of rows like the sample's would. It is a one-sided Clopper-Pearson bound on a share,
which needs no assumption about how the rows' errors are spread: only that the sample's rows
are like the job's others (the gate reads the job's first distinct rows).

The gate scores the sample in rounds and looks after each (`looks`): the first look comes
where zero doubtful rows can already show the promise, each next look doubles the rows, up to
`[quality].sample_rows`. A row is doubtful when it comes within half its threshold's reach of
it (`DOUBT`); the gate stops at the first look where the doubtful rows' share is shown below
the promised one (`shown`), so a candidate far from its threshold stops at the first look and
one whose rows come close widens to the whole sample. Counting doubtful rows rather than rows
below the threshold only makes each look stricter, so every look still proves the promise.
Each look spends its own part of the risk (Bonferroni: half of it at the first look, a quarter
at the next, the last look what is left), so looking several times never adds to it.

This module is policy only: counts and shares in, verdicts out (tested by simulation in
`tests/measure/test_promise.py`, rows corrupted at planted rates).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

DOUBT = 0.5  # a row whose margin (1: identical to fp32, 0: at the threshold) falls under this
SPOT_ROWS = 32  # a warm run's spot sample, where this machine's evidence for the job is kept


@dataclass(frozen=True)
class Promise:
    """With ``confidence``, fewer than ``share`` of the job's rows fall below the threshold."""

    share: float = 0.05
    confidence: float = 0.95

    @property
    def risk(self) -> float:
        return 1.0 - self.confidence

    def first_look(self) -> int:
        """The fewest rows with which no doubtful row shows the promise at the first look's
        risk (half the whole): 72 rows for the defaults."""
        if self.share >= 1.0:
            return 1
        if self.share <= 0.0 or self.risk <= 0.0:
            return 1 << 62  # a promise no sample can show: every look is the last
        return math.floor(math.log(self.risk / 2) / math.log1p(-self.share)) + 1

    def looks(self, cap: int) -> list[int]:
        """The rows scored before each look, up to ``cap`` (`[quality].sample_rows`), which is
        always the last."""
        found, rows = [], self.first_look()
        while rows < cap:
            found.append(rows)
            rows *= 2
        return [*found, cap]

    def risk_at(self, look: int, looks: int) -> float:
        """The part of the risk look ``look`` (from 0) of ``looks`` spends: half, a quarter, ...,
        and the last what is left, so that they add up to the whole."""
        if look >= looks - 1:
            return self.risk / 2 ** (looks - 1)
        return self.risk / 2 ** (look + 1)

    def bound(self, rows: int, doubtful: int, risk: float) -> float:
        """The share of rows like these that may be doubtful, with confidence ``1 - risk``: the
        one-sided Clopper-Pearson upper bound (1 with no rows)."""
        return clopper_pearson(rows, doubtful, risk)

    def shown(self, rows: int, doubtful: int, risk: float) -> bool:
        """Whether ``doubtful`` of ``rows`` show the promise at this look's ``risk``."""
        return self.bound(rows, doubtful, risk) < self.share

    def describe(self) -> str:
        return f"with {self.confidence:.0%} confidence, fewer than {self.share:.1%} of rows below"


@dataclass(frozen=True)
class Look:
    """What the gate concluded at one look: ``verdict`` is "pass", "fail" or "more"."""

    verdict: str
    rows: int
    doubtful: int
    bound: float  # the share of rows below the threshold shown with the promise's confidence
    why: str


def judge_look(
    promise: Promise,
    *,
    margins: list[float],
    failed: bool,
    look: int,
    looks: list[int],
    whole: bool,
) -> Look:
    """The verdict after scoring ``looks[look]`` rows, whose margins to the threshold are
    ``margins`` (one a row; below 0: the row falls below). ``failed``: the task's own measure
    fails on these rows (a row below, for a measure that judges each row): refused at once,
    since a witnessed failure is never outweighed. ``whole``: the measure judges a share (label
    agreement, exact match) or the job needs every sample row (int8 ranges), so only the last
    look concludes."""
    rows = len(margins)
    doubtful = sum(1 for m in margins if m < DOUBT)
    below = sum(1 for m in margins if m < 0)
    last = look >= len(looks) - 1
    if whole and not last:  # a share is judged on the whole sample; a row's verdict waits too
        return Look("more", rows, 0, 1.0, f"{rows} rows, the measure judges the whole sample")
    risk = promise.risk_at(look, len(looks))
    shown = promise.bound(rows, below if last else doubtful, risk)
    if failed:
        return Look("fail", rows, doubtful, shown, f"{below} of {rows} rows below the threshold")
    if last:
        return Look("pass", rows, doubtful, shown, f"the whole sample, {rows} rows")
    if not whole and shown < promise.share:
        why = f"{rows} rows, {doubtful} within half the threshold's reach of it"
        return Look("pass", rows, doubtful, shown, why)
    return Look("more", rows, doubtful, shown, f"{doubtful} of {rows} rows in doubt")


@functools.lru_cache(maxsize=4096)  # a gate asks for a few (rows, count) pairs, again and again
def clopper_pearson(rows: int, doubtful: int, risk: float) -> float:
    """The one-sided upper bound on a share, ``doubtful`` of ``rows`` seen, at ``risk``."""
    if rows <= 0 or doubtful >= rows:
        return 1.0
    if doubtful == 0:
        return 1.0 - risk ** (1.0 / rows)
    low, high = 0.0, 1.0
    for _ in range(60):  # the share at which seeing this few is as unlikely as ``risk``
        middle = (low + high) / 2
        low, high = (middle, high) if at_most(doubtful, rows, middle) > risk else (low, middle)
    return high


def at_most(k: int, n: int, share: float) -> float:
    """P(X <= k) for X binomial(n, share), summed in logs so that n = 65,536 does not
    underflow."""
    i = np.arange(k + 1, dtype=np.float64)
    lgamma = np.vectorize(math.lgamma)
    logs = (
        math.lgamma(n + 1)
        - lgamma(i + 1)
        - lgamma(n - i + 1)
        + i * math.log(share)
        + (n - i) * math.log1p(-share)
    )
    top = logs.max()
    return float(min(1.0, math.exp(top) * np.exp(logs - top).sum()))


def agrees(spot: list[float], worst: float) -> bool:
    """Whether a warm run's spot sample agrees with the evidence kept for the job: no row below
    the threshold, and none much nearer it than the nearest row the evidence saw (``worst``,
    its smallest margin): half that margin, or half `DOUBT` where the evidence stayed clear of
    doubt, since the least of a few new rows falls under the least of many old ones by chance
    alone."""
    if not spot:
        return False
    return min(spot) >= min(DOUBT, worst) / 2
