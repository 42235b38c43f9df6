"""The reader: shard discovery and order, chunk plans, row ranges streamed in bounded windows."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.errors import InputDataError, JobError
from batchscore.job.sections import InputConfig
from batchscore.pipeline.reader import read_windows
from batchscore.storage.layout import shard_key
from batchscore.work.shards import (
    ShardChangedError,
    check_columns,
    check_unchanged,
    find_shards,
    open_shard,
)
from batchscore.work.units import Shard, chunks_of


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


def found(path: Path) -> Shard:
    """The shard as a run finds it, its file last written an hour ago (so a rewrite now gets
    another mtime, whatever the file system's clock granularity)."""
    hour_ago = time.time_ns() - 3600 * 10**9
    os.utime(path, ns=(hour_ago, hour_ago))
    return find_shards(InputConfig(path=(str(path),)))[0]


def rewrite(path: Path, rows: int) -> None:
    """The shard written again in place (same inode): other texts of the same length."""
    table = pa.table({"id": list(range(rows)), "text": [f"ROW {i}" for i in range(rows)]})
    pq.write_table(table, path, row_group_size=7)


def test_a_shard_rewritten_between_chunks_fails_named(tmp_path: Path):
    """Rewritten (same size, other texts) after its first chunk was read: the next chunk is
    refused, naming the shard, rather than read from the new version under the old identity."""
    path = make(tmp_path / "s.parquet", 20)
    shard = found(path)
    first, second = chunks_of(shard, 20, 10)
    assert [t["id"].to_pylist() for t in read_windows(first, ("id",), 4)][-1] == [8, 9]
    size = path.stat().st_size
    rewrite(path, 20)
    assert path.stat().st_size == size  # only the mtime tells
    said = r"s\.parquet: changed while the run read it \(rewritten: same size, another mod"
    with pytest.raises(ShardChangedError, match=said):
        list(read_windows(second, ("text",), 4))


def test_a_chunk_whose_shard_changes_while_it_is_read_never_completes(tmp_path: Path):
    """The chunk's last rows are held back until the shard is found unchanged: a chunk read
    partly from each version never reaches the writer whole, so it can never be committed."""
    path = make(tmp_path / "s.parquet", 20)
    (chunk,) = chunks_of(found(path), 20, 20)
    tables = read_windows(chunk, ("text",), 4)
    seen = [next(tables)["text"].to_pylist()]
    rewrite(path, 20)
    with pytest.raises(ShardChangedError):
        seen += [t["text"].to_pylist() for t in tables]
    assert sum(len(ids) for ids in seen) < chunk.rows  # the chunk never came out whole


def test_a_shard_shortened_or_removed_mid_run_fails_named(tmp_path: Path):
    """Shortened below a chunk the plan cut from its old footer (once a TypeError), or removed:
    the shard fails, named, with what changed."""
    path = make(tmp_path / "s.parquet", 30)
    chunks = chunks_of(found(path), 30, 10)
    rewrite(path, 5)
    said = (
        r"s\.parquet: changed while the run read it \(\d+ bytes then, \d+ now\); no chunk read "
        "from it since is committed: run again to score it whole"
    )
    with pytest.raises(ShardChangedError, match=said):
        list(read_windows(chunks[2], ("id",), 4))
    path.unlink()
    with pytest.raises(ShardChangedError, match=r"s\.parquet: changed .* \(it is gone\)"):
        list(read_windows(chunks[0], ("id",), 4))


def test_an_unchanged_shard_passes_and_a_failed_read_of_a_changed_one_says_it_changed(
    tmp_path: Path,
):
    path = make(tmp_path / "s.parquet", 12)
    shard = found(path)
    check_unchanged(shard)  # as found: nothing to say
    rewrite(path, 3)
    with pytest.raises(ShardChangedError, match=r"\d+ bytes then, \d+ now") as info:
        check_unchanged(shard, cause=InputDataError("ended 9 rows short"))
    assert isinstance(info.value.__cause__, InputDataError)
    path.unlink()
    with pytest.raises(ShardChangedError, match=r"\(it is gone\)"):
        check_unchanged(shard)


@pytest.mark.s3
def test_an_object_rewritten_in_the_store_while_it_is_read_is_noticed(bucket: str, tmp_path: Path):
    """In an object store too (its HEAD gives mtimes to the second, its listing finer): an
    object found as it is passes, one written again fails its next chunk, named."""
    url = f"{bucket}/in/s.parquet"
    pafs.copy_files(str(make(tmp_path / "s.parquet", 20)), url)
    shard = find_shards(InputConfig(path=(f"{bucket}/in/",)))[0]
    check_unchanged(shard)
    first, second = chunks_of(shard, 20, 10)
    assert [t.num_rows for t in read_windows(first, ("id",), 4)] == [4, 4, 2]
    pafs.copy_files(str(make(tmp_path / "short.parquet", 5)), url)
    with pytest.raises(ShardChangedError, match=r"s\.parquet: changed while the run read it"):
        list(read_windows(second, ("id",), 4))
