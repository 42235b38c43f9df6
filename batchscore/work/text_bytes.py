"""Texts as their bytes: an input's text is checked row by row where it is read
(`batchscore.models.text.inputs`), and a row whose bytes are not UTF-8 is that row's error
there; anything that turns a column into Python objects before that (a sample drawn for the
quality gate, a row's hash, the rejected rows' listing) reads the bytes, so one bad row never
raises for the whole window."""

from __future__ import annotations

import pyarrow as pa

from batchscore.work.shards import is_text


def undecoded_type(kind: pa.DataType) -> pa.DataType:
    """``kind`` with every text in it, nested ones too, as bytes (dictionaries decoded)."""
    types = pa.types
    if types.is_dictionary(kind):
        return undecoded_type(kind.value_type)
    if is_text(kind):
        return pa.large_binary()
    if types.is_struct(kind):
        return pa.struct([field.with_type(undecoded_type(field.type)) for field in kind])
    if types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind):
        inner = kind.value_field.with_type(undecoded_type(kind.value_type))
        if types.is_fixed_size_list(kind):
            return pa.list_(inner, kind.list_size)
        return pa.large_list(inner) if types.is_large_list(kind) else pa.list_(inner)
    if types.is_map(kind):
        return pa.map_(undecoded_type(kind.key_type), undecoded_type(kind.item_type))
    return kind


def undecoded(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``column`` with its texts as their bytes, so that turning it into Python objects never
    decodes UTF-8: an input's text is checked row by row where it is read
    (`batchscore.models.text.inputs`), and a row of bytes that are not UTF-8 is that row's
    error there, where ``to_pylist`` on the column would raise for the whole window."""
    target = undecoded_type(column.type)
    return column if target.equals(column.type) else column.cast(target)
