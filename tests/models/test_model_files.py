"""A model's files as every start reads them (`batchscore.models.fingerprint.read_model_files`):
each is read for the fingerprint, and a missing, dangling, unreadable or odd one is the model's
error (exit 4) naming it, from `validate`, `status --check` and `run`. A file gone is never
taken for other settings, whose advice (--restart) would discard every committed row."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscore.errors import ModelError
from batchscore.models.fingerprint import model_identity
from tests.commands import ROOT, invoke
from tests.conftest import read_output, write_job
from tests.models.st_folders import save_st, tiny_bert
from tests.output.tiny import tiny_job, write_shard

COMMANDS = (["validate"], ["status", "--check"], ["run", "--progress", "off"])


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> Path:
    """A tiny sentence-transformers folder: encoder, pooling, a Dense layer, Normalize."""
    root = tmp_path_factory.mktemp("st")
    encoder = tiny_bert(root / "bert", minilm_path)
    return save_st(root / "st", encoder, dense=[(8, "Tanh", False)], normalize=True)


def digest_before(path: Path) -> str:
    """The model digest as batchscore computed it before files were read one by one (the
    algorithm every claimed folder recorded): a new reading must give the same digest, or
    every output folder would be refused at its next run."""
    digest = hashlib.sha256()
    files = sorted(p for p in (path.rglob("*") if path.is_dir() else [path]) if p.is_file())
    for file in files:
        rel = file.relative_to(path).as_posix() if path.is_dir() else file.name
        if any(part.startswith(".") for part in Path(rel).parts) or rel.lower() == "readme.md":
            continue
        size = file.stat().st_size
        digest.update(f"{rel}\0{size}\0".encode())
        with file.open("rb") as fh:
            if not rel.endswith((".safetensors", ".bin")) or size <= 2 << 20:
                digest.update(fh.read())
            else:
                digest.update(fh.read(1 << 20))
                fh.seek(-(1 << 20), 2)
                digest.update(fh.read(1 << 20))
    return digest.hexdigest()


def test_the_digest_is_the_one_earlier_versions_recorded(st_folder, minilm_path, tmp_path):
    folder = shutil.copytree(st_folder, tmp_path / "m")
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "a-b.txt").write_text("sorted by path parts, not by string")
    (folder / "a").mkdir()
    (folder / "a" / "b.txt").write_text("x")
    (folder / "big.safetensors").write_bytes(os.urandom(5 << 20))  # sampled, not read whole
    (folder / "linked").symlink_to(folder / "1_Pooling")  # a folder linked to is not entered
    for path in (st_folder, minilm_path, folder, folder / "model.safetensors"):
        assert model_identity(path) == digest_before(path)
    from batchscore.models.fingerprint import read_model_files

    files = read_model_files(folder)
    assert files.digest == digest_before(folder)
    assert "a/b.txt" in files.each and ".git/HEAD" not in files.each


def test_a_dangling_link_or_a_special_file_is_named_never_left_out(st_folder, tmp_path):
    folder = shutil.copytree(st_folder, tmp_path / "m")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to("../blobs/0123")  # a pruned snapshot's link
    with pytest.raises(ModelError, match=r"tokenizer\.json: a link to .*blobs/0123, which"):
        model_identity(folder)
    (folder / "tokenizer.json").unlink()
    os.mkfifo(folder / "tokenizer.json")  # opened without O_NONBLOCK, this would hang
    with pytest.raises(ModelError, match=r"tokenizer\.json: not a regular file"):
        model_identity(folder)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to("/dev/zero")  # would be read without end
    with pytest.raises(ModelError, match=r"tokenizer\.json: not a regular file"):
        model_identity(folder)


def complete_output(root: Path, st_folder: Path, corpus: pa.Table) -> Path:
    """A job over a copy of ``st_folder`` at ``root/model``, run to completion; its job file."""
    shutil.copytree(st_folder, root / "model")
    (root / "in").mkdir()
    pq.write_table(corpus.slice(0, 30), root / "in" / "a.parquet")
    job = write_job(
        root / "job.toml",
        input={"path": "in", "id": "doc_id"},
        model={"task": "embed", "path": "model", "threads": 1, "max_length": 64},
        output={"path": "out", "chunk_rows": 10},
    )
    first = invoke("run", str(job), "--progress", "off")
    assert first.exit_code == 0, first.output
    return job


@pytest.mark.parametrize(
    "gone", ["model.safetensors", "tokenizer.json", "modules.json", "2_Dense/model.safetensors"]
)
def test_a_file_deleted_from_a_model_folder_is_the_model_error(
    st_folder, tmp_path, small_corpus, gone
):
    job = complete_output(tmp_path, st_folder, small_corpus)
    committed = read_output(tmp_path / "out")
    file = tmp_path / "model" / gone
    kept = file.read_bytes()
    file.unlink()
    for command in COMMANDS:
        result = invoke(command[0], str(job), *command[1:])
        assert result.exit_code == 4, (command, result.output)
        assert "--restart" not in result.output, (command, result.output)
        said = result.stderr  # the file, or its folder and that it lacks its weights
        assert str(file) in said or (f"{file.parent}: no " in said and "weights" in said), said
    assert read_output(tmp_path / "out").equals(committed)
    file.write_bytes(kept)
    again = invoke("run", str(job), "--progress", "off")
    assert again.exit_code == 0 and "nothing to do" in again.output, again.output


def test_a_weights_file_turned_into_a_fifo_is_the_model_error(st_folder, tmp_path, small_corpus):
    job = complete_output(tmp_path, st_folder, small_corpus)
    weights = tmp_path / "model" / "model.safetensors"
    weights.unlink()
    os.mkfifo(weights)
    for command in COMMANDS:
        result = invoke(command[0], str(job), *command[1:])
        assert result.exit_code == 4, (command, result.output)
        assert f"{weights}: not a regular file" in result.stderr, (command, result.output)


def test_an_unreadable_weights_file_is_the_model_error_naming_it(tmp_path):
    """As an unprivileged user when the tests run as root (root reads any file), in a folder
    of its own under the system's temporary folder that user may enter."""
    home = Path(tempfile.mkdtemp(prefix="batchscore-unreadable-"))
    try:
        home.chmod(0o755)
        job = tiny_job(home)
        write_shard(home / "in" / "a.parquet", 9)
        if os.geteuid() == 0:
            for path in [home, *home.rglob("*")]:
                os.chown(path, 65534, 65534, follow_symlinks=False)
        first = batchscore(home, "run", str(job), "--progress", "off")
        assert first.returncode == 0, first.stderr
        weights = home / "mlp.safetensors"
        weights.chmod(0)
        for command in COMMANDS:
            result = batchscore(home, command[0], str(job), *command[1:])
            assert result.returncode == 4, (command, result.stderr)
            assert f"{weights}: cannot read" in result.stderr, (command, result.stderr)
            assert "--restart" not in result.stderr + result.stdout
            assert "Traceback" not in result.stderr
    finally:
        shutil.rmtree(home)


def batchscore(home: Path, *args: str) -> subprocess.CompletedProcess:
    """``batchscore ARGS`` in a subprocess, as uid 65534 when the tests run as root."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home)}
    env["XDG_CACHE_HOME"] = str(home / "cache")
    command = [sys.executable, "-m", "batchscore", *args]
    if os.geteuid() != 0:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    # the checkout may sit in a folder only its owner may enter: let the other user pass
    # through the checkout's parents for this call, then put their modes back
    parents = [p for p in ROOT.parents if not p.stat().st_mode & 0o001]
    modes = {p: p.stat().st_mode for p in parents}
    try:
        for folder, mode in modes.items():
            folder.chmod(mode | 0o001)
        return subprocess.run(
            [*nobody, *command], env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        for folder, mode in modes.items():
            folder.chmod(mode)
