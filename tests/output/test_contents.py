"""What a data file's footer says of an embed job's vectors: the cut, the quantization and the
int8 / uint8 ranges, which read back exactly and must agree across a folder's files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchscore.errors import BookkeepingError
from batchscore.job.sections import EmbedConfig
from batchscore.output.contents import RANGES, embed_metadata, footer_ranges

finite32 = st.floats(-1e6, 1e6, width=32)


def test_only_the_keys_the_job_set_are_recorded():
    assert embed_metadata(EmbedConfig()) == {}
    meta = embed_metadata(EmbedConfig(truncate_dim=64, quantize="binary"))
    assert meta == {"batchscore.embed.truncate_dim": "64", "batchscore.embed.quantize": "binary"}
    assert embed_metadata(EmbedConfig(top_k=32)) == {"batchscore.embed.top_k": "32"}


@given(st.lists(st.tuples(finite32, finite32), min_size=1, max_size=50))
def test_ranges_round_trip_through_the_footer_exactly(pairs):
    """float32 values, as measured: JSON keeps every bit, so queries quantize alike."""
    ranges = (tuple(min(p) for p in pairs), tuple(max(p) for p in pairs))
    meta = embed_metadata(EmbedConfig(quantize="int8", ranges=ranges))
    assert json.loads(meta[RANGES]) == [list(ranges[0]), list(ranges[1])]
    back = footer_ranges([meta, dict(meta), {"batchscore.precision": "fp32"}], "here")
    assert back == ranges
    assert np.array_equal(np.asarray(back, np.float32), np.asarray(ranges, np.float32))


def test_files_quantized_with_two_ranges_are_refused():
    assert footer_ranges([{}, {"batchscore.precision": "fp32"}], "here") is None
    one = embed_metadata(EmbedConfig(quantize="uint8", ranges=((0.0,), (1.0,))))
    two = embed_metadata(EmbedConfig(quantize="uint8", ranges=((0.0,), (2.0,))))
    with pytest.raises(BookkeepingError, match="quantized with 2 different ranges"):
        footer_ranges([one, two], "out/_batchscore/settled.json: damaged")
