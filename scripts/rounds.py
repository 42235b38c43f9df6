"""Interleaved rounds as BENCHMARKS.md reports them (issue 52): a ratio is the median of each
round's own ratio, shown with their range and the number of rounds.

Every variant runs once a round (A, B, A, B, ...), so a drift in this shared machine's load hits
a round's variants alike: a ratio taken within a round cancels it, where a ratio of two medians
(each perhaps from another round) would not. Fewer than three rounds give no median worth a
row, so the benchmarks' round counts refuse them (`count`).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable, Sequence

LEAST = 3  # rounds a ratio in BENCHMARKS.md is the median of


def ratio(numerators: Sequence[float], denominators: Sequence[float], digits: int = 2) -> str:
    """Each round's numerator over the same round's denominator, as "median 1.23x (range
    1.10-1.31, 3 rounds)"."""
    pairs = zip(numerators, denominators, strict=True)
    ratios = sorted(n / d if d else math.nan for n, d in pairs)
    if not ratios or any(math.isnan(r) for r in ratios):
        return f"n/a (a round without this figure, {len(ratios)} rounds)"
    middle, low, high = (
        f"{r:.{digits}f}" for r in (statistics.median(ratios), ratios[0], ratios[-1])
    )
    return f"median {middle}x (range {low}-{high}, {len(ratios)} rounds)"


def spread(values: Sequence[float], digits: int = 1) -> str:
    """A variant's figures over the rounds as their range, "10.2-11.4"."""
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def count(least: int = LEAST, why: str = "") -> Callable[[str], int]:
    """An argparse ``type`` for a number of rounds that refuses fewer than ``least``; ``why``
    adds the script's own reason."""

    def rounds(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < least:
            raise argparse.ArgumentTypeError(
                f"{n}: a ratio is the median of at least {least} interleaved rounds{why}"
            )
        return n

    return rounds
