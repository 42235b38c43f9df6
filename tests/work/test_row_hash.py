"""A row's hash (`batchscore.work.row_hash`) is a fact about the row's values alone: the same
for a slice of a table as for the table (Arrow offsets), for one chunk or many, and for the
layouts another writer picks (large strings, wider integers and floats, dictionaries, moments
in another unit or zone, dates as days or milliseconds, decimals of another width, precision
or scale); and a changed value changes it. The words of the layouts the first version already
hashed by value are pinned: they never change (a committed folder keeps its hashes)."""

from __future__ import annotations

import decimal
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.work.columns import normalized
from batchscore.work.row_hash import hash_column

COLUMNS = ["n", "x", "t", "v", "w", "d", "m", "e"]
MICROS = 9 * 10**15  # microseconds that nanoseconds still hold (the years 1685-2255)
FAR_S = 250 * 10**9  # seconds, past what int64's nanoseconds hold (the year ~9900)
rows = st.lists(
    st.tuples(
        st.none() | st.integers(-(2**31), 2**31 - 1),
        st.none() | st.floats(width=32, allow_nan=False),
        st.none() | st.text(max_size=8),
        st.none() | st.lists(st.floats(width=32, allow_nan=False), max_size=3),
        st.none() | st.integers(-MICROS, MICROS),  # a timestamp, in microseconds
        st.none() | st.integers(-(10**6), 10**6),  # a date, in days
        st.none() | st.integers(-(10**15), 10**15),  # a decimal's digits, at scale 2
        st.none() | st.integers(-FAR_S, FAR_S),  # a far timestamp, in seconds
    ),
    min_size=1,
    max_size=20,
)


def cents(digits: tuple[int | None, ...]) -> list[decimal.Decimal | None]:
    return [None if d is None else decimal.Decimal(d).scaleb(-2) for d in digits]


def narrow(values: list[tuple]) -> pa.Table:
    """The values as pandas or Spark might write them: int32, float32, microseconds, days."""
    n, x, t, v, w, d, m, e = zip(*values, strict=True)
    return pa.table(
        {
            "n": pa.array(n, pa.int32()),
            "x": pa.array(x, pa.float32()),
            "t": pa.array(t, pa.string()),
            "v": pa.array(v, pa.list_(pa.float32())),
            "w": pa.array(w, pa.timestamp("us")),
            "d": pa.array(d, pa.date32()),
            "m": pa.array(cents(m), pa.decimal128(18, 2)),
            "e": pa.array(e, pa.timestamp("s")),
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
            "w": table["w"].cast(pa.timestamp("ns")).cast(pa.timestamp("ns", "UTC")),
            "d": table["d"].cast(pa.date64()),
            "m": table["m"].cast(pa.decimal256(40, 5)),
            "e": table["e"].cast(pa.timestamp("ms")),
        }
    )


def hashes(table: pa.Table) -> list[int]:
    return hash_column(table, COLUMNS).to_pylist()


@settings(max_examples=150, deadline=None)
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


@settings(max_examples=100, deadline=None)
@given(values=rows, which=st.data())
def test_a_changed_value_changes_its_rows_hash(values: list[tuple], which: st.DataObject):
    table = narrow(values)
    row = which.draw(st.integers(0, table.num_rows - 1))
    name = which.draw(st.sampled_from(["x", "w", "m"]))
    column = table[name].to_pylist()
    epoch = pa.scalar(0, pa.timestamp("us")).as_py(), pa.scalar(1, pa.timestamp("us")).as_py()
    other = {"x": (1.5, 2.5), "w": epoch, "m": (decimal.Decimal("1.5"), decimal.Decimal("1.51"))}
    column[row] = other[name][0] if column[row] != other[name][0] else other[name][1]
    changed = table.set_column(COLUMNS.index(name), name, pa.array(column, table[name].type))
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


D = decimal.Decimal
T0 = 1_700_000_000_123_456_789  # nanoseconds since the epoch (2023-11-14)
# Columns in the layouts the first version of the hash already hashed by value, and the words
# it gave them (computed with it): they keep them, so no committed folder scores again.
FIRST_LAYOUTS = {
    "i": pa.array([1, None, -7], pa.int64()),
    "f": pa.array([1.5, float("nan"), None]),
    "s": pa.array(["a", "", None]),
    "b": pa.array([True, False, None]),
    "y": pa.array([b"\x00", None, b"xyz"]),
    "t": pa.array([T0, 0, None], pa.timestamp("ns")),
    "z": pa.array([T0, -1, None], pa.timestamp("ns", "UTC")),
    "d": pa.array([19000, None, -1], pa.date32()),
    "l": pa.array([[1.0, 2.0], [], None]),
    "m": pa.array([D("12"), D("-3"), None], pa.decimal128(5, 0)),
    "n": pa.array([D("1.25"), D("-0.55"), None], pa.decimal128(6, 2)),
    "r": pa.array([{"k": "a", "v": 1}, None, {"k": None, "v": 2}]),
}
FIRST_WORDS = {
    "i": [-5706487418562283891, 9114651041901289480, -5062790248614320664],
    "f": [-8906785629779598116, -5681689212303096120, -9108532869813974965],
    "s": [7127584968523036119, -1374152216559749951, -4385023356093840097],
    "b": [-2738614652296694892, -3198130122546589363, 2498546803002858604],
    "y": [-4957288839959677119, -6542968484211114193, -7782977516067225587],
    "t": [-5305421885265926122, -2191331799650191311, 6219067272107094761],
    "z": [418380295382337239, -580179318151259397, -7866351844423309149],
    "d": [-5869595616982245641, -5065945568890754785, 5775923870242474240],
    "l": [-2050380846510395422, 7078795944539810429, 4378476444419453505],
    "m": [-4101710167468785615, -4815225467154576391, 7862653136016665259],
    "n": [5843352582032159481, 1142243213495351874, -1883007622508167234],
    "r": [7970401663873422442, 2435167405697520608, 624105332681901169],
}


@pytest.mark.parametrize("name", sorted(FIRST_LAYOUTS))
def test_layouts_the_first_version_hashed_by_value_keep_its_words(name: str):
    table = pa.table({name: FIRST_LAYOUTS[name]})
    assert hash_column(table, [name]).to_pylist() == FIRST_WORDS[name]


def same(*arrays: pa.Array) -> None:
    """Each array, as one column ``c``, hashes as the first."""
    first = hash_column(pa.table({"c": arrays[0]}), ["c"]).to_pylist()
    for other in arrays[1:]:
        assert hash_column(pa.table({"c": other}), ["c"]).to_pylist() == first, other.type


def test_a_moment_hashes_as_its_nanoseconds_whatever_its_unit_or_zone():
    us = [1_700_000_000_123_456, 0, -1, None]
    same(
        pa.array([None if v is None else v * 1000 for v in us], pa.timestamp("ns")),
        pa.array(us, pa.timestamp("us")),
        pa.array(us, pa.timestamp("us", "UTC")),
        pa.array(us, pa.timestamp("us", "Asia/Tokyo")),  # the same stored instants
    )
    same(
        pa.array([86_400, -1, None], pa.timestamp("s")),
        pa.array([86_400_000, -1000, None], pa.timestamp("ms")),
    )
    same(pa.array([3_600, None], pa.time32("s")), pa.array([3_600 * 10**9, None], pa.time64("ns")))
    same(pa.array([5, None], pa.duration("ms")), pa.array([5_000_000, None], pa.duration("ns")))
    # beyond int64's nanoseconds (after 2262), alike in every unit, and not the clamped moment
    far = 300_000_000_000  # seconds: the year 11476
    same(
        pa.array([far, -far], pa.timestamp("s")),
        pa.array([far * 10**6, -far * 10**6], pa.timestamp("us")),
    )
    edge = hash_column(pa.table({"c": pa.array([2**63 - 1], pa.timestamp("ns"))}), ["c"])
    beyond = hash_column(pa.table({"c": pa.array([far], pa.timestamp("s"))}), ["c"])
    assert edge != beyond


def test_a_date_hashes_as_its_days_and_a_decimal_as_its_value():
    same(
        pa.array([19_000, -1, None], pa.date32()),
        pa.array([19_000 * 86_400_000, -86_400_000, None], pa.date64()),
    )
    same(
        pa.array([D("1.5"), D("-2"), D("0"), None], pa.decimal128(5, 1)),
        pa.array([D("1.50"), D("-2.00"), D("0.00"), None], pa.decimal128(9, 2)),
        pa.array([D("1.500"), D("-2.000"), D("0.000"), None], pa.decimal256(40, 3)),
    )
    assert hash_column(pa.table({"c": pa.array([D("1.5")])}), ["c"]) != hash_column(
        pa.table({"c": pa.array([D("15")])}), ["c"]
    )


def test_text_bytes_and_lists_hash_alike_in_every_layout():
    text = ["a", None, "long text"]
    same(
        pa.array(text, pa.string()),
        pa.array(text, pa.large_string()),
        pa.array(text, pa.string_view()),
        pa.array(text).dictionary_encode(),
    )
    raw = [b"\x00\x01", None, b"\xff\xfe"]
    same(
        pa.array(raw, pa.binary()),
        pa.array(raw, pa.large_binary()),
        pa.array(raw, pa.binary_view()),
        pa.array(raw, pa.binary(2)),
    )
    vectors = [[1.0, 2.0], None, [3.0, float("nan")]]
    same(
        pa.array(vectors, pa.list_(pa.float64())),
        pa.array(vectors, pa.large_list(pa.float32())),
        pa.array(vectors, pa.list_(pa.float32(), 2)),
        pa.array(vectors, pa.list_view(pa.float64())),
    )
    moments = [[1_000], None, []]
    same(
        pa.array(moments, pa.list_(pa.timestamp("us"))),
        pa.array([[1_000_000], None, []], pa.list_(pa.timestamp("ns"))),
    )


def test_a_struct_hashes_its_moments_and_decimals_by_value():
    us = pa.StructArray.from_arrays(
        [pa.array([1, None], pa.timestamp("us")), pa.array([D("1.5"), D("2")])], ["t", "v"]
    )
    ns = pa.StructArray.from_arrays(
        [
            pa.array([1_000, None], pa.timestamp("ns")),
            pa.array([D("1.50"), D("2.00")], pa.decimal128(8, 2)),
        ],
        ["t", "v"],
    )
    same(us, ns)


def test_every_nan_hashes_alike():
    quiet, other = (
        np.array([np.nan]),
        np.array([0x7FF8000000000001], dtype=np.uint64).view(np.float64),
    )
    same(pa.array(quiet), pa.array(other), pa.array(np.array([np.nan], dtype=np.float32)))


def spark(path: Path, table: pa.Table, **options: object) -> None:
    """As Spark writes Parquet: no Arrow schema in the footer, timestamps as INT96 (or
    coerced to microseconds), no dictionaries."""
    pq.write_table(table, path, store_schema=False, use_dictionary=False, **options)


WRITERS = {
    "pandas": lambda path, src: pq.read_table(src).to_pandas().to_parquet(path),
    "polars": lambda path, src: pl.read_parquet(src).write_parquet(path),
    "spark-int96": lambda path, src: spark(
        path, pq.read_table(src), use_deprecated_int96_timestamps=True
    ),
    "spark-us": lambda path, src: spark(path, pq.read_table(src), coerce_timestamps="us"),
    "pyarrow-ms": lambda path, src: pq.write_table(
        pq.read_table(src), path, coerce_timestamps="ms", row_group_size=2, data_page_size=64
    ),
}
written = st.lists(
    st.tuples(
        st.integers(-(2**40), 2**40),  # no nulls: pandas would write integers with one as floats
        st.none() | st.floats(width=32, allow_nan=False),
        st.none() | st.text(max_size=8),
        st.none() | st.integers(-MICROS // 1000, MICROS // 1000),  # milliseconds: exact in ms
        st.none() | st.integers(-(10**5), 10**5),  # days
        st.none() | st.integers(-(10**15), 10**15),  # a decimal's digits, at scale 2
        st.none() | st.lists(st.floats(width=32, allow_nan=False), max_size=3),
    ),
    min_size=1,
    max_size=12,
)


def first_written(values: list[tuple]) -> pa.Table:
    n, x, t, w, d, m, v = zip(*values, strict=True)
    moments = [None if ms is None else ms * 1000 for ms in w]
    return pa.table(
        {
            "n": pa.array(n, pa.int64()),
            "x": pa.array(x, pa.float32()),
            "t": pa.array(t, pa.string()).dictionary_encode(),
            "w": pa.array(moments, pa.timestamp("us")),
            "z": pa.array(moments, pa.timestamp("us", "UTC")),
            "d": pa.array(d, pa.date32()),
            "m": pa.array(cents(m), pa.decimal128(18, 2)),
            "v": pa.array(v, pa.list_(pa.float32())),
        }
    )


def read_hashes(path: Path) -> list[int]:
    """Each row's hash as a run reads the file: its columns in the reader's layouts."""
    table = normalized(pq.read_table(path))
    return hash_column(table, ["n", "x", "t", "w", "z", "d", "m", "v"]).to_pylist()


@settings(max_examples=100, deadline=None)
@given(values=written, writer=st.sampled_from(sorted(WRITERS)))
def test_a_file_rewritten_by_another_writer_keeps_its_rows_hashes(
    values: list[tuple], writer: str, tmp_path_factory: pytest.TempPathFactory
):
    """Real writers, each in its own layout: pandas' (pyarrow engine: large strings,
    nanoseconds), polars' (large lists, its own dictionaries and statistics), Spark's (INT96
    or microseconds, no Arrow schema: a zoned timestamp comes back naive, a dictionary as
    text), pyarrow's milliseconds in tiny row groups and pages."""
    folder = tmp_path_factory.mktemp("writers")
    pq.write_table(first_written(values), folder / "first.parquet")
    WRITERS[writer](folder / "again.parquet", folder / "first.parquet")
    assert read_hashes(folder / "again.parquet") == read_hashes(folder / "first.parquet")
