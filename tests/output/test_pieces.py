"""A chunk committed in pieces (`[output].commit_s`): the rows its pieces hold are done, the rest
is pending as pieces of it, each named from the chunk and its first row, never a committed one's
name; the chunk is done once its pieces add up to it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.output.pieces import gaps, pieces_by_chunk, whole_chunks
from batchscore.storage.layout import CHUNK_NAME, DONE, OWN_NAMES, part_name, piece_key, shard_of
from batchscore.work.units import Chunk, Shard

SHARD = Shard(0, "/data/in/a.parquet", 10, 1)


def record(chunk: Chunk) -> dict:
    """What the committer records of a piece (`committer.record`), the parts this reads."""
    extra = {} if chunk.whole else {"piece_of": chunk.whole_key, "span": list(chunk.span)}
    return {"chunk": chunk.key, "start": chunk.start, "stop": chunk.stop, "rows": chunk.rows,
            **extra}  # fmt: skip


def test_a_piece_is_named_from_its_chunk_and_first_row_as_any_chunk_is():
    chunk = Chunk(SHARD, 3, 150, 200, 4)
    piece, rest = chunk.cut(170)
    assert (piece.start, piece.stop, rest.start, rest.stop) == (150, 170, 170, 200)
    assert piece.key == piece_key(chunk.key, 150) and rest.key == piece_key(chunk.key, 170)
    assert piece.whole_key == rest.whole_key == chunk.key and not piece.whole
    for key in (piece.key, rest.key):
        assert CHUNK_NAME.fullmatch(part_name(key)) and OWN_NAMES[DONE].fullmatch(f"{key}.json")
        assert shard_of(key) == SHARD.key  # its shard's, as a chunk's is
    assert chunk.names == (chunk.key, piece.key)  # a file of it may be whole, or its first piece
    assert rest.names == (rest.key,)
    with pytest.raises(ValueError):
        piece_key(chunk.key, -1)


def test_a_cut_of_a_chunk_that_picked_its_rows_splits_the_picks():
    chunk = Chunk(SHARD, 0, 2, 9, 1, picks=np.array([2, 4, 7, 8]), label="run")
    piece, rest = chunk.cut(5)
    assert piece.picks.tolist() == [2, 4] and rest.picks.tolist() == [7, 8]
    assert piece.key != chunk.key and piece.whole_key == chunk.key  # the label's, too


@settings(max_examples=300, deadline=None)
@given(
    start=st.integers(0, 50),
    rows=st.integers(1, 60),
    cuts=st.lists(st.integers(1, 59), max_size=6),
    lost=st.lists(st.booleans(), min_size=7, max_size=7),
)
def test_the_pending_rest_and_the_pieces_hold_every_row_once(start, rows, cuts, lost):
    """Cut a chunk at any rows (the rest after the last cut still open, never committed), lose
    any of the committed pieces (their files missing or changed): the pending stretches and
    the pieces kept hold every row of the chunk once, and no pending piece is named as a kept
    one; the chunk is whole once every piece is kept and the rest committed too."""
    chunk = Chunk(SHARD, 1, start, start + rows, 2)
    pieces, rest = [], chunk
    for at in sorted({start + c for c in cuts if c < rows}):
        piece, rest = rest.cut(at)
        pieces.append(piece)
    kept = [record(p) for p, gone in zip(pieces, lost, strict=False) if not gone]
    pending = gaps(chunk, pieces_by_chunk(kept).get(chunk.key, []))
    held = sorted([(r["start"], r["stop"]) for r in kept] + [(p.start, p.stop) for p in pending])
    assert [r for a, b in held for r in range(a, b)] == list(range(chunk.start, chunk.stop))
    assert not {p.key for p in pending} & {r["chunk"] for r in kept}
    assert all(p.span == (chunk.start, chunk.stop) for p in pending) or pending == [chunk]
    done = [*kept, *(record(p) for p in pending)]
    assert whole_chunks(done) == {chunk.key}
    assert whole_chunks(kept) == (set() if pending else {chunk.key})


def test_records_of_two_increments_with_the_same_rows_are_two_chunks():
    """By rows, two increments' chunks may cover the same rows of a shard: each is whole."""
    a = Chunk(SHARD, 0, 0, 5, 1, label="one")
    b = Chunk(SHARD, 0, 0, 5, 1, label="two")
    assert whole_chunks([record(a), record(b)]) == {a.key, b.key}
