"""The batching policy: one answer to how rows become batches, and the very batches the sampler
cut for the arguments each stage passed it before the policy owned them."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.job.sections import BatchingConfig
from batchscore.pipeline.batching import Batching
from batchscore.pipeline.sampler import form_batches
from batchscore.work.units import Encoded

lengths_st = st.lists(st.integers(min_value=0, max_value=300), min_size=0, max_size=200)


def encoding(bucketing: bool) -> SimpleNamespace:
    """What the policy asks of a task's encoding: whether its inputs have a length."""
    return SimpleNamespace(bucketing=bucketing)


def encoded_of(lengths: list[int], reserve: int) -> Encoded:
    n = len(lengths)
    return Encoded(np.array(lengths, dtype=np.int64), np.arange(n), np.arange(n), reserve=reserve)


def old_batches(encoded, units, max_tokens, *, max_rows, sort):
    """How `stages.batches` cut a window's units before the policy: the reference."""
    sizes = np.minimum((encoded.lengths + encoded.reserve)[units], max_tokens)
    return [units[b] for b in form_batches(sizes, max_tokens, max_rows, sort)]


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@settings(max_examples=300, deadline=None)
@given(
    lengths=lengths_st,
    reserve=st.sampled_from([0, 0, 3, 40]),
    max_tokens=st.integers(1, 4096),
    max_rows=st.integers(1, 64),
    sort=st.booleans(),
    bucketing=st.booleans(),
    picked=st.randoms(use_true_random=False),
)
def test_the_policys_batches_are_the_samplers_for_the_old_arguments(
    lengths, reserve, max_tokens, max_rows, sort, bucketing, picked
):
    """Every stage's cut, through the policy, equals `form_batches` under the arguments the
    reader and model thread passed it (`[batching].sort and bucketing`), on any subset of
    units (repeats and the gate's known units left out) in any order."""
    encoded = encoded_of(lengths, reserve)
    some = picked.sample(range(len(lengths)), k=len(lengths) // 2 + 1) if lengths else []
    units = np.array(some, dtype=np.int64)  # in any order: a re-cut takes the queue as it is
    config = BatchingConfig(max_tokens=max_tokens, max_rows=max_rows, sort=sort)
    policy = Batching.of(config, encoding(bucketing))
    want = old_batches(encoded, units, max_tokens, max_rows=max_rows, sort=sort and bucketing)
    assert same(policy.batches(encoded, units), want)


@settings(max_examples=200, deadline=None)
@given(
    sizes=lengths_st,
    max_tokens=st.integers(1, 4096),
    max_rows=st.integers(1, 64),
    sort=st.booleans(),
)
def test_plans_drawn_sizes_cut_as_before(sizes, max_tokens, max_rows, sort):
    """`batchscore plan`'s padding estimate cut drawn unit sizes with `form_batches` itself."""
    drawn = np.array(sizes, dtype=np.int64)
    want = form_batches(np.minimum(drawn, max_tokens), max_tokens, max_rows, sort)
    assert same(Batching(max_tokens, max_rows, sort).cut(drawn), want)


@settings(max_examples=200, deadline=None)
@given(
    lengths=lengths_st,
    max_tokens=st.integers(1, 4096),
    max_rows=st.integers(1, 64),
    sort=st.booleans(),
)
def test_every_unit_once_and_the_limits_hold(lengths, max_tokens, max_rows, sort):
    """A unit over the budget runs alone; every other batch holds the budget and max_rows."""
    encoded = encoded_of(lengths, 0)
    units = np.arange(len(lengths))
    cut = Batching(max_tokens, max_rows, sort).batches(encoded, units)
    flat = np.concatenate(cut) if cut else np.empty(0, dtype=np.int64)
    assert sorted(flat.tolist()) == units.tolist()
    for batch in cut:
        assert 1 <= len(batch) <= max_rows
        longest = max(1, int(encoded.lengths[batch].max()))
        assert len(batch) == 1 or len(batch) * longest <= max_tokens
    if not sort:
        assert flat.tolist() == units.tolist()


@pytest.mark.parametrize(
    ("sort", "bucketing", "sorted_"),
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
)
def test_rows_are_sorted_only_where_the_job_asks_and_the_task_has_lengths(sort, bucketing, sorted_):
    config = BatchingConfig(max_tokens=64, max_rows=4, sort=sort)
    assert Batching.of(config, encoding(bucketing)) == Batching(64, 4, sorted_)


def test_an_auto_budget_is_given_by_its_measurement():
    """`max_tokens = "auto"` cuts nothing until a budget is measured or tried; a given budget
    stands in for it (and for a number, where a measurement tries another)."""
    auto = BatchingConfig(max_tokens="auto", max_rows=8)
    with pytest.raises(ValueError, match="auto"):
        Batching.of(auto, encoding(True))
    assert Batching.of(auto, encoding(True), max_tokens=512) == Batching(512, 8, True)
    number = BatchingConfig(max_tokens=4096, max_rows=8, sort=False)
    assert Batching.of(number, encoding(True), max_tokens=256) == Batching(256, 8, False)


def test_a_changed_budget_is_a_new_policy_and_the_old_one_stands():
    policy = Batching(1000, 16, True)
    assert policy.under(300) == Batching(300, 16, True)
    assert policy.halved(700) == Batching(350, 16, True)
    assert policy.halved(1) == Batching(1, 16, True)  # never zero: a batch of one row fits
    assert policy == Batching(1000, 16, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_tokens = 1  # type: ignore[misc]


def test_halving_keeps_the_jobs_order_for_unsorted_batches():
    """Out of memory on an unsorted job: its rows are cut again in input order, not sorted."""
    encoded = encoded_of([5, 1, 4, 1, 3, 2, 6], 0)
    policy = Batching(64, 8, sort=False).halved(12)
    cut = policy.batches(encoded, np.arange(7))
    assert np.concatenate(cut).tolist() == list(range(7))
