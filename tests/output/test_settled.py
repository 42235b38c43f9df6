"""The settled decision is typed in the code and the same JSON on disk: every layout a run has
written reads back and writes out as it was, so a folder settled by an earlier version resumes."""

from __future__ import annotations

import re

import pytest

from batchscore.output.checkpoint import Checkpoint, Damaged
from batchscore.output.settled import Budget, Chosen, Decision

WRITTEN = [
    {"precision": {"precision": "fp32", "why": "fp32 is the reference"}},
    {  # "auto", with its budget
        "precision": {
            "precision": "bf16",
            "why": "for 10,000 rows, the fastest that passes ...",
            "trials": ["fp32: 90.0 rows/s", "bf16: 150.0 rows/s, cosine 0.999"],
            "sample_rows": 256,
            "agreement": {"cosine_min": 0.999},
            "speeds": {"fp32": 1000.0, "bf16": 1700.0},
        },
        "batching": {"max_tokens": 8192, "why": "from the model's shape"},
    },
    {  # a fixed precision that failed its gate, accepted
        "precision": {
            "trials": ["fp32: 90.0 rows/s", "int8: 120.0 rows/s, cosine 0.95"],
            "sample_rows": 256,
            "precision": "int8",
            "agreement": {"cosine_min": 0.95},
            "why": "int8 FAILS the quality gate, accepted: ...",
            "accepted": True,
            "speeds": {"fp32": 1000.0, "int8": 1300.0},
        }
    },
    {"precision": {"precision": "fp32", "why": "auto: nothing faster", "agreement": None}},
    {  # int8 embeddings: each dimension's range, measured on the job's first rows
        "precision": {"precision": "fp32", "why": "fp32 is the reference"},
        "ranges": [[-0.25, -1.0, 0.0], [0.5, 1.0, 0.0]],
    },
]


@pytest.mark.parametrize("record", WRITTEN)
def test_every_written_layout_reads_back_as_it_was(record):
    assert Decision.from_json(record).to_json() == record


def test_the_fields_the_run_reads_are_typed():
    decision = Decision.from_json(WRITTEN[2])
    assert decision.precision == Chosen(
        "int8",
        "int8 FAILS the quality gate, accepted: ...",
        trials=("fp32: 90.0 rows/s", "int8: 120.0 rows/s, cosine 0.95"),
        speeds={"fp32": 1000.0, "int8": 1300.0},
        accepted=True,
        measured={"sample_rows": 256, "agreement": {"cosine_min": 0.95}},
    )
    assert decision.batching is None
    assert Decision.from_json(WRITTEN[1]).batching == Budget(8192, "from the model's shape")


def test_ranges_read_back_as_floats():
    decision = Decision.from_json(WRITTEN[-1])
    assert decision.ranges == ((-0.25, -1.0, 0.0), (0.5, 1.0, 0.0))
    assert Decision.from_json(WRITTEN[0]).ranges is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"precision": "fp32"}', "not the shape a run writes"),
        ('{"precision": {"why": "no name"}}', "not the shape a run writes"),
        ('{"precision": {"precision": "fp32"}, "ranges": "wide"}', "not the shape a run writes"),
        ('{"precision": {"precision": "fp32"}, "ranges": [[0.0, 1.0]]}', "not two lists"),
        (
            '{"precision": {"precision": "fp32"}, "ranges": [[0.0, 0.5], [1.0, 0.5]]}',
            "its ranges: dimension 1 (from 0): its minimum and maximum are both 0.5",
        ),
        ('{"precision": {"precision": "fp32"}, "ranges": [[0.0], [NaN]]}', "finite numbers"),
    ],
)
def test_a_record_no_run_writes_is_damaged_not_followed(tmp_path, text, why):
    """A hand-edited settled.json of another shape, or with ranges that would write one step
    for every row, is damaged (rebuilt from the data files by the run), never a traceback
    and never quantized with."""
    ckpt = Checkpoint(tmp_path)
    ckpt.prepare()
    (tmp_path / "_batchscore" / "settled.json").write_text(text)
    with pytest.raises(Damaged, match=re.escape(why)):
        ckpt.settled()
