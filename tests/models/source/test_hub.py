"""Hugging Face ids, resolved offline from a cache laid out exactly as huggingface_hub writes it
(``models--org--name/blobs``, ``snapshots/<commit>/`` links, ``refs/<branch>``)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchscore.cli import main
from batchscore.errors import JobError, ModelError
from batchscore.job.parse import load_job
from batchscore.job.sections import ModelConfig
from batchscore.models.fingerprint import fingerprint_parts
from batchscore.models.source.hub import hub_cache
from batchscore.models.source.locate import locate
from batchscore.recipes.run import run_job
from tests.commands import invoke
from tests.conftest import read_output, write_job
from tests.models.st_folders import save_st, tiny_bert

OLD, NEW = "1" * 40, "2" * 40  # two commits of one model


def cache_model(
    cache: Path, repo_id: str, source: Path, commit: str, refs: tuple[str, ...]
) -> Path:
    """Put ``source``'s files in ``cache`` as huggingface_hub does: content-addressed blobs,
    relative links to them from the commit's snapshot, and each ref naming the commit."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # huggingface_hub writes no newline
    return repo / "snapshots" / commit


@pytest.fixture(scope="module")
def cache(tmp_path_factory, minilm_path) -> Path:
    """A cache holding a tiny sentence-transformers model at two commits (main: the newer;
    tag v1: the older, which has no Dense head)."""
    root = tmp_path_factory.mktemp("hf")
    encoder = tiny_bert(root / "src" / "bert", minilm_path)
    old = save_st(root / "src" / "old", encoder)
    new = save_st(root / "src" / "new", encoder, dense=[(8, "Tanh", False)], normalize=True)
    cache = root / "home" / "hub"
    cache_model(cache, "acme/tiny-embed", old, OLD, ("v1",))
    cache_model(cache, "acme/tiny-embed", new, NEW, ("main",))
    return cache


def test_the_cache_is_laid_out_as_huggingface_hub_reads_it(cache):
    from huggingface_hub import scan_cache_dir, snapshot_download

    info = scan_cache_dir(cache)
    assert not info.warnings
    (repo,) = info.repos
    assert repo.repo_id == "acme/tiny-embed"
    assert {r.commit_hash: set(r.refs) for r in repo.revisions} == {OLD: {"v1"}, NEW: {"main"}}
    for revision in (None, "v1", OLD):
        model = ModelConfig(task="embed", name="acme/tiny-embed", revision=revision)
        expected = snapshot_download(
            "acme/tiny-embed", revision=revision, cache_dir=cache, local_files_only=True
        )
        assert locate(model, {"HF_HUB_CACHE": str(cache)}) == Path(expected)


def test_cache_folder_follows_the_standard_variables(tmp_path):
    home = Path.home()
    assert hub_cache({}) == home / ".cache" / "huggingface" / "hub"
    assert hub_cache({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")
    assert hub_cache({"HF_HOME": "/h", "XDG_CACHE_HOME": "/x"}) == Path("/h/hub")
    assert hub_cache({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}) == Path("/c")
    assert hub_cache({"HF_HOME": "~/hf"}) == home / "hf" / "hub"


def test_revisions_resolve_through_refs(cache):
    env = {"HF_HOME": str(cache.parent)}
    path = locate(ModelConfig(task="embed", name="acme/tiny-embed"), env)
    assert path.name == NEW and (path / "2_Dense" / "model.safetensors").is_file()
    assert locate(ModelConfig(task="embed", name="acme/tiny-embed", revision="v1"), env).name == OLD
    with pytest.raises(ModelError, match='"acme/tiny-embed" at revision v2 is not in'):
        locate(ModelConfig(task="embed", name="acme/tiny-embed", revision="v2"), env)


def test_a_missing_id_says_where_it_looked_and_how_to_fetch_it(
    cache, tmp_path, shards, monkeypatch
):
    with pytest.raises(ModelError) as info:
        locate(
            ModelConfig(task="embed", name="BAAI/bge-small-en-v1.5"), {"HF_HUB_CACHE": str(cache)}
        )
    message = str(info.value)
    assert '"BAAI/bge-small-en-v1.5"' in message
    assert f"searched {cache / 'models--BAAI--bge-small-en-v1.5'}" in message
    assert "`batchscore fetch BAAI/bge-small-en-v1.5`" in message and "never download" in message
    assert "batchscore models" in message
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    job = write_job(
        tmp_path / "j.toml",
        input={"path": str(shards)},
        model={"task": "embed", "name": "acme/missing", "revision": "v3"},
        output={"path": "out"},
    )
    result = CliRunner().invoke(main, ["validate", str(job)], catch_exceptions=False)
    assert result.exit_code == 4, result.stderr
    assert "`batchscore fetch acme/missing --revision v3`" in result.stderr
    with pytest.raises(ModelError, match="neither a built-in model"):
        locate(ModelConfig(task="embed", name="not an id"), {})


def test_the_built_in_keeps_its_names(minilm_path, tmp_path):
    empty = {"HF_HUB_CACHE": str(tmp_path)}
    for name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        assert locate(ModelConfig(task="embed", name=name), empty) == minilm_path
    with pytest.raises(ModelError, match=r'did you mean "all-MiniLM-L6-v2"'):
        locate(ModelConfig(task="embed", name="all-MiniLM-L6-v3"), empty)


def test_an_embed_job_by_hub_id_scores_like_its_folder(cache, tmp_path, shards, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    common = {"task": "embed", "threads": 1, "max_length": 64}
    outputs = {}
    snapshot = cache / "models--acme--tiny-embed" / "snapshots" / OLD
    for name, model in (
        ("id", {"name": "acme/tiny-embed", "revision": "v1"}),
        ("path", {"path": str(snapshot)}),
    ):
        job = write_job(
            tmp_path / f"{name}.toml",
            input={"path": str(shards), "id": "doc_id"},
            model={**common, **model},
            output={"path": f"out-{name}"},
        )
        loaded = load_job(job)
        run_job(loaded)
        outputs[name] = read_output(tmp_path / f"out-{name}")
        if name == "id":
            parts = fingerprint_parts(loaded, locate(loaded.model))
            assert parts["model"] == "acme/tiny-embed" and parts["revision"] == "v1"
    assert outputs["id"].num_rows == 360 and outputs["id"].equals(outputs["path"])


def test_revision_belongs_to_a_hub_id(tmp_path):
    model = {"task": "embed", "path": "m", "revision": "main"}
    job = write_job(tmp_path / "j.toml", input={"path": "in"}, model=model, output={"path": "o"})
    with pytest.raises(JobError, match=r"\[model\].revision: .* a local \[model\].path has none"):
        load_job(job)


def test_the_cache_is_found_where_the_variables_say_now(cache, tmp_path, monkeypatch):
    """huggingface_hub reads HF_HOME / HF_HUB_CACHE once, when imported; a look-up follows
    the variables as they are at the time of the call (a notebook may set them later)."""
    import huggingface_hub.constants

    imported_with = huggingface_hub.constants.HF_HUB_CACHE
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert Path(huggingface_hub.constants.HF_HUB_CACHE) == Path(imported_with) != cache
    found = locate(ModelConfig(task="embed", name="acme/tiny-embed"))
    assert found == cache / "models--acme--tiny-embed" / "snapshots" / NEW
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    with pytest.raises(ModelError, match=f"searched {tmp_path / 'elsewhere'}"):
        locate(ModelConfig(task="embed", name="acme/tiny-embed"))


def test_a_snapshot_the_hub_knows_is_incomplete_is_refused(cache, tmp_path):
    """huggingface_hub records the file list of each commit it fetched; a snapshot missing
    some of them (a download cut off) is a model error naming them, not a half model."""
    from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache

    partial = tmp_path / "hub"
    source = cache / "models--acme--tiny-embed" / "snapshots" / OLD
    snapshot = cache_model(partial, "acme/partial", source, OLD, ("main",))
    listed = {
        str(p.relative_to(snapshot)): TreeCacheEntry(size=p.stat().st_size, blob_id="0" * 40)
        for p in snapshot.rglob("*")
        if p.is_file()
    }
    listed["model-00002-of-00002.safetensors"] = TreeCacheEntry(size=1, blob_id="1" * 40)
    write_tree_cache(str(partial / "models--acme--partial"), OLD, listed)
    with pytest.raises(ModelError, match=r"incomplete.*model-00002-of-00002\.safetensors"):
        locate(ModelConfig(task="embed", name="acme/partial"), {"HF_HUB_CACHE": str(partial)})


@pytest.mark.parametrize(
    "gone",
    ["model.safetensors", "tokenizer.json", "config.json", "modules.json", "2_Dense/config.json"],
)
def test_a_file_gone_from_the_cache_is_the_model_error_never_other_settings(
    cache, tmp_path, small_corpus, monkeypatch, gone
):
    """A blob cleaned out of the cache, or a pruned snapshot, leaves a dangling link behind:
    `validate`, `status --check` and `run` stop at the model (exit 4), naming the file, and
    never advise --restart, which would discard every committed row. Once the file is back,
    the output resumes as it was."""
    hub = tmp_path / "hub"
    shutil.copytree(cache, hub, symlinks=True)  # the cache's links are relative: they move
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    (tmp_path / "in").mkdir()
    pq.write_table(small_corpus.slice(0, 30), tmp_path / "in" / "a.parquet")
    job = write_job(
        tmp_path / "job.toml",
        input={"path": "in", "id": "doc_id"},
        model={"task": "embed", "name": "acme/tiny-embed", "threads": 1, "max_length": 64},
        output={"path": "out", "chunk_rows": 10},
    )
    first = invoke("run", str(job), "--progress", "off")
    assert first.exit_code == 0, first.output
    committed = read_output(tmp_path / "out")
    link = hub / "models--acme--tiny-embed" / "snapshots" / NEW / gone
    blob = link.resolve()
    kept = blob.read_bytes()
    blob.unlink()
    for command in (["validate"], ["status", "--check"], ["run", "--progress", "off"]):
        result = invoke(command[0], str(job), *command[1:])
        assert result.exit_code == 4, (command, result.output)
        assert str(link) in result.stderr and "--restart" not in result.output, result.output
    assert read_output(tmp_path / "out").equals(committed)
    blob.write_bytes(kept)
    again = invoke("run", str(job), "--progress", "off")
    assert again.exit_code == 0 and "nothing to do" in again.output, again.output
