"""The diff's join (`batchscore.output.diff.join`) against the rule it implements, written out
row by row: an input row is scored unless its (id, hash) is committed; a committed row retires
unless its (id, hash) is input, and a committed (id, hash) held twice keeps its first (in file
order). Hypothesis draws both sides, ids committed once (the protocol's case, one join) and
twice (a folder that is evidence of something else), whole views and partial ones."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.output.diff import SHIFT, DuplicateIdError, RowDiff, join


@dataclass
class Shard:
    path: str
    index: int


def rows_of(packed: np.ndarray) -> set[tuple[int, int]]:
    return {(int(v) >> SHIFT, int(v) & ((1 << SHIFT) - 1)) for v in packed}


def expected(inputs: list[tuple[int, int]], outputs: list[tuple[int, int]], partial: bool):
    """The rule, row by row: (rows to score, rows to retire, counts)."""
    first: dict[tuple[int, int], int] = {}
    twice = []
    for at, key in enumerate(outputs):  # file order is the list's (file 0, rows in order)
        if key in first:
            twice.append(at)
        else:
            first[key] = at
    held = set(inputs)
    committed_ids = {i for i, _ in first}
    input_ids = {i for i, _ in inputs}
    score = [r for r, key in enumerate(inputs) if key not in first]
    retire = [at for key, at in first.items() if key not in held]
    changed = sum(inputs[r][0] in committed_ids for r in score)
    counts = {
        "new": len(score) - changed,
        "changed": changed,
        "unchanged": len(inputs) - len(score),
        "deleted": sum(outputs[at][0] not in input_ids for at in retire),
        "committed_twice": len(twice),
        "to_retire": len(retire) + len(twice),
    }
    if partial:
        return {r for r in score if inputs[r][0] not in committed_ids}, set(), counts
    return set(score), set(retire) | set(twice), counts


keys = st.tuples(st.integers(0, 12), st.integers(0, 2))


@settings(max_examples=300, deadline=None)
@given(
    inputs=st.lists(keys, max_size=30, unique_by=lambda k: k[0]),
    outputs=st.lists(keys, max_size=30),
    unique_committed=st.booleans(),
    partial=st.booleans(),
)
def test_the_join_scores_and_retires_what_the_rule_says(inputs, outputs, unique_committed, partial):
    if unique_committed:  # the protocol's case: each id committed once
        outputs = list({i: (i, h) for i, h in outputs}.values())
    left = pa.table(
        {
            "id": pa.array([i for i, _ in inputs], pa.int64()),
            "h": pa.array([h for _, h in inputs], pa.int64()),
            "shard": pa.array([0] * len(inputs), pa.int64()),
            "row": pa.array(range(len(inputs)), pa.int64()),
        }
    )
    right = pa.table(
        {
            "id": pa.array([i for i, _ in outputs], pa.int64()),
            "h": pa.array([h for _, h in outputs], pa.int64()),
            "file": pa.array([0] * len(outputs), pa.int64()),
            "row": pa.array(range(len(outputs)), pa.int64()),
        }
    )
    diff = RowDiff()
    score, retire = join(left, right, diff, [Shard("a", 0)], failed=set(), partial=partial)
    want_score, want_retire, counts = expected(inputs, outputs, partial)
    assert rows_of(score) == {(0, r) for r in want_score}
    assert rows_of(retire) == {(0, r) for r in want_retire}
    found = diff.counts()
    assert {k: found[k] for k in counts} == counts


def test_ids_that_are_not_utf8_are_named_when_held_twice():
    """Text ids whose bytes are not UTF-8, held by two input rows: the error names them (their
    bytes escaped) and their rows, where turning them into Python strings would fail."""
    raw = pa.array([b"\xff\xfe", b"ok", b"\xff\xfe"], pa.binary())
    left = pa.table(
        {
            "id": pa.Array.from_buffers(pa.string(), 3, raw.buffers()),  # unchecked bytes
            "h": pa.array([1, 2, 3], pa.int64()),
            "shard": pa.array([0, 0, 0], pa.int64()),
            "row": pa.array([0, 1, 2], pa.int64()),
        }
    )
    none = pa.array([], pa.int64())
    right = pa.table({"id": pa.array([], pa.string()), "h": none, "file": none, "row": none})
    with pytest.raises(DuplicateIdError, match=r"'\\\\xff\\\\xfe' at a row 0 and a row 2"):
        join(left, right, RowDiff(), [Shard("a", 0)], failed=set(), partial=False)
