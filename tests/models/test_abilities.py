"""What a model on disk runs as, read from its files (never its name), each task held to the
task's own file checks: real tiny models of every kind batchscore runs, and a few it does not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from images_example import tiny_clip  # scripts/, on the path
from safetensors.torch import load_file

from batchscore.models.abilities import abilities
from tests.models import tiny
from tests.models.st_folders import save_sparse, save_st, tiny_bert, tiny_mlm
from tests.models.test_rerank import classic, saved


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path, small_corpus: pa.Table):
    """One folder (or file) of each kind, in a folder named so that no name gives it away."""
    root = tmp_path_factory.mktemp("kinds")
    texts = small_corpus.column("text").to_pylist()
    bert = tiny_bert(root / "a", minilm_path)
    reranker = classic(root / "f", minilm_path)
    _, files = tiny.mlp_files(root / "files")
    return {
        "encoder": bert,
        "sentence-transformers": save_st(root / "b", bert),
        "sparse": save_sparse(root / "c", tiny_mlm(root / "c-mlm", texts)),
        "classifier": tiny.bert_classifier(root / "d", minilm_path, ["neg", "pos"]),
        "reranker": reranker,
        "cross-encoder": saved(reranker, root / "g"),
        "decoder": tiny.gpt2(root / "h", texts),
        "seq2seq": tiny.t5(root / "i", texts),
        "clip": tiny_clip(root / "j"),
        **{f"tensor-{name}": path for name, path in files.items()},
    }


@pytest.mark.parametrize(
    ("kind", "tasks", "words"),
    [
        ("encoder", ("embed", "summarize"), "encoder"),
        ("sentence-transformers", ("embed", "summarize"), "sentence-transformers encoder"),
        ("sparse", ("embed",), "sparse encoder"),
        ("classifier", ("classify",), "sequence classifier (2 labels)"),
        ("reranker", ("classify",), "one score: a reranker"),
        ("cross-encoder", ("classify",), "CrossEncoder"),
        ("decoder", ("generate", "summarize", "loglik"), "decoder-only language model"),
        ("seq2seq", ("generate", "summarize"), "sequence-to-sequence language model"),
        ("clip", ("embed",), "two towers (clip): images and texts"),
        ("tensor-torchscript", ("tensor",), "TorchScript"),
        ("tensor-export", ("tensor",), "torch.export"),
        ("tensor-safetensors", ("tensor",), "[tensor].factory"),
    ],
)
def test_each_kind_runs_as_its_tasks(made: dict[str, Path], kind: str, tasks, words: str):
    found = abilities(made[kind])
    assert found is not None and found.tasks == tasks, found
    assert words in found.kind


def test_what_batchscore_does_not_run_says_why(made: dict[str, Path], tmp_path: Path):
    """A pickle is listed, never run; pickle weights run only where allowed; an architecture
    no task runs, a stack module batchscore does not implement, and a config linked to a blob
    that is gone, run as nothing, saying why; a folder or file that holds no model is none."""
    pickle = abilities(made["tensor-pickle"])
    assert pickle is not None and pickle.tasks == () and "can run code" in pickle.notes[0]
    pickled = shutil.copytree(made["classifier"], tmp_path / "pickled")
    state = load_file(made["classifier"] / "model.safetensors")
    (pickled / "model.safetensors").unlink()
    torch.save(state, pickled / "pytorch_model.bin")
    refused = abilities(pickled)
    assert refused is not None and refused.tasks == ()
    assert "pickle" in refused.notes[0] and "allow_pickle" in refused.notes[0]
    allowed = abilities(pickled, allow_pickle=True)
    assert allowed is not None and allowed.tasks == ("classify",)
    speech = shutil.copytree(made["encoder"], tmp_path / "speech")
    config = json.loads((speech / "config.json").read_text())
    (speech / "config.json").write_text(json.dumps({**config, "architectures": ["BertForCTC"]}))
    other = abilities(speech)
    assert other is not None and other.tasks == () and "BertForCTC" in other.kind
    layered = shutil.copytree(made["sentence-transformers"], tmp_path / "layered")
    modules = json.loads((layered / "modules.json").read_text())
    modules.append({"idx": 9, "name": "9", "path": "9_LayerNorm", "type": "x.LayerNorm"})
    (layered / "modules.json").write_text(json.dumps(modules))
    unread = abilities(layered)
    assert unread is not None and unread.tasks == () and "LayerNorm" in unread.notes[0]
    pruned = shutil.copytree(made["decoder"], tmp_path / "pruned")  # a cache's blob cleaned up
    (pruned / "config.json").unlink()
    (pruned / "config.json").symlink_to(tmp_path / "blobs" / "gone")
    cleaned = abilities(pruned)
    assert cleaned is not None and cleaned.tasks == () and "config.json" in cleaned.notes[0]
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("no model here")
    assert abilities(tmp_path / "plain") is None
    assert abilities(tmp_path / "plain" / "notes.txt") is None
