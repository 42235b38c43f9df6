"""The sampler is pure: property tests over random lengths and budgets, plus the corpus target."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.pipeline.sampler import form_batches, padded_tokens, restore, sorted_batches

lengths_st = st.lists(st.integers(min_value=1, max_value=64), min_size=0, max_size=300)
limits_st = st.tuples(st.integers(64, 2048), st.integers(1, 64))


@settings(max_examples=300, deadline=None)
@given(lengths=lengths_st, limits=limits_st, sort=st.booleans())
def test_every_row_once_and_limits_hold(lengths: list[int], limits: tuple[int, int], sort: bool):
    max_tokens, max_rows = limits
    lengths = np.array(lengths, dtype=np.int64)
    batches = form_batches(lengths, max_tokens, max_rows, sort=sort)
    flat = np.concatenate(batches) if batches else np.array([], dtype=np.int64)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    for batch in batches:
        assert 1 <= len(batch) <= max_rows
        assert len(batch) * lengths[batch].max() <= max_tokens


@settings(max_examples=200, deadline=None)
@given(lengths=lengths_st, limits=limits_st, sort=st.booleans())
def test_restore_puts_outputs_back_in_input_order(lengths, limits, sort):
    lengths = np.array(lengths, dtype=np.int64)
    batches = form_batches(lengths, *limits, sort=sort)
    # each "model output" is a function of the row it came from, so order errors show
    outputs = [lengths[b] * 1000 + b for b in batches]
    restored = restore(batches, outputs, np.empty(0, dtype=np.int64))
    assert restored.tolist() == (lengths * 1000 + np.arange(len(lengths))).tolist()


@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=200), limits=limits_st)
def test_unsorted_batches_keep_input_order(lengths, limits):
    batches = form_batches(np.array(lengths), *limits, sort=False)
    assert np.concatenate(batches).tolist() == list(range(len(lengths)))


def brute_force(lengths: np.ndarray, max_tokens: int, max_rows: int, overhead: int) -> int:
    """Least cost over every contiguous cut of the sorted rows (small inputs only)."""
    ordered = np.sort(lengths)
    n, best = len(ordered), None
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        cost = 0
        for a, b in itertools.pairwise(bounds):
            if b - a > max_rows or (b - a) * ordered[b - 1] > max_tokens:
                break
            cost += (b - a) * ordered[b - 1] + overhead
        else:
            best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=10),
    max_rows=st.integers(1, 6),
    overhead=st.integers(0, 50),
)
def test_sorted_cut_is_optimal(lengths, max_rows, overhead):
    lengths = np.array(lengths, dtype=np.int64)
    batches = sorted_batches(lengths, 120, max_rows, overhead)
    cost = padded_tokens(lengths, batches) + overhead * len(batches)
    assert cost == brute_force(lengths, 120, max_rows, overhead)


def test_row_longer_than_budget_is_refused():
    with pytest.raises(ValueError, match="exceeds max_tokens"):
        form_batches(np.array([10, 300]), max_tokens=256, max_rows=8)


def test_padding_efficiency_on_the_sample_corpus(corpus, minilm_path):
    """The issue's target: >= 0.97 real/padded tokens at the default budget, and far above naive."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(256)
    texts = corpus.column("text").to_pylist()
    lengths = np.array([len(e.ids) for e in tokenizer.encode_batch(texts)])
    real = lengths.sum()
    sorted_eff = [
        real_w / padded_tokens(w, form_batches(w, 16384, 512))
        for w in np.array_split(lengths, -(-len(lengths) // 8192))
        for real_w in [w.sum()]
    ]
    naive = real / padded_tokens(lengths, form_batches(lengths, 16384, 32, sort=False))
    assert min(sorted_eff) >= 0.97
    assert naive < 0.5
    small = lengths[:300]  # a 300-row shard: one small window
    assert small.sum() / padded_tokens(small, form_batches(small, 16384, 512)) >= 0.9
