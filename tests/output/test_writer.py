"""The writer, by round trip: what goes in comes back, and nothing half-written is visible."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.errors import OutputConflictError, WriteError
from batchscore.output.manifest import facts_of
from batchscore.output.writer import ChunkWriter
from batchscore.storage.disk import LocalStore

SCHEMA = pa.schema([("id", pa.string()), ("embedding", pa.list_(pa.float32()))])


def visible(folder: Path) -> list[str]:
    """What a dataset reader would pick up: *.parquet outside `_`/`.` names."""
    return sorted(p.name for p in folder.glob("*.parquet") if not p.name.startswith((".", "_")))


@settings(max_examples=30, deadline=None)
@given(
    windows=st.lists(
        st.lists(
            st.tuples(st.text(max_size=20), st.lists(st.floats(width=32), max_size=4)),
            max_size=10,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_round_trip(tmp_path_factory, windows):
    out = tmp_path_factory.mktemp("out")
    store = LocalStore(out)
    store.prepare()
    writer = ChunkWriter(store, "00000-00000", SCHEMA, {"batchscore.chunk": "00000-00000"})
    for rows in windows:
        writer.append(pa.table({"id": [r[0] for r in rows], "embedding": [r[1] for r in rows]},
                               schema=SCHEMA))  # fmt: skip
        assert visible(out) == []  # nothing visible before publish
    expected = [r for rows in windows for r in rows]
    facts = writer.finish(len(expected))
    assert visible(out) == []  # finished (durable, checked) but not yet published
    path = writer.publish()
    assert visible(out) == ["part-00000-00000.parquet"]
    assert list(store.staging.iterdir()) == []
    assert facts == facts_of(Path(path)) and facts.rows == len(expected)
    back = pq.read_table(path)
    assert back.schema.remove_metadata() == SCHEMA
    assert back.schema.metadata[b"batchscore.chunk"] == b"00000-00000"
    assert back.column("id").to_pylist() == [r[0] for r in expected]
    for got, (_, want) in zip(back.column("embedding").to_pylist(), expected, strict=True):
        assert got == pytest.approx(want, nan_ok=True)


def test_row_count_is_checked_before_publishing(tmp_path: Path):
    store = LocalStore(tmp_path)
    store.prepare()
    writer = ChunkWriter(store, "00000-00000", SCHEMA, {})
    writer.append(pa.table({"id": ["a"], "embedding": [[1.0]]}, schema=SCHEMA))
    with pytest.raises(WriteError, match="holds 1 rows, expected 2"):
        writer.finish(2)
    assert visible(tmp_path) == [] and list(store.staging.iterdir()) == []


def test_a_file_it_did_not_write_is_never_replaced(tmp_path: Path):
    store = LocalStore(tmp_path)
    store.prepare()
    (tmp_path / "part-00000-00000.parquet").write_bytes(b"someone else's")
    writer = ChunkWriter(store, "00000-00000", SCHEMA, {})
    writer.append(pa.table({"id": ["a"], "embedding": [[1.0]]}, schema=SCHEMA))
    writer.finish(1)
    with pytest.raises(OutputConflictError, match="did not write"):
        writer.publish()
    assert (tmp_path / "part-00000-00000.parquet").read_bytes() == b"someone else's"
    assert list(store.staging.iterdir()) == []


def test_abort_leaves_nothing(tmp_path: Path):
    store = LocalStore(tmp_path)
    store.prepare()
    writer = ChunkWriter(store, "00001-00002", SCHEMA, {})
    writer.append(pa.table({"id": ["a"], "embedding": [[1.0]]}, schema=SCHEMA))
    writer.abort()
    assert visible(tmp_path) == [] and list(store.staging.iterdir()) == []


def test_a_large_chunk_streams_to_its_file_and_its_facts_are_read_back(tmp_path: Path):
    """Past `HOLD_BYTES` a chunk's rows go to its staged file as they come (memory stays
    bounded); a small chunk is encoded in memory and its facts come from those bytes. Both
    describe the file as a later run reads it."""
    store = LocalStore(tmp_path)
    store.prepare()
    vector = [0.5] * 1024  # 4 KiB a row
    window = pa.table({"id": ["x"] * 100, "embedding": [vector] * 100}, schema=SCHEMA)
    large = ChunkWriter(store, "00000-00000", SCHEMA, {})
    small = ChunkWriter(store, "00001-00000", SCHEMA, {})
    for _ in range(4):  # 1.6 MB in all
        large.append(window)
    small.append(window.slice(0, 3))
    assert large.writer is not None and large.tmp.exists()  # streamed before finish
    assert small.writer is None and not small.tmp.exists()  # held until finish
    for writer, rows in ((large, 400), (small, 3)):
        facts = writer.finish(rows)
        assert facts == facts_of(Path(writer.publish())) and facts.rows == rows
    with pytest.raises(WriteError, match="holds 3 rows, expected 4"):
        again = ChunkWriter(store, "00002-00000", SCHEMA, {})
        again.append(window.slice(0, 3))
        again.finish(4)
    assert list(store.staging.iterdir()) == []  # the refused file was dropped


def test_a_streamed_chunk_is_never_written_through_a_link_at_its_staged_name(tmp_path, monkeypatch):
    """A link planted in the staging folder at the name a large chunk streams to: the write is
    refused (exit 6), and the file the link points at is left as it was."""
    from batchscore.output import writer

    monkeypatch.setattr(writer, "HOLD_BYTES", 0)  # every window streams to the staged file
    out = tmp_path / "out"
    store = LocalStore(out)
    store.prepare()
    victim = tmp_path / "victim.txt"
    victim.write_text("not batchscore's")
    chunk = ChunkWriter(store, "k-00000", SCHEMA, {})
    chunk.tmp.parent.mkdir(parents=True, exist_ok=True)
    chunk.tmp.symlink_to(victim)
    with pytest.raises(WriteError) as caught:
        chunk.append(pa.table({"id": ["a"], "embedding": [[1.0]]}, schema=SCHEMA))
    assert caught.value.exit_code == 6
    assert victim.read_text() == "not batchscore's"


@pytest.mark.parametrize("rows", [3, 40_000], ids=["held", "streamed"])
def test_a_file_named_when_finished_says_so_in_its_footer(tmp_path: Path, rows: int):
    """A piece of a chunk learns its name and rows only when it is cut (`[output].commit_s`):
    its footer holds them, whether it was held in memory or streamed to its file already
    (past `HOLD_BYTES`), and it is published under that name."""
    store = LocalStore(tmp_path)
    store.prepare()
    writer = ChunkWriter(store, "00000-00000", SCHEMA, {"batchscore.shard": "a.parquet"})
    table = pa.table({"id": [str(i) for i in range(rows)], "embedding": [[1.0] * 8] * rows},
                     schema=SCHEMA)  # fmt: skip
    writer.append(table)
    entries = {"batchscore.chunk": "00000-00000000000000000000", "batchscore.rows": f"0-{rows}"}
    writer.name("00000-00000000000000000000", entries)
    writer.finish(rows)
    path = Path(writer.publish())
    assert visible(tmp_path) == ["part-00000-00000000000000000000.parquet"]
    footer = pq.read_metadata(path).metadata
    assert footer[b"batchscore.rows"] == f"0-{rows}".encode()
    assert footer[b"batchscore.chunk"] == b"00000-00000000000000000000"
    assert footer[b"batchscore.shard"] == b"a.parquet"
    assert pq.read_table(path).column("id").to_pylist() == table.column("id").to_pylist()
