"""Chunks committed in pieces: which rows of a chunk its commit records cover, and which not.

A chunk whose rows would otherwise wait past `[output].commit_s` for their commit commits the
rows it has as a piece of itself (`batchscore.work.units.Chunk.cut`, in
`batchscore.output.committer`), named from the chunk and the piece's first row
(`batchscore.storage.layout.piece_key`), and the rest of the chunk goes on. A piece's commit
record is any chunk's, plus ``piece_of``, the whole chunk's key, and ``span``, its rows. A
chunk is done once its records cover its rows; the rows none covers are pending, each stretch
as a piece of the chunk (`gaps`), so a resumed run scores only those, and never a committed
piece again, whatever its `commit_s`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from batchscore.work.units import Chunk


def chunk_of(record: dict[str, Any]) -> str:
    """The key of the whole chunk a commit record holds (some or all of)."""
    return record.get("piece_of", record["chunk"])


def rows_of(record: dict[str, Any]) -> int:
    """The rows of the whole chunk a commit record holds (some or all of)."""
    start, stop = record.get("span", (record["start"], record["stop"]))
    return int(stop) - int(start)


def whole_chunks(records: list[dict[str, Any]]) -> set[str]:
    """The keys of the chunks that ``records`` commit whole: in one file, or in pieces that
    add up to it."""
    covered: Counter[str] = Counter()
    whole: dict[str, int] = {}
    for record in records:
        covered[chunk_of(record)] += record["stop"] - record["start"]
        whole[chunk_of(record)] = rows_of(record)
    return {key for key, rows in covered.items() if rows == whole[key]}


def pieces_by_chunk(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The records of pieces, by the key of their whole chunk."""
    found: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if "piece_of" in record:
            found.setdefault(record["piece_of"], []).append(record)
    return found


def gaps(chunk: Chunk, pieces: list[dict[str, Any]]) -> list[Chunk]:
    """The stretches of ``chunk``'s rows that none of its committed ``pieces`` holds, each as
    a piece of it to score (the chunk itself when there are none). Pieces are cut in row
    order, so this is the rest after the last one, unless one was un-committed since (its
    file missing or changed) and left a hole."""
    if not pieces:
        return [chunk]
    span = (chunk.start, chunk.stop)
    rest, at = [], chunk.start
    for start, stop in sorted((r["start"], r["stop"]) for r in pieces):
        if start > at:
            rest.append(replace(chunk, start=at, stop=start, span=span))
        at = max(at, stop)
    if at < chunk.stop:
        rest.append(replace(chunk, start=at, span=span))
    return rest
