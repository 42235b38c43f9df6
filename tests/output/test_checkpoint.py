"""Checkpoints and claims: the identity guard, commit records with intents, clean-up that
touches only batchscore's own files, and restart."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscore import faults
from batchscore.errors import OutputConflictError, WriteError
from batchscore.output.checkpoint import Checkpoint, Damaged, fingerprint
from batchscore.output.claim import Identity, check_claim
from batchscore.output.manifest import facts_of, problem, success_text
from batchscore.storage.layout import part_name
from tests.output.tiny import undeletable

PARTS = {"task": "embed", "model": "m", "precision": "fp32"}
JOB = Identity("job", "jobs/job.toml", ["/data/in"], PARTS)
A = "a" * 16  # a shard key, as `batchscore.storage.layout.shard_key` makes them


def write_part(folder: Path, key: str, rows: int = 1) -> dict:
    """A real Parquet data file at the chunk's name, and its commit record."""
    path = folder / part_name(key)
    pq.write_table(pa.table({"x": list(range(rows))}), path)
    shard = {"path": "/data/in/s.parquet", "size": 1, "mtime_ns": 1}
    return {"chunk": key, "file": part_name(key), **facts_of(path).as_record(), "shard": shard,
            "chunks": 1, "start": 0, "stop": rows, "bad_rows": 0}  # fmt: skip


def commit(ckpt: Checkpoint, key: str) -> dict:
    ckpt.prepare()
    record = write_part(Path(ckpt.output), key)
    ckpt.claim(JOB.record())
    ckpt.intend([record])
    ckpt.commit([record])
    return record


def test_fingerprint_is_stable_and_order_free():
    assert fingerprint(PARTS) == fingerprint(dict(reversed(PARTS.items())))
    assert fingerprint(PARTS) != fingerprint({**PARTS, "precision": "bf16"})


def test_claim_refuses_other_settings_and_other_jobs(tmp_path: Path):
    ckpt = Checkpoint(tmp_path)
    check_claim(ckpt, JOB, restart=False)  # unclaimed
    commit(ckpt, f"{A}-00000")
    check_claim(ckpt, JOB, restart=False)  # same job: resumes
    renamed = Identity("renamed", "elsewhere/renamed.toml", JOB.inputs, PARTS)
    check_claim(ckpt, renamed, restart=False)  # a moved or renamed job file is the same job
    other_settings = Identity("job", "jobs/job.toml", JOB.inputs, {**PARTS, "precision": "bf16"})
    with pytest.raises(OutputConflictError, match=r"changed: precision\); run with --restart"):
        check_claim(ckpt, other_settings, restart=False)
    other_job = Identity("job", "jobs/other.toml", ["/data/other"], PARTS)
    with pytest.raises(OutputConflictError, match=r"another job, 'job' \(jobs/job.toml\)"):
        check_claim(ckpt, other_job, restart=False)


def test_nothing_committed_claims_nothing(tmp_path: Path):
    ckpt = Checkpoint(tmp_path)
    ckpt.prepare()
    ckpt.claim(JOB.record())  # written, but no commit followed (the run failed)
    other = Identity("job", "jobs/other.toml", ["/data/other"], {**PARTS, "precision": "bf16"})
    check_claim(ckpt, other, restart=False)


def test_restart_removes_batchscores_files_only(tmp_path: Path):
    ckpt = Checkpoint(tmp_path)
    commit(ckpt, f"{A}-00000")
    (tmp_path / "part-0.parquet").write_bytes(b"the user's")
    check_claim(ckpt, JOB, restart=True)
    assert ckpt.committed() == {} and ckpt.job() is None and not ckpt.claimed()
    assert [p.name for p in tmp_path.glob("part-*")] == ["part-0.parquet"]


def test_sweep_removes_a_crashed_publish_and_nothing_else(tmp_path: Path):
    ckpt = Checkpoint(tmp_path)
    commit(ckpt, f"{A}-00000")
    crashed = write_part(tmp_path, f"{A}-00001")  # published, never recorded
    ckpt.intend([crashed])
    ckpt.intend([write_part(tmp_path / "_batchscore", f"{A}-00002")])  # intent, never published
    (tmp_path / part_name(f"{A}-00002")).write_bytes(b"not what the intent says")
    (ckpt.tmp_dir / "part-a-00003.parquet.123.tmp").write_bytes(b"half")
    (tmp_path / "part-00000-3f2a.snappy.parquet").write_bytes(b"spark's")
    removed = {Path(p).name for p in ckpt.sweep()}
    assert removed == {part_name(f"{A}-00001"), "part-a-00003.parquet.123.tmp"}
    assert sorted(p.name for p in tmp_path.glob("part-*")) == sorted(
        [part_name(f"{A}-00000"), part_name(f"{A}-00002"), "part-00000-3f2a.snappy.parquet"]
    )
    assert ckpt.intents() == {}


def test_forget_drops_the_record_then_the_file(tmp_path: Path):
    ckpt = Checkpoint(tmp_path)
    record = commit(ckpt, f"{A}-00000")
    ckpt.forget(f"{A}-00000", record)
    assert ckpt.committed() == {} and list(tmp_path.glob("part-*")) == []


def test_a_changed_file_is_told_apart_by_size_and_footer(tmp_path: Path):
    ckpt = Checkpoint(tmp_path)
    record = commit(ckpt, f"{A}-00000")
    assert problem(ckpt.store, record) is None
    write_part(tmp_path, f"{A}-00000", rows=2)
    assert problem(ckpt.store, record).startswith("damaged")
    (tmp_path / part_name(f"{A}-00000")).unlink()
    assert problem(ckpt.store, record) == "missing"


def test_reports_are_pruned_oldest_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("batchscore.output.checkpoint.MAX_REPORTS", 3)
    ckpt = Checkpoint(tmp_path)
    ckpt.prepare()
    for i in range(5):
        ckpt.save_report(
            f"_batchscore/runs/2026010{i}T000000.000000Z-1.json", {"n": i, "outcome": "ok"}
        )
    assert [r["n"] for r in ckpt.reports()] == [4, 3, 2]


def complete(ckpt: Checkpoint) -> None:
    """The folder marked complete, as a finished run marks it."""
    (Path(ckpt.output) / "_SUCCESS").write_text(success_text("job", "2026-01-01T00:00:00Z"))


@pytest.mark.parametrize("step", ["forget", "drop damaged", "sweep"])
def test_every_removal_drops_success_before_it_starts(tmp_path: Path, step: str):
    """Un-committing a chunk, dropping a damaged record, clearing a crashed publish: each
    removes `_SUCCESS` before its first file, so when that file cannot be removed (immutable;
    where this machine cannot make it so, an I/O error injected at the removal call) the
    folder no longer says it is complete, and the error is the write error naming the file."""
    ckpt = Checkpoint(tmp_path)
    record = commit(ckpt, f"{A}-00000")
    if step == "drop damaged":
        (tmp_path / f"_batchscore/done/{A}-00001.json").write_text("{")
    if step == "sweep":
        ckpt.intend([write_part(tmp_path, f"{A}-00001")])  # published, never recorded
    complete(ckpt)
    ckpt = Checkpoint(tmp_path)  # the next run's
    ckpt.committed()
    act, first = {
        "forget": (lambda: ckpt.forget(f"{A}-00000", record), f"_batchscore/done/{A}-00000.json"),
        "drop damaged": (ckpt.drop_damaged, f"_batchscore/done/{A}-00001.json"),
        "sweep": (ckpt.sweep, part_name(f"{A}-00001")),
    }[step]

    with undeletable(tmp_path / first, "remove@1:eio") as spec, faults.armed(spec):
        with pytest.raises(WriteError, match=f"{tmp_path / first}: cannot remove"):
            act()
        assert (tmp_path / first).exists()
        assert not (tmp_path / "_SUCCESS").exists()

    act()  # the cause gone, the step finishes
    assert not (tmp_path / first).exists() and not (tmp_path / "_SUCCESS").exists()


def test_another_writers_success_and_files_not_named_as_batchscore_names_them_stay(
    tmp_path: Path,
):
    """Clean-up reads and removes only files named as batchscore names its own: a note in
    `done/` or `writing/` is neither a damaged record to drop nor an intent to sweep."""
    ckpt = Checkpoint(tmp_path)
    commit(ckpt, f"{A}-00000")
    notes = {"_batchscore/done/notes.json": "{", "_batchscore/writing/todo.json": "{}"}
    for rel, text in notes.items():
        (tmp_path / rel).write_text(text)
    (tmp_path / "_SUCCESS").write_text("")  # another writer's
    assert set(ckpt.committed()) == {f"{A}-00000"} and ckpt.damaged == {}
    ckpt.sweep()
    ckpt.drop_damaged()
    ckpt.forget(f"{A}-00000", ckpt.committed()[f"{A}-00000"])
    assert all((tmp_path / rel).read_text() == text for rel, text in notes.items())
    assert (tmp_path / "_SUCCESS").read_text() == ""


def test_only_reports_named_as_batchscore_names_them_are_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr("batchscore.output.checkpoint.MAX_REPORTS", 1)
    ckpt = Checkpoint(tmp_path)
    ckpt.prepare()
    (tmp_path / "_batchscore/runs/0-summary.json").write_text('{"outcome": "mine"}')
    for i in range(3):
        ckpt.save_report(f"_batchscore/runs/2026010{i}T000000.000000Z-1.json", {"outcome": "ok"})
    names = sorted(p.name for p in (tmp_path / "_batchscore/runs").iterdir())
    assert names == ["0-summary.json", "20260102T000000.000000Z-1.json"]


def test_a_record_edited_to_name_another_file_forgets_without_removing_it(tmp_path: Path):
    ckpt = Checkpoint(tmp_path)
    record = commit(ckpt, f"{A}-00000")
    (tmp_path / "notes.txt").write_text("mine")
    ckpt.forget(f"{A}-00000", {**record, "file": "notes.txt"})
    assert ckpt.committed() == {} and (tmp_path / "notes.txt").read_text() == "mine"


def test_bookkeeping_that_is_not_utf8_is_damaged_never_a_traceback(tmp_path: Path):
    """A byte that is not UTF-8 (a disk error, a binary file) in a commit record, a report or
    the job record is damage, handled as a truncated file is."""
    ckpt = Checkpoint(tmp_path / "out")
    commit(ckpt, "0123456789abcdef-00000")
    record = tmp_path / "out/_batchscore/done/0123456789abcdef-00000.json"
    record.write_bytes(record.read_bytes().replace(b'"chunk"', b'"ch\xffunk"'))
    (tmp_path / "out/_batchscore/runs").mkdir(exist_ok=True)
    (tmp_path / "out/_batchscore/runs/x.json").write_bytes(b'{"outcome": "\xfe"}')
    (tmp_path / "out/_batchscore/job.json").write_bytes(b'{"name": "\xff"}')
    assert ckpt.committed() == {}
    assert "not UTF-8 text" in ckpt.damaged["_batchscore/done/0123456789abcdef-00000.json"]
    assert list(ckpt.reports()) == []
    with pytest.raises(Damaged, match=r"job\.json: damaged \(not UTF-8 text\)"):
        ckpt.job()
