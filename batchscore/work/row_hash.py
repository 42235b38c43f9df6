"""A row's hash: what of an input row is scored, as one 64-bit number, the same forever.

With ``[input].increments = "rows"`` a row is known by its id and this hash of the values that
reach the model and the output (the task's input columns, then the `keep` columns, each by
name): a committed row whose id and hash are both in the input is not scored again, and one
whose hash changed is. The job's settings (model, prompt, precision) are not hashed: they are
the folder's fingerprint, which refuses a change (`batchscore.output.claim`).

The hash is defined here, not borrowed from a library whose hash may change between versions
(polars' and DuckDB's say so): numbers are mixed word by word with MurmurHash3's 64-bit
finalizer, vectorized with numpy (a million rows of eight features in a few tens of
milliseconds), and text or bytes by BLAKE2b per value.

It hashes a value, never its storage, so a shard rewritten by another writer (pandas, polars,
Spark) keeps its rows' hashes: integers of any width as int64, floats as float64 (a float32
widened is the same value; every NaN alike), text and bytes in any layout (large, view,
dictionary, fixed size) as their bytes, lists of any layout as their elements; moments
(timestamps, times, durations) as nanoseconds whatever their unit (an INT96 timestamp as
Spark writes it, or one coerced to microseconds, hashes as pandas' nanoseconds), the time zone
not hashed (the same stored instant is the same value; a naive timestamp counts as its UTC
wall clock); a date as its days (date32 or date64); a decimal as its value whatever its
precision, scale or width (1.50 at scale 2 is 1.5 at scale 1). Where the first version
already hashed the value (integers, floats, text, bytes, lists, timestamp[ns], date32,
decimals without trailing zeros after the point), the words are unchanged, so a folder's
committed hashes still hold and nothing is scored again for this change alone.
"""

from __future__ import annotations

import decimal
import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchscore.job.sections import InputConfig
from batchscore.work.text_bytes import undecoded

U64 = np.uint64
C1, C2 = U64(0xFF51AFD7ED558CCD), U64(0xC4CEB9FE1A85EC53)  # MurmurHash3's fmix64
STEP = U64(0x9E3779B97F4A7C15)  # the golden ratio's 64 bits: each step of a fold
# tags that keep values of different kinds apart (a null, a number, a text, a list, a length,
# the rest)
NULL, NUMBER, TEXT, LIST, LENGTH, OTHER, FAR = (
    U64(v) for v in (0x6E756C6C, 0x6E756D, 0x74657874, 0x6C69, 0x6C656E, 0x6F, 0x666172)
)
NAN = U64(0x7FF8000000000000)  # the NaN numpy and pandas write: every NaN hashes as it
NANOS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}  # a moment's unit in nanoseconds
DAY_MS = 86_400_000  # a date64's day
INT64_MAX = np.iinfo(np.int64).max

BYTES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)
LISTS = (
    pa.types.is_list,
    pa.types.is_large_list,
    pa.types.is_fixed_size_list,
    pa.types.is_list_view,
    pa.types.is_large_list_view,
)
VIEWS = {"string_view": pa.string(), "binary_view": pa.binary()}


def hashed_columns(inp: InputConfig, kinds: dict[str, str]) -> tuple[str, ...]:
    """The columns a row's hash covers: the task's inputs (``kinds``), then the `keep` columns
    (the id is the row's key, not its value)."""
    return tuple(c for c in dict.fromkeys([*kinds, *inp.keep]) if c != inp.id)


def fmix(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's finalizer: every input bit flips about half the output bits."""
    h = h ^ (h >> U64(33))
    h = h * C1
    h = h ^ (h >> U64(33))
    h = h * C2
    return h ^ (h >> U64(33))


def name_word(name: str) -> np.uint64:
    """A column's name as a word, so that swapping two columns' values changes the hash."""
    return U64(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little"))


def row_hashes(table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """Each row's hash over ``columns`` of ``table`` (uint64, one per row)."""
    h = np.zeros(table.num_rows, dtype=U64)
    with np.errstate(over="ignore"):
        for name in columns:
            column = table.column(name)
            values = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
            h = fmix(h * STEP + (value_words(values) ^ name_word(name)))
    return h


def hash_column(table: pa.Table, columns: Sequence[str]) -> pa.Array:
    """`row_hashes` as the output column holds them: int64 (the same 64 bits)."""
    values = row_hashes(table, columns).view(np.int64)  # from the buffer: no pandas check
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def value_words(values: pa.Array) -> np.ndarray:
    """One uint64 per value: its hash, nulls all alike, whatever layout holds it."""
    kind = values.type
    types = pa.types
    if isinstance(values, pa.ExtensionArray):  # a UUID's, say: its storage holds the value
        return value_words(values.storage)
    if types.is_null(kind):
        return np.full(len(values), NULL, dtype=U64)
    if types.is_dictionary(kind):
        return value_words(values.dictionary_decode())
    if types.is_boolean(kind) or types.is_integer(kind):
        words = numbers(values, pa.int64() if kind != pa.uint64() else pa.uint64())
    elif types.is_date(kind):
        words = days(values)
    elif types.is_timestamp(kind) or types.is_time(kind) or types.is_duration(kind):
        words = nanoseconds(values)
    elif types.is_floating(kind):
        words = floats(values)
    elif any(test(kind) for test in BYTES):
        words = texts(values)
    elif str(kind) in VIEWS or types.is_fixed_size_binary(kind):
        words = texts(values.cast(VIEWS.get(str(kind), pa.binary())))
    elif any(test(kind) for test in LISTS):
        words = lists(values)
    elif types.is_decimal(kind):
        words = decimals(values)
    else:  # anything else (structs, maps) by its Python value, moments and decimals inside
        words = by_repr(plain(values))  # as their words: slower, as stable
    return mark_nulls(values, words)


def mark_nulls(values: pa.Array, words: np.ndarray) -> np.ndarray:
    if values.null_count:
        words = np.where(flat(pc.cast(values.is_null(), pa.int8()), np.int8) != 0, NULL, words)
    return words


def numbers(values: pa.Array, wide: pa.DataType) -> np.ndarray:
    """Numbers (booleans, integers) as 64-bit words, mixed."""
    if pa.types.is_boolean(values.type):
        values = pc.cast(values, pa.int8())
    filled = values.fill_null(0) if values.null_count else values
    return fmix(flat(pc.cast(filled, wide), U64) ^ NUMBER)  # the 64 bits, whatever their kind


def counts(values: pa.Array) -> np.ndarray:
    """A moment's or a date's stored count as int64 (what a null holds is left to
    `mark_nulls`)."""
    width = values.type.bit_width
    return flat(
        values.view(pa.int64() if width == 64 else pa.int32()),
        np.int64 if width == 64 else np.int32,
    ).astype(np.int64)


def days(values: pa.Array) -> np.ndarray:
    """A date as its days since the epoch, date32 or date64 (whose milliseconds are whole days
    by Arrow's definition; one that is not hashes as the moment it counts)."""
    found = counts(values)
    if pa.types.is_date32(values.type):
        return fmix(found.view(U64) ^ NUMBER)
    whole = found % DAY_MS == 0
    words = fmix((found // DAY_MS).view(U64) ^ NUMBER)
    return np.where(whole, words, far(found, 1000)) if not whole.all() else words


def nanoseconds(values: pa.Array) -> np.ndarray:
    """A timestamp, time or duration as its count of nanoseconds, whatever its unit (the zone
    is a label on the same stored instant, not hashed). One past int64's nanoseconds (beyond
    the years 1677-2262) as its seconds and nanoseconds (`far`), in every unit alike."""
    found = counts(values)
    factor = NANOS[values.type.unit]
    if factor == 1:
        return fmix(found.view(U64) ^ NUMBER)
    near = np.abs(found) <= INT64_MAX // factor
    words = fmix((np.where(near, found, 0) * np.int64(factor)).view(U64) ^ NUMBER)
    return words if near.all() else np.where(near, words, far(found, 10**9 // factor))


def far(found: np.ndarray, per_second: int) -> np.ndarray:
    """Counts of ``per_second`` units a second, as seconds and nanoseconds: the words of
    moments too far for int64's nanoseconds, alike in every unit."""
    seconds, rest = np.divmod(found, np.int64(per_second))
    nanos = rest * np.int64(10**9 // per_second)
    return fmix(fmix(seconds.view(U64) ^ FAR) * STEP + nanos.view(U64))


def floats(values: pa.Array) -> np.ndarray:
    """Floats as float64 (float16 and float32 widen exactly: the same value), every NaN as
    one."""
    filled = values.fill_null(0) if values.null_count else values
    wide = flat(pc.cast(filled, pa.float64()), np.float64)
    bits = wide.view(U64)
    nan = np.isnan(wide)
    return fmix((np.where(nan, NAN, bits) if nan.any() else bits) ^ NUMBER)


def decimals(values: pa.Array) -> np.ndarray:
    """A decimal as its value, whatever its width, precision or scale: its digits without
    the zeros that end its fraction (1.50 is 1.5), by BLAKE2b as the first version hashed
    every decimal (by its text, ``Decimal('1.5')``), so one without such zeros keeps its
    word."""
    blake = hashlib.blake2b
    words = (
        int.from_bytes(blake(repr(trimmed(v)).encode(), digest_size=8).digest(), "little")
        for v in values.to_pylist()
    )
    return np.fromiter(words, dtype=U64, count=len(values)) ^ OTHER


def trimmed(value: decimal.Decimal | None) -> decimal.Decimal | None:
    """A decimal without the zeros that end its fraction (zero as ``0``); never rounded."""
    if value is None:
        return None
    sign, digits, exponent = value.as_tuple()
    if not any(digits):
        return decimal.Decimal(0)
    assert isinstance(exponent, int)  # Arrow's decimals are finite
    while exponent < 0 and digits[-1] == 0:
        digits, exponent = digits[:-1], exponent + 1
    return decimal.Decimal((sign, digits, exponent))


def flat(values: pa.Array, dtype: type) -> np.ndarray:
    """A fixed-width array without nulls as numpy, from its buffer (`to_numpy` imports
    pandas, seconds of a short run's start)."""
    data = np.frombuffer(values.buffers()[1], dtype=dtype)
    return data[values.offset : values.offset + len(values)]


def texts(values: pa.Array) -> np.ndarray:
    """Text or bytes: BLAKE2b of each value's bytes, read straight from the Arrow buffers."""
    offsets_buffer, data_buffer = values.buffers()[1:3]
    large = pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type)
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if large else np.int32)
    offsets = offsets[values.offset : values.offset + len(values) + 1]
    data = memoryview(data_buffer) if data_buffer is not None else memoryview(b"")
    blake = hashlib.blake2b
    starts, stops = offsets[:-1].tolist(), offsets[1:].tolist()
    found = np.fromiter(
        (
            int.from_bytes(blake(data[a:b], digest_size=8).digest(), "little")
            for a, b in zip(starts, stops, strict=True)
        ),
        dtype=U64,
        count=len(values),
    )
    return found ^ TEXT


def lists(values: pa.Array) -> np.ndarray:
    """A list's elements folded in order, its length first (the elements are read from the
    child array by the offsets, so a null list with elements behind it stays aligned)."""
    if pa.types.is_fixed_size_list(values.type):
        size = values.type.list_size
        child = values.values.slice(values.offset * size, len(values) * size)
        matrix = value_words(child).reshape(len(values), size)
        h = fmix(np.full(len(values), U64(size), dtype=U64) ^ LENGTH)
        for k in range(size):
            h = fmix(h * STEP + matrix[:, k])
        return h ^ LIST
    if pa.types.is_list_view(values.type) or pa.types.is_large_list_view(values.type):
        wide = np.int64 if pa.types.is_large_list_view(values.type) else np.int32
        starts = flat(values.offsets, wide).astype(np.int64)
        lengths = flat(values.sizes, wide).astype(np.int64)
        if values.null_count:  # a null view's size may be anything: it is `mark_nulls`'
            lengths[np.asarray(values.is_null().to_pylist(), dtype=bool)] = 0
        return folded(starts, lengths, value_words(values.values))
    offsets = flat(values.offsets, np.int64 if pa.types.is_large_list(values.type) else np.int32)
    offsets = offsets.astype(np.int64)
    inner = value_words(values.values.slice(offsets[0], offsets[-1] - offsets[0]))
    offsets = offsets - offsets[0]
    return folded(offsets[:-1], np.diff(offsets), inner)


def folded(starts: np.ndarray, lengths: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """Each list's length, then its elements' words (``inner`` from ``starts``), folded."""
    h = fmix(lengths.astype(U64) ^ LENGTH)
    active, k = np.flatnonzero(lengths > 0), 0
    while active.size:
        h[active] = fmix(h[active] * STEP + inner[starts[active] + k])
        k += 1
        active = active[lengths[active] > k]
    return h ^ LIST


def by_repr(values: pa.Array) -> np.ndarray:
    blake = hashlib.blake2b
    return (
        np.fromiter(
            (
                int.from_bytes(blake(repr(v).encode(), digest_size=8).digest(), "little")
                for v in python_values(values)
            ),
            dtype=U64,
            count=len(values),
        )
        ^ OTHER
    )


def python_values(values: pa.Array) -> list:
    """``values`` as Python objects; a value holding text that is not UTF-8 (in a struct, a
    map) as its texts' bytes, where ``to_pylist`` would fail for every row: the row is hashed
    (and refused as a row error, if the task reads it), and every other row's hash is kept."""
    try:
        return values.to_pylist()
    except UnicodeDecodeError:
        raw = undecoded(values)
        out = []
        for i in range(len(values)):
            try:
                out.append(values[i].as_py())
            except UnicodeDecodeError:
                out.append(raw[i].as_py())
        return out


def plain(values: pa.Array) -> pa.Array:
    """A struct with each field whose Python value shows its storage (moments, decimals, and
    lists or structs of them) as its words in hex, so that `by_repr` reads values; a struct
    with none is left as it is (its words unchanged since the first version)."""
    kind = values.type
    if not pa.types.is_struct(kind) or not any(stored(f.type) for f in kind):
        return values
    fields = values.flatten()  # each field sliced as the struct is, its nulls merged in
    kept = [plain(f) if pa.types.is_struct(f.type) else f for f in fields]
    kept = [words_text(f) if stored(f.type) else f for f in kept]
    names = [f.name for f in kind]
    mask = values.is_null() if values.null_count else None
    return pa.StructArray.from_arrays(kept, names=names, mask=mask)


def stored(kind: pa.DataType) -> bool:
    """Whether a value's Python form depends on its storage: a moment's on its unit (and on
    pandas being there), a decimal's on its scale; also in lists and structs of them."""
    types = pa.types
    if types.is_temporal(kind) or types.is_decimal(kind):
        return True
    if types.is_dictionary(kind):
        return stored(kind.value_type)
    if types.is_struct(kind):
        return any(stored(f.type) for f in kind)
    if types.is_map(kind):
        return stored(kind.key_type) or stored(kind.item_type)
    return any(test(kind) for test in LISTS) and stored(kind.value_type)


def words_text(values: pa.Array) -> pa.Array:
    """Each value's words as 16 hex digits (a null stays null)."""
    nulls = values.is_null().to_pylist()
    words = value_words(values).tolist()
    return pa.array([None if n else f"{w:016x}" for w, n in zip(words, nulls, strict=True)])
