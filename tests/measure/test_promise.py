"""The quality gate's promise, tested by planting bad rows at known rates.

Each trial draws a sample whose rows are bad (past the threshold) at a planted rate, seeded,
and runs the gate's looks over it (`judge_look`, as `measure.rounds` calls it). Where the
planted rate is at least the promised share, the gate must refuse in at least the promised
confidence of the trials, whatever the good rows look like: far from the threshold (the gate
stops at its first look), near it (it widens), or bad rows that only just miss it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.measure.promise import DOUBT, SPOT_ROWS, Promise, agrees, at_most, judge_look

TRIALS = 4000


def gate(margins: np.ndarray, promise: Promise, *, cap: int = 256) -> tuple[str, int]:
    """The gate's verdict on a sample of row ``margins``, and the rows it scored."""
    looks = promise.looks(cap)
    for at, rows in enumerate(looks):
        look = judge_look(
            promise,
            margins=margins[:rows].tolist(),
            failed=bool((margins[:rows] < 0).any()),
            look=at,
            looks=looks,
            whole=False,
        )
        if look.verdict != "more":
            return look.verdict, look.rows
    raise AssertionError("the last look always concludes")


def planted(rng: np.random.Generator, rate: float, *, near: float, bad: float, cap: int = 256):
    """A sample of ``cap`` rows: bad at ``rate`` (margin ``bad``), the good ones near the
    threshold (margin 0 to DOUBT) at ``near``, the rest far from it."""
    margins = rng.uniform(0.9, 1.0, cap)
    close = rng.random(cap) < near
    margins[close] = rng.uniform(0.0, DOUBT, int(close.sum()))
    margins[rng.random(cap) < rate] = bad
    return margins


def catch_rate(rate: float, *, near: float = 0.0, bad: float = -0.5, seed: int = 0) -> float:
    """The share of ``TRIALS`` seeded samples, bad at ``rate``, that the gate refuses."""
    promise, rng = Promise(), np.random.default_rng(seed)
    verdicts = [gate(planted(rng, rate, near=near, bad=bad), promise)[0] for _ in range(TRIALS)]
    return verdicts.count("fail") / TRIALS


@pytest.mark.parametrize("near", [0.0, 0.02, 0.3])
@pytest.mark.parametrize("bad", [-0.5, -0.001])
@pytest.mark.parametrize("rate", [0.05, 0.08, 0.2])
def test_bad_rows_at_the_promised_share_or_more_are_caught_at_the_promised_rate(rate, near, bad):
    # 4,000 trials: the catch rate's standard error is at most 0.35 points, so 0.95 - 0.01
    # leaves three of them for chance alone
    assert (
        catch_rate(rate, near=near, bad=bad, seed=int(rate * 1000)) >= Promise().confidence - 0.01
    )


def test_a_clean_candidate_stops_at_the_first_look_and_one_in_doubt_widens():
    promise, rng = Promise(), np.random.default_rng(1)
    assert promise.looks(256) == [72, 144, 256]
    assert gate(planted(rng, 0.0, near=0.0, bad=-1), promise) == ("pass", 72)
    widened = [gate(planted(rng, 0.0, near=0.05, bad=-1), promise)[1] for _ in range(200)]
    assert min(widened) == 72 and max(widened) > 72  # a near row or two: more rows
    assert gate(planted(rng, 0.0, near=0.6, bad=-1), promise) == ("pass", 256)  # the whole sample


def test_an_old_job_whose_sample_is_smaller_than_the_first_look_is_judged_on_it_whole():
    margins = np.full(8, 0.99)
    assert gate(margins, Promise(), cap=8) == ("pass", 8)
    margins[5] = -0.1
    assert gate(margins, Promise(), cap=8) == ("fail", 8)


def test_a_share_measure_waits_for_the_whole_sample():
    looks = Promise().looks(256)
    early = judge_look(Promise(), margins=[], failed=True, look=0, looks=looks, whole=True)
    assert early.verdict == "more"
    last = judge_look(Promise(), margins=[], failed=True, look=2, looks=looks, whole=True)
    assert last.verdict == "fail"


@settings(max_examples=60, deadline=None)
@given(
    share=st.floats(0.005, 0.5),
    confidence=st.floats(0.5, 0.999),
    cap=st.integers(1, 5000),
)
def test_the_looks_spend_no_more_than_the_whole_risk(share, confidence, cap):
    promise = Promise(share, confidence)
    looks = promise.looks(cap)
    assert looks[-1] == cap and looks == sorted(set(looks))
    spent = sum(promise.risk_at(at, len(looks)) for at in range(len(looks)))
    assert spent == pytest.approx(promise.risk)
    # zero rows in doubt at the first look (before the cap) shows the promise at its risk
    if len(looks) > 1:
        assert promise.shown(looks[0], 0, promise.risk_at(0, len(looks)))
        assert not promise.shown(looks[0] - 1, 0, promise.risk_at(0, len(looks)))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), k=st.integers(0, 3000), risk=st.floats(0.001, 0.3))
def test_the_bound_is_clopper_pearsons(n, k, risk):
    """At the bound, seeing at most ``k`` of ``n`` is exactly as likely as ``risk``."""
    k = min(k, n - 1)
    bound = Promise().bound(n, k, risk)
    assert at_most(k, n, bound) == pytest.approx(risk, rel=1e-3, abs=1e-9)


def test_a_spot_sample_agrees_unless_a_row_comes_much_nearer_than_the_evidence_saw():
    clean = [0.99] * SPOT_ROWS
    assert agrees(clean, worst=0.98)
    assert not agrees([*clean[:-1], -0.2], worst=0.98)  # a row below
    assert not agrees([*clean[:-1], 0.2], worst=0.98)  # into doubt, where none was
    assert agrees([*clean[:-1], 0.2], worst=0.3)  # as near as the evidence's nearest
    assert not agrees([], worst=0.98)
