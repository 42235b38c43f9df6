"""`[embed].quantize`: vectors written as sentence-transformers' ``quantize_embeddings`` writes
them, int8 / uint8 ranges measured once per output folder on the job's own rows and kept in
every data file's footer (run with ``-s`` to see the measured agreement)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import batchscore
from batchscore.cli import main
from batchscore.job.sections import EmbedConfig, InputConfig, ModelConfig, QualityConfig
from batchscore.models.embed import UNQUANTIZED, EmbedTask
from batchscore.models.quantize import measure_ranges, quantize
from batchscore.pipeline.sampler import form_batches, restore
from batchscore.runtime.executor import Executor
from tests.conftest import output_files, read_output, write_job
from tests.models.st_folders import st_encode

KINDS = ("int8", "uint8", "binary", "ubinary")


def vectors_strategy(rows: tuple[int, int]):
    """float32 [rows, dims] with repeats, zeros and both signs (values on steps' edges too)."""
    values = st.one_of(
        st.floats(-2, 2, width=32), st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 1e-8])
    )
    return arrays(np.float32, st.tuples(st.integers(*rows), st.integers(1, 70)), elements=values)


@settings(deadline=None)  # the first example imports sentence-transformers
@given(vectors_strategy((2, 30)), st.sampled_from(KINDS))
def test_quantize_equals_quantize_embeddings(vectors, kind):
    """Ranges measured on the vectors themselves, as sentence-transformers measures them."""
    from sentence_transformers import quantize_embeddings

    ranges = measure_ranges(vectors)
    assert np.array_equal(
        np.asarray(ranges, np.float32), np.vstack((vectors.min(0), vectors.max(0)))
    )
    ours = quantize(vectors, kind, ranges)
    reference = quantize_embeddings(vectors, kind)  # calibrates on ``vectors`` for int8 / uint8
    assert ours.dtype == reference.dtype and np.array_equal(ours, reference)


@settings(deadline=None)
@given(vectors_strategy((1, 20)), vectors_strategy((2, 20)), st.sampled_from(("int8", "uint8")))
def test_given_ranges_quantize_new_vectors_alike(queries, calibration, kind):
    """Ranges from other rows (a folder's footer) quantize queries as ``ranges=`` does, values
    outside them clipped to the ends."""
    from sentence_transformers import quantize_embeddings

    dims = min(queries.shape[1], calibration.shape[1])
    queries, calibration = queries[:, :dims], calibration[:, :dims]
    ranges = measure_ranges(calibration)
    ours = quantize(queries, kind, ranges)
    reference = quantize_embeddings(queries, kind, ranges=np.asarray(ranges, dtype=np.float32))
    assert np.array_equal(ours, reference)


def make(path: Path, options: EmbedConfig) -> EmbedTask:
    config = ModelConfig(task="embed", precision="fp32", threads=1)
    return EmbedTask(
        path, model=config, options=options, inp=InputConfig(path=()), executor=Executor(config)
    )


def finish(task: EmbedTask, texts: list[str]) -> dict[str, pa.Array]:
    encoded = task.encode(pa.table({"text": texts}))
    batches = form_batches(encoded.lengths, 2048, 32)
    with torch.inference_mode():
        results = restore(batches, [task.forward(encoded, b) for b in batches], np.empty(0))
    return task.finish(encoded, results)


def values(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    flat = column.flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(len(column), column.type.list_size)


def share_of_equal_bits(a: np.ndarray, b: np.ndarray) -> float:
    return float((np.unpackbits(a.view(np.uint8)) == np.unpackbits(b.view(np.uint8))).mean())


def agreement_at_edges(
    ours: np.ndarray, reference: np.ndarray, floats: np.ndarray, ranges: np.ndarray
) -> tuple[float, float]:
    """The share of int8 / uint8 values equal to the reference's, and how close to a step's
    edge the reference's float lies where they differ (ours were quantized from floats that
    differ from sentence-transformers' by float noise, so a value on an edge may fall either
    way); a value more than one step off fails."""
    off = np.abs(ours.astype(int) - reference.astype(int))
    assert off.max() <= 1
    steps = (ranges[1] - ranges[0]) / 255
    position = (floats - ranges[0]) / np.where(steps == 0, 1, steps)
    distance = np.abs(position - np.round(position)) * steps
    edge = float(distance[off == 1].max()) if (off == 1).any() else 0.0
    return float((off == 0).mean()), edge


@pytest.fixture(scope="module")
def texts(small_corpus) -> list[str]:
    return small_corpus.column("text").to_pylist()[:120]


@pytest.mark.parametrize(("kind", "truncate_dim"), [("binary", None), ("ubinary", 128)])
def test_packed_bits_equal_quantize_embeddings(minilm_path, texts, kind, truncate_dim):
    from sentence_transformers import quantize_embeddings

    task = make(minilm_path, EmbedConfig(quantize=kind, truncate_dim=truncate_dim))
    columns = finish(task, texts)
    dim = truncate_dim or 384
    expected_type = pa.list_(pa.int8() if kind == "binary" else pa.uint8(), dim // 8)
    assert columns["embedding"].type == expected_type == task.columns[0].type
    reference = quantize_embeddings(st_encode(minilm_path, texts, truncate_dim=truncate_dim), kind)
    ours = values(columns["embedding"])
    share = share_of_equal_bits(ours, reference)
    print(f"\n{kind}, {dim} dimensions: {share:.6f} of the bits equal quantize_embeddings'")
    assert share >= 0.999
    floats = np.array(columns[UNQUANTIZED].to_pylist(), dtype=np.float32)  # what the gate reads
    assert np.array_equal(quantize(floats, kind), ours)
    same = task.agreement(columns, columns, QualityConfig())
    assert same.passed and same.metrics["cosine_min"] > 0.99999


def test_given_ranges_are_used_and_checked(minilm_path, texts):
    from sentence_transformers import quantize_embeddings

    calibration = st_encode(minilm_path, texts[60:])
    ranges = measure_ranges(calibration)
    task = make(minilm_path, EmbedConfig(quantize="uint8", ranges=ranges))
    ours = values(finish(task, texts[:60])["embedding"])
    floats = st_encode(minilm_path, texts[:60])
    reference = quantize_embeddings(floats, "uint8", ranges=np.asarray(ranges, np.float32))
    share, edge = agreement_at_edges(ours, reference, floats, np.asarray(ranges, np.float32))
    print(
        f"\nuint8 with given ranges: {share:.6f} of the values equal; the others one step off, "
        f"their float {edge:.1e} from a step's edge at most"
    )
    assert share >= 0.998 and edge < 1e-5


def run(tmp_path: Path, shards: Path, *more: str, embed: dict | None = None, **quality):
    job = write_job(
        tmp_path / "job.toml",
        input={"path": str(shards), "id": "doc_id"},
        model={"task": "embed", "max_length": 128, "threads": 1},
        embed={"quantize": "int8", **(embed or {})},
        quality={"sample_rows": 64, **quality},
        output={"path": "out", "chunk_rows": 40},
    )
    return CliRunner().invoke(main, [*more, str(job)], catch_exceptions=False)


def footer_ranges(file: Path) -> list[list[float]]:
    return json.loads(pq.read_metadata(file).metadata[b"batchscore.embed.ranges"])


def test_int8_ranges_come_from_the_jobs_first_rows_and_stay(
    tmp_path, shards, small_corpus, minilm_path
):
    from sentence_transformers import SentenceTransformer, quantize_embeddings

    result = run(tmp_path, shards, "run")
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out"
    table = read_output(out)
    assert table.schema.field("embedding").type == pa.list_(pa.int8(), 384)
    files = output_files(out)
    ranges = footer_ranges(files[0])
    assert all(footer_ranges(f) == ranges for f in files)  # one folder, one calibration
    settled = json.loads((out / "_batchscore" / "settled.json").read_text())
    assert settled["ranges"] == ranges
    # measured on the job's first 64 rows (its first shard's, in input order)
    by_id = dict(
        zip(small_corpus["doc_id"].to_pylist(), small_corpus["text"].to_pylist(), strict=True)
    )
    texts = [by_id[i] for i in table["doc_id"].to_pylist()]
    model = SentenceTransformer(str(minilm_path), device="cpu")
    model.max_seq_length = 128  # the job's max_length
    floats = model.encode(texts, batch_size=32)
    measured = np.vstack((floats[:64].min(0), floats[:64].max(0)))
    assert np.abs(np.asarray(ranges) - measured).max() < 1e-5
    reference = quantize_embeddings(floats, "int8", ranges=np.asarray(ranges, np.float32))
    ours = values(table["embedding"])
    share, edge = agreement_at_edges(ours, reference, floats, np.asarray(ranges, np.float32))
    print(
        f"\nint8 over {len(texts)} rows: {share:.6f} of the values equal quantize_embeddings'; "
        f"the others one step off, their float {edge:.1e} from a step's edge at most"
    )
    assert share >= 0.998 and edge < 1e-5
    # a resumed run quantizes with the recorded ranges, whatever sample it would measure now
    files[-1].unlink()
    again = run(tmp_path, shards, "run", sample_rows=200)
    assert again.exit_code == 0, again.stderr
    assert all(footer_ranges(f) == ranges for f in output_files(out))
    assert json.loads((out / "_batchscore" / "settled.json").read_text())["ranges"] == ranges


def test_quantize_keys_are_checked_at_validate(tmp_path, shards):
    assert run(tmp_path, shards, "validate").exit_code == 0
    result = run(tmp_path, shards, "validate", embed={"quantize": "int4"})
    assert result.exit_code == 2 and "[embed].quantize: expected one of" in result.stderr
    short = [[0.0, 0.1], [1.0, 1.1]]
    result = run(tmp_path, shards, "validate", embed={"ranges": short})
    assert result.exit_code == 2
    assert "[embed].ranges: 2 numbers per list, and" in result.stderr
    assert "vectors of 384 dimensions" in result.stderr
    result = run(tmp_path, shards, "validate", embed={"quantize": "binary", "ranges": short})
    assert result.exit_code == 2 and "[embed].ranges: they calibrate" in result.stderr
    upside_down = [[1.0] * 384, [0.0] * 384]
    result = run(tmp_path, shards, "validate", embed={"ranges": upside_down})
    assert result.exit_code == 2 and "the first list holds the minimums" in result.stderr


def test_score_quantizes_a_frame_with_its_own_first_rows(small_corpus, minilm_path):
    from sentence_transformers import quantize_embeddings

    table = small_corpus.select(["text"]).slice(0, 80)
    scored = batchscore.score(table, task="embed", quantize="uint8", precision="fp32")
    assert scored.schema.field("embedding").type == pa.list_(pa.uint8(), 384)
    floats = st_encode(minilm_path, table["text"].to_pylist())
    reference = quantize_embeddings(floats, "uint8")  # calibrated on the same 80 rows
    ranges = np.asarray(measure_ranges(floats), np.float32)
    share, edge = agreement_at_edges(values(scored["embedding"]), reference, floats, ranges)
    assert share >= 0.998 and edge < 1e-5
    two = pa.table({"text": ["a text", "another"]})
    bits = batchscore.score(two, task="embed", quantize="ubinary", truncate_dim=256)
    assert bits.schema.field("embedding").type == pa.list_(pa.uint8(), 32)
    cut = st_encode(minilm_path, two["text"].to_pylist(), truncate_dim=256)
    assert np.array_equal(values(bits["embedding"]), quantize_embeddings(cut, "ubinary"))


def test_a_damaged_record_takes_its_ranges_back_from_the_footers(tmp_path, shards):
    """settled.json lost: the ranges every committed file names are the folder's again, and the
    chunk scored anew is quantized with them, not with ranges measured afresh."""
    assert run(tmp_path, shards, "run").exit_code == 0
    out = tmp_path / "out"
    files = output_files(out)
    ranges = footer_ranges(files[0])
    (out / "_batchscore" / "settled.json").write_text('{"precision": ')
    files[-1].unlink()
    again = run(tmp_path, shards, "run", sample_rows=200)
    assert again.exit_code == 0, again.stderr
    assert "recovered from the data files' footers" in again.stderr
    assert json.loads((out / "_batchscore" / "settled.json").read_text())["ranges"] == ranges
    assert all(footer_ranges(f) == ranges for f in output_files(out))
