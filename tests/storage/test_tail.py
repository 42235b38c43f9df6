"""A Parquet footer read from an object store's file end, fetched with retries beforehand: the
metadata equals what the whole file gives, with one or two requests, footers large or small."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.storage import open_store
from batchscore.storage.tail import FIRST_READ, TailFile, fetch_end


def parquet_bytes(columns: int, rows: int, key_value: str) -> bytes:
    table = pa.table({f"column_{i}": list(range(rows)) for i in range(columns)})
    out = io.BytesIO()
    pq.write_table(table.replace_schema_metadata({"batchscore.job": key_value}), out)
    return out.getvalue()


@settings(max_examples=40, deadline=None)
@given(
    columns=st.sampled_from([1, 3, 40, 700, 2500]),  # 700 and more: a footer over 64 KiB
    rows=st.integers(0, 300),
    key_value=st.text(max_size=20),
)
def test_the_footer_read_from_the_end_equals_the_whole_files(columns, rows, key_value):
    data = parquet_bytes(columns, rows, key_value)
    asked: list[int] = []

    def tail(count: int) -> bytes:
        asked.append(count)
        return data[len(data) - count :]

    end = fetch_end(len(data), tail)
    with TailFile(end, len(data)) as fh:
        got = pq.read_metadata(fh)
    want = pq.read_metadata(io.BytesIO(data))
    assert got.to_dict() == want.to_dict() and got.metadata == want.metadata
    beyond_first = len(data) > FIRST_READ and want.serialized_size + 8 > FIRST_READ
    assert len(asked) == (2 if beyond_first else 1)


def test_reading_before_the_fetched_end_is_an_error_not_zeros():
    data = parquet_bytes(1, 100_000, "x")
    with TailFile(data[-100:], len(data)) as fh:
        fh.seek(0)
        with pytest.raises(OSError, match="were not fetched"):
            fh.read(10)


@pytest.mark.s3
def test_a_footer_in_s3_is_read_through_the_store(bucket: str, tmp_path):
    store = open_store(f"{bucket}/out")
    store.prepare()
    staged = store.staging / "part.tmp"
    staged.write_bytes(parquet_bytes(2500, 10, "mine"))
    store.publish(staged, "part-a.parquet")
    with store.open_input("part-a.parquet") as fh:
        assert pq.read_metadata(fh).metadata[b"batchscore.job"] == b"mine"
    with pytest.raises(FileNotFoundError, match="no such object"):
        store.open_input("part-none.parquet")
