"""A row's hash: what of an input row is scored, as one 64-bit number, the same forever.

With ``[input].increments = "rows"`` a row is known by its id and this hash of the values that
reach the model and the output (the task's input columns, then the `keep` columns, each by
name): a committed row whose id and hash are both in the input is not scored again, and one
whose hash changed is. The job's settings (model, prompt, precision) are not hashed: they are
the folder's fingerprint, which refuses a change (`batchscore.output.claim`).

The hash is defined here, not borrowed from a library whose hash may change between versions
(polars' and DuckDB's say so): numbers are mixed word by word with MurmurHash3's 64-bit
finalizer, vectorized with numpy (a million rows of eight features in a few tens of
milliseconds), and text or bytes by BLAKE2b per value. Values are hashed as the reader hands
them on (`batchscore.work.columns`: one layout per kind), integers as int64 and floats as
float64, so a shard rewritten by another writer (polars' large strings, float32 written as
float64) keeps its rows' hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchscore.job.sections import InputConfig
from batchscore.work.columns import undecoded

U64 = np.uint64
C1, C2 = U64(0xFF51AFD7ED558CCD), U64(0xC4CEB9FE1A85EC53)  # MurmurHash3's fmix64
STEP = U64(0x9E3779B97F4A7C15)  # the golden ratio's 64 bits: each step of a fold
# tags that keep values of different kinds apart (a null, a number, a text, a list, a length,
# the rest)
NULL, NUMBER, TEXT, LIST, LENGTH, OTHER = (
    U64(v) for v in (0x6E756C6C, 0x6E756D, 0x74657874, 0x6C69, 0x6C656E, 0x6F)
)


BYTES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)


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
    """One uint64 per value: its hash, nulls all alike."""
    kind = values.type
    types = pa.types
    if types.is_null(kind):
        return np.full(len(values), NULL, dtype=U64)
    if types.is_dictionary(kind):
        return value_words(values.dictionary_decode())
    if types.is_boolean(kind) or types.is_integer(kind) or types.is_temporal(kind):
        words = numbers(values, pa.int64() if kind != pa.uint64() else pa.uint64())
    elif types.is_floating(kind):
        words = numbers(values, pa.float64())
    elif any(test(kind) for test in BYTES):
        words = texts(values)
    elif types.is_string_view(kind) or types.is_binary_view(kind):
        words = texts(values.cast(pa.string() if types.is_string_view(kind) else pa.binary()))
    elif types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind):
        words = lists(values)
    else:  # anything else (decimals, structs, maps) by its Python value: slower, as stable
        words = by_repr(values)
    return mark_nulls(values, words)


def mark_nulls(values: pa.Array, words: np.ndarray) -> np.ndarray:
    if values.null_count:
        words = np.where(flat(pc.cast(values.is_null(), pa.int8()), np.int8) != 0, NULL, words)
    return words


def numbers(values: pa.Array, wide: pa.DataType) -> np.ndarray:
    """Numbers (booleans, integers, moments as their counts) as 64-bit words, mixed."""
    kind = values.type
    if pa.types.is_temporal(kind):
        values = values.view(pa.int64()) if kind.bit_width == 64 else values.view(pa.int32())
    if pa.types.is_boolean(values.type):
        values = pc.cast(values, pa.int8())
    filled = values.fill_null(0) if values.null_count else values
    return fmix(flat(pc.cast(filled, wide), U64) ^ NUMBER)  # the 64 bits, whatever their kind


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
    offsets = flat(values.offsets, np.int64 if pa.types.is_large_list(values.type) else np.int32)
    offsets = offsets.astype(np.int64)
    inner = value_words(values.values.slice(offsets[0], offsets[-1] - offsets[0]))
    offsets = offsets - offsets[0]
    lengths = np.diff(offsets)
    h = fmix(lengths.astype(U64) ^ LENGTH)
    active, k = np.flatnonzero(lengths > 0), 0
    while active.size:
        h[active] = fmix(h[active] * STEP + inner[offsets[active] + k])
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
