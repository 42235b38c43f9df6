"""Checkpoints: the fingerprint guard, commit records, garbage sweeping and restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchscore.errors import OutputConflictError
from batchscore.output.checkpoint import Checkpoint, fingerprint
from batchscore.output.layout import part_name

PARTS = {"task": "embed", "model": "m", "precision": "fp32"}


def commit(ckpt: Checkpoint, key: str) -> None:
    (Path(ckpt.output) / part_name(key)).write_bytes(b"data")
    ckpt.commit({"chunk": key, "file": part_name(key), "rows": 1})


def test_fingerprint_is_stable_and_order_free():
    assert fingerprint(PARTS) == fingerprint(dict(reversed(PARTS.items())))
    assert fingerprint(PARTS) != fingerprint({**PARTS, "precision": "bf16"})


def test_claim_refuses_other_settings_and_names_what_changed(tmp_path: Path):
    ckpt = Checkpoint(tmp_path)
    ckpt.claim("job", PARTS, restart=False)
    ckpt.claim("job", PARTS, restart=False)  # same settings: resumes
    with pytest.raises(OutputConflictError, match=r"changed: precision\); run with --restart"):
        ckpt.claim("job", {**PARTS, "precision": "bf16"}, restart=False)
    with pytest.raises(OutputConflictError, match="holds the output of job 'job', not 'other'"):
        ckpt.claim("other", PARTS, restart=False)


def test_restart_discards_everything(tmp_path: Path):
    ckpt = Checkpoint(tmp_path)
    ckpt.claim("job", PARTS, restart=False)
    commit(ckpt, "00000-00000")
    ckpt.claim("job", {**PARTS, "precision": "bf16"}, restart=True)
    assert ckpt.committed() == {}
    assert list(tmp_path.glob("part-*")) == []
    assert ckpt.job()["parts"]["precision"] == "bf16"


def test_sweep_removes_unrecorded_files_only(tmp_path: Path):
    ckpt = Checkpoint(tmp_path)
    ckpt.claim("job", PARTS, restart=False)
    commit(ckpt, "00000-00000")
    (tmp_path / part_name("00000-00001")).write_bytes(b"crashed before its record")
    (ckpt.tmp_dir / "part-00000-00002.parquet.123.tmp").write_bytes(b"half")
    removed = {Path(p).name for p in ckpt.sweep()}
    assert removed == {"part-00000-00001.parquet", "part-00000-00002.parquet.123.tmp"}
    assert [p.name for p in tmp_path.glob("part-*")] == ["part-00000-00000.parquet"]


def test_forget_drops_the_record_then_the_file(tmp_path: Path):
    ckpt = Checkpoint(tmp_path)
    ckpt.claim("job", PARTS, restart=False)
    commit(ckpt, "00003-00000")
    ckpt.forget("00003-00000")
    assert ckpt.committed() == {} and list(tmp_path.glob("part-*")) == []
