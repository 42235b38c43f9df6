"""`[embed].truncate_dim`: a model's vectors cut to their first dimensions, compared with
sentence-transformers' ``encode(truncate_dim=N)`` (run with ``-s`` to see the cosines)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from batchscore.cli import main
from batchscore.job.parse import load_job
from batchscore.job.sections import EmbedConfig
from batchscore.models.fingerprint import fingerprint_parts
from tests.conftest import write_job
from tests.models.st_folders import cosines, embed_column, floats, save_st, st_encode, tiny_bert


def test_cut_vectors_equal_encode_truncate_dim(dense_model, minilm_path, texts):
    for folder, dim, what in (
        (dense_model, 64, "MiniLM + Dense(128)"),
        (minilm_path, 96, "MiniLM"),
    ):
        column = embed_column(folder, texts, EmbedConfig(truncate_dim=dim))
        assert column.type == pa.list_(pa.float32(), dim)
        ours = floats(column)
        reference = st_encode(folder, texts, truncate_dim=dim)
        cosine = cosines(ours, reference)
        print(
            f"\n{what}, truncate_dim {dim}: cosine with encode(truncate_dim={dim}) min "
            f"{cosine.min():.7f}, mean {cosine.mean():.7f}"
        )
        assert cosine.min() >= 0.9999
        # cut, then normalized: unit vectors, as encode(..., normalize_embeddings=True) gives
        assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
        unit = st_encode(folder, texts, truncate_dim=dim, normalize_embeddings=True)
        assert np.abs(ours - unit).max() < 1e-4


def test_a_model_without_normalize_is_cut_as_it_is(tmp_path, minilm_path, texts):
    encoder = tiny_bert(tmp_path / "bert", minilm_path)
    folder = save_st(tmp_path / "st", encoder, modes=("mean", "max"), max_seq_length=48)
    raw = floats(embed_column(folder, texts, EmbedConfig(normalize=False, truncate_dim=40)))
    reference = st_encode(folder, texts, truncate_dim=40)
    assert raw.shape == reference.shape == (len(texts), 40)
    assert np.abs(raw - reference).max() < 1e-4 * max(1.0, float(np.abs(reference).max()))


def test_the_models_own_truncate_dim_applies(tmp_path, minilm_path, texts):
    """A folder saved with ``truncate_dim`` in its config: ``encode`` cuts by default, so do we;
    the job's key cuts it further."""
    folder = save_st(tmp_path / "st", minilm_path, normalize=True, truncate_dim=48)
    reference = st_encode(folder, texts)
    assert reference.shape == (len(texts), 48)
    ours = floats(embed_column(folder, texts, EmbedConfig()))
    assert ours.shape == reference.shape and cosines(ours, reference).min() >= 0.9999
    assert embed_column(folder, texts[:3], EmbedConfig(truncate_dim=16)).type.list_size == 16


def test_long_texts_are_averaged_then_cut(dense_model, texts):
    """Windows meet at full width, then the cut and the normalization: the same vectors as the
    whole width cut afterwards."""
    whole = floats(
        embed_column(dense_model, texts, EmbedConfig(), long_text="chunk", max_length=32)
    )
    cut = floats(
        embed_column(
            dense_model, texts, EmbedConfig(truncate_dim=32), long_text="chunk", max_length=32
        )
    )
    expected = whole[:, :32] / np.linalg.norm(whole[:, :32], axis=1, keepdims=True)
    assert np.abs(cut - expected).max() < 1e-5


def run(tmp_path: Path, shards: Path, embed_keys: dict, *more: str):
    job = write_job(
        tmp_path / "job.toml",
        input={"path": str(shards), "id": "doc_id"},
        model={"task": "embed", "max_length": 64, "threads": 1},
        embed=embed_keys,
        output={"path": "out", "chunk_rows": 200},
    )
    result = CliRunner().invoke(main, [*more, str(job)], catch_exceptions=False)
    return result, job


def test_validate_refuses_a_cut_wider_than_the_model(tmp_path, shards):
    result, _ = run(tmp_path, shards, {"truncate_dim": 400}, "validate")
    assert result.exit_code == 2
    assert "[embed].truncate_dim: 400 is more than the 384 dimensions of" in result.stderr
    result, _ = run(tmp_path, shards, {"truncate_dim": 0}, "validate")
    assert result.exit_code == 2 and "[embed].truncate_dim: must be at least 1" in result.stderr
    result, _ = run(tmp_path, shards, {"truncate_dim": 384}, "validate")
    assert result.exit_code == 0, result.stderr


def test_the_footer_records_it_and_the_fingerprint_covers_it(tmp_path, shards, minilm_path):
    result, job = run(tmp_path, shards, {"truncate_dim": 128}, "run")
    assert result.exit_code == 0, result.stderr
    files = sorted((tmp_path / "out").glob("*.parquet"))
    for file in files:
        assert pq.read_metadata(file).metadata[b"batchscore.embed.truncate_dim"] == b"128"
        assert pq.read_schema(file).field("embedding").type == pa.list_(pa.float32(), 128)
    parts = fingerprint_parts(load_job(job), minilm_path)
    assert parts["task_options"]["truncate_dim"] == 128
    again, _ = run(tmp_path, shards, {"truncate_dim": 64}, "run")
    assert again.exit_code == 5 and "changed: task_options" in again.stderr
