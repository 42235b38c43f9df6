"""The reader: shard discovery and order, chunk plans, row ranges streamed in bounded windows."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.errors import InputDataError, JobError
from batchscore.job.sections import InputConfig
from batchscore.output.layout import shard_key
from batchscore.output.pending import chunks_of
from batchscore.pipeline.reader import read_windows
from batchscore.pipeline.shards import check_columns, find_shards, open_shard


def make(path: Path, rows: int, row_group_size: int = 7) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": list(range(rows)), "text": [f"row {i}" for i in range(rows)]})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def test_folder_glob_and_list_in_sorted_order(tmp_path: Path):
    for name in ["b.parquet", "a.parquet", "sub/c.parquet", "_tmp/d.parquet", ".x.parquet"]:
        make(tmp_path / "in" / name, 3)
    (tmp_path / "in" / "notes.txt").write_text("not a shard")
    folder = find_shards(InputConfig(path=(str(tmp_path / "in"),)))
    assert [Path(s.path).relative_to(tmp_path / "in").as_posix() for s in folder] == [
        "a.parquet",
        "b.parquet",
        "sub/c.parquet",
    ]
    assert [s.index for s in folder] == [0, 1, 2]
    globbed = find_shards(InputConfig(path=(str(tmp_path / "in" / "*.parquet"),)))
    assert [Path(s.path).name for s in globbed] == ["a.parquet", "b.parquet"]
    listed = find_shards(
        InputConfig(path=(str(tmp_path / "in" / "b.parquet"), str(tmp_path / "in")))
    )
    assert len(listed) == 3  # b.parquet named twice counts once


def test_shards_are_named_by_their_real_path_through_links(tmp_path: Path):
    """A shard reached through a linked folder or a linked file is the file it points to,
    named once, as `os.path.realpath` names it (each folder is resolved once, not per shard)."""
    real = make(tmp_path / "data" / "a.parquet", 3)
    make(tmp_path / "data" / "b.parquet", 3)
    (tmp_path / "linked").symlink_to(tmp_path / "data")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "c.parquet").symlink_to(real)
    through_folder = find_shards(InputConfig(path=(str(tmp_path / "linked"),)))
    assert [s.path for s in through_folder] == [
        os.path.realpath(tmp_path / "data" / name) for name in ("a.parquet", "b.parquet")
    ]
    both = find_shards(InputConfig(path=(str(tmp_path / "files"), str(tmp_path / "linked"))))
    assert [s.path for s in both] == [s.path for s in through_folder]  # a.parquet counts once


def test_missing_inputs_are_named(tmp_path: Path):
    with pytest.raises(JobError, match="no such file or folder"):
        find_shards(InputConfig(path=(str(tmp_path / "nope"),)))
    (tmp_path / "empty").mkdir()
    with pytest.raises(JobError, match="matches no Parquet files"):
        find_shards(InputConfig(path=(str(tmp_path / "empty"),)))


def test_chunk_plan_is_fixed_ranges(tmp_path: Path):
    shard = find_shards(InputConfig(path=(str(make(tmp_path / "s.parquet", 10)),)))[0]
    chunks = chunks_of(shard, 10, 4)
    assert [(c.start, c.stop, c.of) for c in chunks] == [(0, 4, 3), (4, 8, 3), (8, 10, 3)]
    # keyed by a digest of the shard's path, never by its position or the raw path
    assert shard.key == shard_key(shard.path) and len(shard.key) == 16
    assert [c.key for c in chunks] == [f"{shard.key}-0000{i}" for i in range(3)]
    assert [(c.start, c.stop) for c in chunks_of(shard, 0, 4)] == [(0, 0)]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(0, 60),
    group=st.integers(1, 20),
    chunk_rows=st.integers(1, 25),
    window=st.integers(1, 30),
)
def test_windows_cover_exactly_the_chunk(tmp_path_factory, rows, group, chunk_rows, window):
    path = make(tmp_path_factory.mktemp("r") / "s.parquet", rows, group)
    shard = find_shards(InputConfig(path=(str(path),)))[0]
    seen = []
    for chunk in chunks_of(shard, rows, chunk_rows):
        tables = list(read_windows(chunk, ("id",), window))
        assert tables, "every chunk yields at least one (maybe empty) window"
        assert all(t.num_rows <= window for t in tables)
        ids = [i for t in tables for i in t.column("id").to_pylist()]
        assert ids == list(range(chunk.start, chunk.stop))
        seen += ids
    assert seen == list(range(rows))


def test_only_the_needed_columns_are_read(tmp_path: Path):
    path = make(tmp_path / "s.parquet", 5)
    shard = find_shards(InputConfig(path=(str(path),)))[0]
    (table,) = read_windows(chunks_of(shard, 5, 10)[0], ("text",), 10)
    assert table.column_names == ["text"]


def test_column_problems_name_shard_and_column(tmp_path: Path):
    path = make(tmp_path / "s.parquet", 3)
    shard = find_shards(InputConfig(path=(str(path),)))[0]
    schema = open_shard(shard).schema_arrow
    with pytest.raises(InputDataError, match=r"s\.parquet: missing column\(s\) lang, body"):
        check_columns(shard, schema, ("lang",), {"body": "text"})
    with pytest.raises(InputDataError, match="column 'id' is int64, expected a string column"):
        check_columns(shard, schema, (), {"id": "text"})
    with pytest.raises(InputDataError, match="'text' is string, expected numbers or a list"):
        check_columns(shard, schema, ("id",), {"text": "numeric"})
    check_columns(shard, schema, ("text",), {"id": "numeric"})


def test_corrupt_file_is_named(tmp_path: Path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    shard = find_shards(InputConfig(path=(str(bad),)))[0]
    with pytest.raises(InputDataError, match=r"bad\.parquet: not a readable Parquet file"):
        open_shard(shard)


def test_object_store_errors_are_transient_unless_about_the_data():
    from batchscore.storage.retry import is_transient

    network = "AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 7"
    assert is_transient(OSError(network))
    assert is_transient(OSError("AWS Error SLOW_DOWN during GetObject operation"))
    assert not is_transient(OSError("AWS Error ACCESS_DENIED during GetObject operation"))
    assert not is_transient(OSError("AWS Error NO_SUCH_KEY during HeadObject operation"))
    assert not is_transient(OSError("Couldn't deserialize thrift: TProtocolException"))
    assert not is_transient(ValueError("AWS Error NETWORK_CONNECTION"))
