"""Row errors (`batchscore.work.row_errors`): the listing of rows recorded with one, under
``_batchscore/rejected/``, one JSON line each."""

from __future__ import annotations

import json

import pyarrow as pa

from batchscore.work.row_errors import rejected, rejected_lines


def test_a_listed_id_that_is_not_utf8_is_written_escaped():
    """A text id whose bytes are not UTF-8 (its row refused for them, or for another reason) is
    listed with those bytes escaped; the chunk's other rows are listed as they are."""
    raw = pa.array([b"\xff\xfe id", b"fine", None], pa.binary())
    ids = pa.Array.from_buffers(pa.string(), 3, raw.buffers())  # unchecked bytes
    listing = rejected("in/a.parquet", [0, 1, 2], ["bad", "worse", "worst"], ids)
    lines = [json.loads(line) for line in rejected_lines([listing]).splitlines()]
    assert [line["id"] for line in lines] == ["\\xff\\xfe id", "fine", None]
    assert lines[1] == {"shard": "in/a.parquet", "row": 1, "id": "fine", "error": "worse"}
    numbers = rejected("in/a.parquet", [4], ["bad"], pa.array([7], pa.int64()))
    assert json.loads(rejected_lines([numbers]))["id"] == 7
