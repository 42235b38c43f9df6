"""A row's hash (`batchscore.work.row_hash`) is a fact about the row's values alone: the same
for a slice of a table as for the table (Arrow offsets), for one chunk or many, and for the
layouts another writer picks (large strings, wider integers and floats, dictionaries); and a
changed value changes it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.work.row_hash import hash_column

COLUMNS = ["n", "x", "t", "v"]
rows = st.lists(
    st.tuples(
        st.none() | st.integers(-(2**31), 2**31 - 1),
        st.none() | st.floats(width=32, allow_nan=False),
        st.none() | st.text(max_size=8),
        st.none() | st.lists(st.floats(width=32, allow_nan=False), max_size=3),
    ),
    min_size=1,
    max_size=20,
)


def narrow(values: list[tuple]) -> pa.Table:
    n, x, t, v = zip(*values, strict=True)
    return pa.table(
        {
            "n": pa.array(n, pa.int32()),
            "x": pa.array(x, pa.float32()),
            "t": pa.array(t, pa.string()),
            "v": pa.array(v, pa.list_(pa.float32())),
        }
    )


def wide(table: pa.Table) -> pa.Table:
    """Another writer's layout of the same values."""
    return pa.table(
        {
            "n": table["n"].cast(pa.int64()),
            "x": table["x"].cast(pa.float64()),
            "t": table["t"].cast(pa.large_string()).dictionary_encode(),
            "v": table["v"].cast(pa.large_list(pa.float64())),
        }
    )


def hashes(table: pa.Table) -> list[int]:
    return hash_column(table, COLUMNS).to_pylist()


@settings(max_examples=60, deadline=None)
@given(values=rows, cut=st.data())
def test_a_rows_hash_is_its_values_whatever_the_layout(values: list[tuple], cut: st.DataObject):
    table = narrow(values)
    whole = hashes(table)
    a = cut.draw(st.integers(0, table.num_rows - 1))
    b = cut.draw(st.integers(a + 1, table.num_rows))
    assert hashes(table.slice(a, b - a)) == whole[a:b]  # offsets into shared buffers
    assert hashes(wide(table)) == whole
    chunked = pa.concat_tables([table.slice(0, a), table.slice(a)])
    assert hashes(chunked) == whole


@settings(max_examples=60, deadline=None)
@given(values=rows, which=st.data())
def test_a_changed_value_changes_its_rows_hash(values: list[tuple], which: st.DataObject):
    table = narrow(values)
    row = which.draw(st.integers(0, table.num_rows - 1))
    x = table["x"].to_pylist()
    x[row] = 1.5 if x[row] != 1.5 else 2.5
    changed = table.set_column(1, "x", pa.array(x, pa.float32()))
    before, after = hashes(table), hashes(changed)
    assert before[row] != after[row]
    assert np.delete(np.array(before), row).tolist() == np.delete(np.array(after), row).tolist()


def test_a_struct_holding_text_that_is_not_utf8_is_hashed():
    """A struct column (a datasets Image, say) whose text is not UTF-8 in one row: that row is
    hashed by its bytes, and every other row's hash is what it was without it."""
    raw = pa.array([b"a.png", b"\xff\xfe.png", b"c.png"], pa.binary())
    paths = pa.Array.from_buffers(pa.string(), 3, raw.buffers())  # unchecked bytes
    column = pa.StructArray.from_arrays([pa.nulls(3, pa.binary()), paths], ["bytes", "path"])
    hashes = hash_column(pa.table({"image": column}), ["image"]).to_pylist()
    good = pa.StructArray.from_arrays(
        [pa.nulls(2, pa.binary()), pa.array(["a.png", "c.png"])], ["bytes", "path"]
    )
    assert hash_column(pa.table({"image": good}), ["image"]).to_pylist() == hashes[::2]
    assert len(set(hashes)) == 3
