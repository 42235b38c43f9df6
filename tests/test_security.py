"""Loading never runs code the job did not opt into, and output paths never come from input."""

from __future__ import annotations

import json
import pickle
import re
import shutil
from pathlib import Path

import pytest

from batchscore.errors import ModelError
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from tests.conftest import read_output
from tests.reliability import make_job


class Canary:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def model_folder(tmp_path: Path, minilm_path: Path) -> Path:
    """A BERT folder (MiniLM's config and tokenizer) whose weights are a hostile pickle."""
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):  # fmt: skip
        shutil.copy(minilm_path / name, folder / name)
    return folder


def test_canary_really_runs_when_unpickled(tmp_path: Path):
    canary = tmp_path / "ran"
    pickle.loads(pickle.dumps(Canary(canary)))
    assert canary.exists()


@pytest.mark.parametrize("allow_pickle", [False, True])
def test_pickle_weights_never_execute(tmp_path: Path, small_corpus, minilm_path, allow_pickle):
    canary = tmp_path / "pwned"
    folder = model_folder(tmp_path, minilm_path)
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Canary(canary)))
    job = make_job(tmp_path, small_corpus.slice(0, 30))
    sets = [f'model.path="{folder}"', f"model.allow_pickle={str(allow_pickle).lower()}"]
    expected = "can run code when loaded" if not allow_pickle else "cannot load the model"
    with pytest.raises(ModelError, match=expected):
        run_job(load_job(job, sets))
    assert not canary.exists()


def test_remote_code_is_not_run_unless_the_job_says_so(tmp_path: Path, small_corpus, minilm_path):
    canary = tmp_path / "pwned"
    folder = model_folder(tmp_path, minilm_path)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="custom-evil", auto_map={"AutoModel": "evil.EvilModel",
                                                      "AutoConfig": "evil.EvilConfig"})  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"from pathlib import Path\nPath({str(canary)!r}).touch()\n")
    shutil.copy(minilm_path / "model.safetensors", folder / "model.safetensors")
    job = make_job(tmp_path, small_corpus.slice(0, 30))
    with pytest.raises(ModelError):
        run_job(load_job(job, [f'model.path="{folder}"']))
    assert not canary.exists()


def test_hostile_shard_names_never_shape_output_paths(tmp_path: Path, small_corpus):
    job = make_job(tmp_path, small_corpus.slice(0, 60))
    shards = sorted((tmp_path / "in").glob("*.parquet"))
    hostile = ["..parquet", "a b;rm -rf ~.parquet", "ünï cödé.parquet"]
    for src, name in zip(shards, hostile, strict=True):
        src.rename(tmp_path / "in" / name)
    (tmp_path / "in" / "sub").mkdir()
    listed = ["in/sub/../..parquet", "in/a b;rm -rf ~.parquet", "in/*cödé.parquet"]
    before = {p for p in tmp_path.rglob("*") if "out" not in p.relative_to(tmp_path).parts}
    report = run_job(load_job(job, [f"input.path={json.dumps(listed)}"]))
    after = {p for p in tmp_path.rglob("*") if "out" not in p.relative_to(tmp_path).parts}
    assert report["rows"] == 60 and after == before  # nothing written outside the output
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names[:2] == ["_SUCCESS", "_batchscore"] and len(names) == 8  # 3 shards x 2 chunks
    # names are keyed by a digest of the shard's path and the chunk number, never the path
    assert all(re.fullmatch(r"part-[0-9a-f]{16}-0000[01]\.parquet", n) for n in names[2:])
    assert read_output(tmp_path / "out").num_rows == 60
