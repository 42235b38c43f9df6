"""`batchscore models`: every model this machine can run and what as, from the built-in
package, local folders and the Hugging Face cache, with the `[model]` keys that name each."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from tests.commands import invoke
from tests.conftest import write_job
from tests.models import tiny
from tests.models.source.test_hub import NEW, OLD, cache_model
from tests.models.st_folders import save_st, tiny_bert


@pytest.fixture
def machine(tmp_path: Path, minilm_path: Path, small_corpus: pa.Table, monkeypatch) -> Path:
    """A working folder whose ./models holds a generative model, a tensor file, a pickle and
    what is no model; another folder that is itself a classifier; a cache holding a tiny
    embedding model at two commits (main, and tag v1)."""
    texts = small_corpus.column("text").to_pylist()
    models = tmp_path / "work" / "models"
    tiny.gpt2(models / "writer", texts)
    _, files = tiny.mlp_files(tmp_path / "files")
    (models / "net.bin").write_bytes(files["torchscript"].read_bytes())
    (models / "old.pt").write_bytes(files["pickle"].read_bytes())
    (models / "notes.md").write_text("not a model")
    (models / ".cache").mkdir()
    tiny.bert_classifier(tmp_path / "kinds", minilm_path, ["a", "b", "c"])
    encoder = tiny_bert(tmp_path / "src" / "bert", minilm_path)
    cache = tmp_path / "hf" / "hub"
    cache_model(cache, "acme/tiny-embed", save_st(tmp_path / "src" / "st", encoder), NEW, ("main",))
    cache_model(cache, "acme/tiny-embed", tmp_path / "src" / "bert", OLD, ("v1",))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path


def test_every_model_here_is_listed_with_its_tasks_size_and_keys(machine: Path, minilm_path):
    done = invoke("models", "--path", str(machine / "kinds"), "--json")
    assert done.exit_code == 0, done.output
    found = json.loads(done.stdout)
    assert found["hub_cache"] == str(machine / "hf" / "hub")
    listed = {(m["source"], m["name"], m.get("revision")): m for m in found["models"]}
    assert set(listed) == {
        ("built-in", "all-MiniLM-L6-v2", None),
        ("local", "models/net.bin", None),
        ("local", "models/old.pt", None),
        ("local", "models/writer", None),
        ("local", str(machine / "kinds"), None),
        ("hub", "acme/tiny-embed", "main"),
        ("hub", "acme/tiny-embed", "v1"),
    }
    tasks = {key: tuple(m["tasks"]) for key, m in listed.items()}
    assert tasks[("built-in", "all-MiniLM-L6-v2", None)] == ("embed", "summarize")
    assert tasks[("local", "models/writer", None)] == ("generate", "summarize", "loglik")
    assert tasks[("local", "models/net.bin", None)] == ("tensor",)
    assert tasks[("local", "models/old.pt", None)] == ()
    assert tasks[("local", str(machine / "kinds"), None)] == ("classify",)
    assert tasks[("hub", "acme/tiny-embed", "main")] == ("embed", "summarize")
    builtin = listed[("built-in", "all-MiniLM-L6-v2", None)]
    assert builtin["path"] == str(minilm_path) and builtin["size_bytes"] > 80_000_000
    main, v1 = listed[("hub", "acme/tiny-embed", "main")], listed[("hub", "acme/tiny-embed", "v1")]
    assert main["commit"] == NEW and v1["commit"] == OLD and v1["refs"] == ["v1"]
    assert main["job"] == {"name": "acme/tiny-embed"}
    assert v1["job"] == {"name": "acme/tiny-embed", "revision": "v1"}
    writer = listed[("local", "models/writer", None)]
    assert writer["job"] == {"path": str(machine / "work" / "models" / "writer")}
    assert all(m["size_bytes"] > 0 for m in found["models"])
    text = invoke("models", "--path", str(machine / "kinds"))
    assert text.exit_code == 0, text.output
    assert text.stdout.splitlines()[0].split() == ["model", "tasks", "size", "from", "where"]
    assert "acme/tiny-embed @v1" in text.stdout and "not run: a torch.save pickle" in text.stdout


def test_the_keys_listed_name_the_model_in_a_job(machine: Path, shards: Path):
    """Each entry's `job` keys, written in a job file anywhere, find the same model."""
    found = json.loads(invoke("models", "--json").stdout)["models"]
    (machine / "elsewhere").mkdir()
    for model in found:
        if "embed" not in model["tasks"]:
            continue
        job = write_job(
            machine / "elsewhere" / "job.toml",
            input={"path": str(shards)},
            model={"task": "embed", **model["job"]},
            output={"path": "out"},
        )
        done = invoke("validate", str(job))
        assert done.exit_code == 0, (model, done.output)


def test_a_path_that_is_no_folder_is_a_usage_error(machine: Path):
    done = invoke("models", "--path", "nowhere")
    assert done.exit_code == 2 and "--path nowhere: no such folder" in done.stderr
