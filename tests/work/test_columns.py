"""Which types hold which (`batchscore.work.columns.holds`, `same_kind`, `common`), and
`cast_exactly`: a cast to a type that holds the values never changes one, and a cast to a
narrower type of the same kind either keeps every value or names the first that it would
change (Arrow's safe cast lets float64 -> float32 round silently)."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.work.columns import InexactCast, cast_exactly, common, holds, same_kind
from batchscore.work.row_hash import value_words

D = decimal.Decimal
TS = pa.timestamp
HELD = [  # (folder's type, a shard's): every value of the second fits the first
    (pa.int64(), pa.int32()),
    (pa.int64(), pa.uint32()),
    (pa.float64(), pa.float32()),
    (pa.string(), pa.large_string()),
    (pa.string(), pa.string_view()),
    (pa.string(), pa.dictionary(pa.int8(), pa.string())),
    (pa.binary(), pa.large_binary()),
    (TS("ns"), TS("us")),
    (TS("ns"), TS("us", "UTC")),  # naive and UTC: the same numbers (INT96, Spark)
    (TS("ns", "UTC"), TS("ms", "Asia/Tokyo")),  # zoned: the same instants
    (pa.date32(), pa.date64()),
    (pa.decimal128(10, 3), pa.decimal128(5, 2)),
    (pa.decimal256(40, 2), pa.decimal128(38, 2)),
    (pa.list_(pa.float64()), pa.large_list(pa.float32())),
    (pa.int64(), pa.null()),
]
OF_A_KIND = [  # some values fit, each checked
    (pa.int32(), pa.int64()),
    (pa.int64(), pa.uint64()),
    (pa.float32(), pa.float64()),
    (TS("us"), TS("ns")),
    (pa.decimal128(5, 1), pa.decimal128(38, 2)),
    (pa.list_(pa.float32()), pa.list_(pa.float64())),
]
NEVER = [  # two kinds: never cast
    (pa.int64(), pa.string()),
    (pa.bool_(), pa.int8()),
    (pa.int64(), pa.float64()),
    (pa.float64(), pa.int64()),
    (pa.string(), pa.binary()),
    (TS("ns"), TS("ns", "Europe/Paris")),  # a wall clock and an instant differ by the offset
    (TS("ns"), pa.date32()),
    (pa.null(), pa.string()),  # a folder of nulls only cannot take a type
    (pa.list_(pa.int64(), 2), pa.list_(pa.int64())),
]


@pytest.mark.parametrize(("target", "found"), HELD)
def test_a_type_holds_the_narrower_layouts_of_its_kind(target, found):
    assert holds(target, found) and same_kind(target, found)


@pytest.mark.parametrize(("target", "found"), OF_A_KIND)
def test_a_narrower_type_of_the_same_kind_is_checked_value_by_value(target, found):
    assert same_kind(target, found) and not holds(target, found)


@pytest.mark.parametrize(("target", "found"), NEVER)
def test_two_kinds_never_cast(target, found):
    assert not same_kind(target, found)


def test_the_first_run_settles_the_narrowest_type_that_holds_both():
    assert common(pa.float32(), pa.float64()) == pa.float64()
    assert common(pa.decimal128(3, 2), pa.decimal128(5, 1)) == pa.decimal128(6, 2)
    assert common(pa.null(), pa.string()) == pa.string()
    assert common(pa.int64(), pa.uint64()) is None
    assert common(pa.int64(), pa.string()) is None


floats = st.floats(allow_nan=True, allow_infinity=True)
nanoseconds = st.integers(-(2**62), 2**62)


@settings(max_examples=200, deadline=None)
@given(
    pair=st.sampled_from(
        [
            ("float", pa.float64(), pa.float32()),
            ("float", pa.float32(), pa.float64()),
            ("ns", TS("ns"), TS("us")),
            ("ns", TS("us"), TS("ns")),
            ("cents", pa.decimal128(20, 2), pa.decimal128(8, 1)),
            ("cents", pa.decimal128(8, 1), pa.decimal128(20, 2)),
        ]
    ),
    data=st.data(),
)
def test_a_cast_keeps_every_value_or_names_the_first_it_would_change(pair, data):
    kind, found, target = pair
    if kind == "float":
        values = data.draw(st.lists(st.none() | floats, min_size=1, max_size=12))
        column = pa.array(values, pa.float64()).cast(found)
    elif kind == "ns":
        values = data.draw(st.lists(st.none() | nanoseconds, min_size=1, max_size=12))
        scale = 1 if found == TS("ns") else 1000
        column = pa.array([v if v is None else v // scale for v in values], found)
    else:
        digits = st.integers(-(10**6), 10**6)
        values = data.draw(st.lists(st.none() | digits, min_size=1, max_size=12))
        scale = found.scale
        column = pa.array([v if v is None else D(v).scaleb(-scale) for v in values], found)
    table = pa.table({"c": column})
    schema = pa.schema([("c", target)])
    try:
        cast = cast_exactly(table, schema)
    except InexactCast as exc:
        assert not holds(target, found) and exc.column == "c"
        if exc.row >= 0:  # the row named is one whose value would change
            before = value_words(column.slice(exc.row, 1))
            after = value_words(pa.compute.cast(column.slice(exc.row, 1), target, safe=False))
            assert before[0] != after[0]
        return
    assert cast.schema == schema
    assert (value_words(cast["c"].combine_chunks()) == value_words(column)).all()
