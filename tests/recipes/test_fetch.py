"""`batchscore fetch`: a model from the hub into the local cache, the one command that uses the
network; jobs naming it then run offline. Against a stand-in for the hub on loopback
(`tests.models.source.hub_server`), reached by huggingface_hub's own ``snapshot_download``
through ``HF_ENDPOINT``, in real subprocesses as cron starts them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.commands import environment
from tests.conftest import read_output, write_job
from tests.models.source.hub_server import Hub
from tests.models.st_folders import save_st, tiny_bert

OLD, NEW = "1" * 40, "2" * 40
NOT_READ = {  # files a hub repository holds that batchscore never reads: never fetched
    "README.md": b"# acme/tiny-embed\n",
    ".gitattributes": b"*.safetensors filter=lfs\n",
    "pytorch_model.bin": b"PK\x03\x04 a pickle, by name",
    "onnx/model.onnx": b"\x08\x07 an ONNX export",
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> Iterator[Hub]:
    """The hub holding a tiny sentence-transformers model at two commits (main: with a Dense
    head; tag v1: without), among files batchscore does not read."""
    root = tmp_path_factory.mktemp("hub-src")
    encoder = tiny_bert(root / "bert", minilm_path)
    old = save_st(root / "old", encoder)
    new = save_st(root / "new", encoder, dense=[(8, "Tanh", False)], normalize=True)
    served = Hub()
    served.add("acme/tiny-embed", old, OLD, ("v1",), NOT_READ)
    served.add("acme/tiny-embed", new, NEW, ("main",), NOT_READ)
    served.add("acme/pickled", root / "bert", OLD, extra={"pytorch_model.bin": b"pickle"})
    for weights in (root / "bert").glob("*.safetensors"):  # the pickled one has no safetensors
        del served.repos["acme/pickled"].commits[OLD][weights.name]
    served.start()
    yield served
    served.stop()


def batchscore(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "batchscore", *args],
        env=environment(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def closed_port() -> str:
    """An address on loopback where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_fetched_model_runs_offline_and_only_the_files_batchscore_reads_come_down(
    hub: Hub, tmp_path: Path, small_corpus
):
    """fetch puts the model in the standard cache (huggingface_hub's layout: blobs, the
    commit's snapshot, refs/main), asking only for configs, tokenizer files and safetensors
    weights; a job naming it then runs with HF_HUB_OFFLINE=1 and the hub gone. Before, a
    snapshot without the hub's other files (README, pickle, ONNX) was refused offline as
    incomplete (exit 4)."""
    cache = tmp_path / "hub-cache"
    hub.requests.clear()
    done = batchscore(
        "fetch", "acme/tiny-embed", "--json", HF_HUB_CACHE=str(cache), HF_ENDPOINT=hub.url
    )
    assert done.returncode == 0, done.stderr
    fetched = json.loads(done.stdout)
    snapshot = cache / "models--acme--tiny-embed" / "snapshots" / NEW
    assert fetched["path"] == str(snapshot) and fetched["commit"] == NEW
    assert fetched["tasks"] == ["embed", "summarize"] and fetched["job"] == {
        "name": "acme/tiny-embed"
    }
    assert (cache / "models--acme--tiny-embed" / "refs" / "main").read_text() == NEW
    assert (snapshot / "2_Dense" / "model.safetensors").is_file()
    assert not set(hub.fetched()) & set(NOT_READ), hub.fetched()
    assert "model.safetensors" in hub.fetched() and "tokenizer.json" in hub.fetched()
    hub.requests.clear()
    again = batchscore("fetch", "acme/tiny-embed", HF_HUB_CACHE=str(cache), HF_ENDPOINT=hub.url)
    assert again.returncode == 0, again.stderr
    assert hub.fetched() == []  # whole in the cache already: nothing comes down twice
    assert "runs as: embed, summarize" in again.stdout
    (tmp_path / "in").mkdir()
    pq.write_table(small_corpus.slice(0, 20), tmp_path / "in" / "a.parquet")
    job = write_job(
        tmp_path / "job.toml",
        input={"path": "in", "id": "doc_id"},
        model={"task": "embed", "name": "acme/tiny-embed", "threads": 1, "precision": "fp32"},
        output={"path": "out"},
    )
    offline = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": closed_port()}
    hub.requests.clear()
    ran = batchscore("run", str(job), "--progress", "off", **offline)
    assert ran.returncode == 0, ran.stderr
    assert read_output(tmp_path / "out").num_rows == 20 and hub.requests == []


def test_a_tag_is_fetched_and_named_by_its_revision(hub: Hub, tmp_path: Path):
    cache = tmp_path / "hub-cache"
    done = batchscore(
        "fetch", "acme/tiny-embed", "--revision", "v1", HF_HUB_CACHE=str(cache), HF_ENDPOINT=hub.url
    )
    assert done.returncode == 0, done.stderr
    assert (cache / "models--acme--tiny-embed" / "refs" / "v1").read_text() == OLD
    assert 'name = "acme/tiny-embed", revision = "v1"' in done.stdout
    listed = batchscore("models", "--json", HF_HUB_CACHE=str(cache))
    assert listed.returncode == 0, listed.stderr
    (entry,) = [m for m in json.loads(listed.stdout)["models"] if m["source"] == "hub"]
    assert entry["name"] == "acme/tiny-embed" and entry["revision"] == "v1"
    assert entry["commit"] == OLD and entry["tasks"] == ["embed", "summarize"]
    assert entry["job"] == {"name": "acme/tiny-embed", "revision": "v1"}


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (["acme/nothing"], 4, "has no such model (or it is private: set HF_TOKEN"),
        (["acme/tiny-embed", "--revision", "v9"], 4, "has no revision v9"),
        (["not an id"], 2, "is not a Hugging Face model id"),
        (["acme/tiny-embed", "--revision", "../main"], 2, "--revision: may not hold .."),
        (["acme/pickled"], 4, "--allow-pickle fetches them"),
    ],
)
def test_what_the_hub_does_not_have_is_the_models_error(
    hub: Hub, tmp_path: Path, args: list[str], code: int, said: str
):
    done = batchscore("fetch", *args, HF_HUB_CACHE=str(tmp_path / "c"), HF_ENDPOINT=hub.url)
    assert done.returncode == code, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr


def test_a_hub_out_of_reach_is_transient_and_never_a_traceback(hub: Hub, tmp_path: Path):
    """Nothing listening, or a hub answering 503: exit 7 (run it again later), one message
    naming the model and the address; HF_HUB_OFFLINE forbids the network: exit 4, saying so."""
    cache = str(tmp_path / "c")
    down = batchscore("fetch", "acme/tiny-embed", HF_HUB_CACHE=cache, HF_ENDPOINT=closed_port())
    assert down.returncode == 7, down.stderr
    assert '"acme/tiny-embed": cannot fetch it from http://127.0.0.1:' in down.stderr
    assert "run it again once the hub is reachable" in down.stderr
    hub.fail_with = 503
    try:
        busy = batchscore("fetch", "acme/tiny-embed", HF_HUB_CACHE=cache, HF_ENDPOINT=hub.url)
    finally:
        hub.fail_with = None
    assert busy.returncode == 7, busy.stderr
    offline = batchscore(
        "fetch", "acme/tiny-embed", HF_HUB_CACHE=cache, HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="1"
    )
    assert offline.returncode == 4, offline.stderr
    assert "HF_HUB_OFFLINE is set" in offline.stderr
    for done in (down, busy, offline):
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) <= 3, done.stderr
