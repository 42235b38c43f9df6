"""The claim's advice: `--restart` discards every committed row, so it is advised only when the
settings truly changed (the fingerprint differs for a reason the user made), never for a model
file gone missing (the model's error, exit 4, naming it) nor for a job record the data files
can still prove (rewritten from them)."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from batchscore.errors import (
    BatchscoreError,
    BookkeepingError,
    ModelError,
    OutputConflictError,
    TransientIOError,
)
from batchscore.output.checkpoint import Checkpoint
from batchscore.output.claim import Identity, check_claim, refusal
from batchscore.storage.disk import LocalStore
from batchscore.storage.layout import JOB
from tests.commands import invoke
from tests.conftest import record_of
from tests.output.test_checkpoint import commit
from tests.output.tiny import tiny_job, write_shard

KEY = "aaaaaaaaaaaaaaaa-00000"  # a chunk key as batchscore names them (16 hex digits)
FOLDER = "/models/m"
NAMES = ["config.json", "tokenizer.json", "model.safetensors", "1_Pooling/config.json", "x.txt"]


def model(files: dict[str, str], name: str = "m", folder: str = FOLDER, **parts: str) -> Identity:
    """A job's identity whose model, read at ``folder``, has ``files`` (path -> digest)."""
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    every = {"task": "embed", "model": name, "model_files": digest, "precision": "fp32", **parts}
    return Identity("job", "jobs/job.toml", ["/data/in"], every, files=files, model_path=folder)


def outcome(ckpt: Checkpoint, identity: Identity) -> BatchscoreError | None:
    try:
        check_claim(ckpt, identity, restart=False)
    except BatchscoreError as exc:
        return exc
    return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=st.dictionaries(st.sampled_from(NAMES), st.sampled_from("abc"), min_size=1),
    fate=st.lists(st.sampled_from(["kept", "deleted", "changed"]), min_size=5, max_size=5),
    added=st.sets(st.sampled_from(["onnx/model.onnx", "vocab.txt"])),
    folder=st.sampled_from([FOLDER, "/mnt/models/m", "/models/n"]),
    renamed=st.booleans(),
    precision=st.sampled_from(["fp32", "bf16"]),
)
def test_restart_is_advised_only_for_a_change_the_user_made(
    before, fate, added, folder, renamed, precision
):
    """Any mix of model files kept, deleted, changed and added, with the model found where it
    was, in the same folder mounted elsewhere or in another folder (a Hugging Face snapshot of
    another commit), named as before or not, at one precision or another: a file deleted from
    the model the output was made with is the model's error naming it (no --restart);
    anything else that differs is other settings, naming what changed; the same is no error."""
    now = {name: fate[NAMES.index(name)] for name in before}
    files = {n: before[n] + ("*" if now[n] == "changed" else "") for n in before}
    files = {n: d for n, d in files.items() if now[n] != "deleted"} | dict.fromkeys(added, "n")
    same_model = not renamed and Path(folder).name == "m"
    current = model(files, name="other" if renamed else "m", folder=folder, precision=precision)
    with tempfile.TemporaryDirectory() as out:
        ckpt = Checkpoint(out)
        commit(ckpt, f"{'a' * 16}-00000")
        ckpt.claim(model(before).record())
        found = outcome(ckpt, current)
        judged = None
        try:
            judged = refusal(ckpt, current)
        except ModelError as exc:
            judged = exc
    gone = sorted(n for n in before if now[n] == "deleted")
    if same_model and gone:
        event("a file of the model is gone")
        assert isinstance(found, ModelError) and isinstance(judged, ModelError)
        assert "--restart" not in str(found) and str(found) == str(judged)
        assert all(f"{folder}/{name}" in str(found) for name in gone)
    elif current.fingerprint != model(before).fingerprint:
        event("other settings")
        assert isinstance(found, OutputConflictError) and "--restart" in str(found)
        assert str(found) == judged
        changed = [n for n in before if now[n] == "changed"] if same_model else []
        assert all(name in str(found) for name in [*changed, *(added if same_model else ())])
    else:
        event("the same job")
        assert found is None and judged is None


def test_a_record_of_an_earlier_version_learns_the_files_and_hedges_its_advice(tmp_path):
    """A folder claimed before files were recorded one by one cannot tell a file deleted from
    a model replaced: its advice says which remedy fits which. Its next accepted run records
    the files, so from then on a deleted file is named."""
    ckpt = Checkpoint(tmp_path)
    commit(ckpt, f"{'a' * 16}-00000")
    files = {"config.json": "a", "tokenizer.json": "b"}
    old = model(files).record()
    del old["model_file_digests"], old["model_folder"]
    ckpt.claim(old)
    found = outcome(ckpt, model({"config.json": "a"}))
    assert isinstance(found, OutputConflictError) and "changed: model_files" in str(found)
    assert "if a file of the model was deleted or damaged, restore it" in str(found)
    assert outcome(ckpt, model(files)) is None  # the same files: accepted, and recorded
    assert ckpt.job()["model_file_digests"] == files and ckpt.job()["model_folder"] == FOLDER
    found = outcome(ckpt, model({"config.json": "a"}))
    assert isinstance(found, ModelError) and f"{FOLDER}/tokenizer.json" in str(found)


def test_a_deleted_job_record_is_rewritten_from_the_data_files(tmp_path):
    """The data files' footers prove whose output the folder holds, as for a damaged record:
    the run goes on (no --restart, which would discard every row), and so does `status`."""
    job = tiny_job(tmp_path)
    write_shard(tmp_path / "in" / "a.parquet", 9)
    assert invoke("run", str(job), "--progress", "off").exit_code == 0
    (tmp_path / "out" / JOB).unlink()
    status = invoke("status", str(job), "--check")
    assert status.exit_code == 0, status.output
    again = invoke("run", str(job), "--progress", "off")
    assert again.exit_code == 0, again.output
    assert "rewritten from the data files' footers" in again.stderr
    assert "nothing to do" in again.output and (tmp_path / "out" / JOB).is_file()


def test_a_damaged_job_record_is_proven_by_the_files_that_are_left(tmp_path):
    """A data file deleted besides proves nothing either way: its chunk is scored again, and
    the files that are left prove the folder is this job's."""
    job = tiny_job(tmp_path)
    write_shard(tmp_path / "in" / "a.parquet", 9)
    assert invoke("run", str(job), "--progress", "off").exit_code == 0
    (tmp_path / "out" / JOB).write_text("{")
    record = json.loads(record_of(tmp_path / "out", chunk=1).read_text())
    (tmp_path / "out" / record["file"]).unlink()
    again = invoke("run", str(job), "--progress", "off")
    assert again.exit_code == 0, again.output
    assert "rewritten from the data files' footers" in again.stderr
    assert (tmp_path / "out" / record["file"]).is_file()


class FailingReads(LocalStore):
    """A local folder whose data files' footers cannot be read for now (EIO). A fake: this
    machine has no device that fails reads on demand."""

    def open_input(self, rel: str):
        raise OSError(5, "Input/output error", str(self.root / rel))


def test_a_footer_that_cannot_be_read_now_is_transient_not_a_reason_to_restart(tmp_path):
    job = tiny_job(tmp_path)
    write_shard(tmp_path / "in" / "a.parquet", 9)
    assert invoke("run", str(job), "--progress", "off").exit_code == 0
    (tmp_path / "out" / JOB).write_text("{")
    ckpt = Checkpoint(FailingReads(tmp_path / "out"))
    identity = Identity("job", "jobs/job.toml", ["/data/in"], {"task": "tensor"})
    for run in (True, False):
        with pytest.raises(TransientIOError, match="Input/output error") as info:
            check_claim(ckpt, identity, restart=False) if run else refusal(ckpt, identity)
        assert not isinstance(info.value, BookkeepingError) and "--restart" not in str(info.value)
