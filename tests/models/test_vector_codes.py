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
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import batchscore
from batchscore.cli import main
from batchscore.errors import JobError
from batchscore.job.ranges import unusable
from batchscore.job.sections import EmbedConfig, InputConfig, ModelConfig, QualityConfig
from batchscore.models.embed import FLOATS, EmbedTask
from batchscore.models.vector_codes import measure_ranges, to_codes
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
    """Ranges measured on the vectors themselves, as sentence-transformers measures them; where
    a dimension has no width (sentence-transformers divides by zero there), they are refused."""
    from sentence_transformers import quantize_embeddings

    bounds = np.vstack((vectors.min(0), vectors.max(0)))
    try:
        ranges = measure_ranges(vectors)
    except JobError:
        assert unusable(bounds.tolist()) is not None
        if kind in ("int8", "uint8"):
            return
        ranges = None
    if ranges is not None:
        assert np.array_equal(np.asarray(ranges, np.float32), bounds)
    ours = to_codes(vectors, kind, ranges)
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
    ranges = measure_ranges(np.vstack((calibration, calibration[:1] + 1)))  # every one wide
    ours = to_codes(queries, kind, ranges)
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
    floats = np.array(columns[FLOATS].to_pylist(), dtype=np.float32)  # what the gate reads
    assert np.array_equal(to_codes(floats, kind), ours)
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


@settings(deadline=None, max_examples=60)
@given(
    arrays(
        np.float32,
        st.tuples(st.integers(1, 12), st.integers(1, 6)),
        elements=st.one_of(st.floats(-2, 2, width=32), st.sampled_from([0.0, 1.0, 1e-8])),
    ),
    st.integers(1, 40),
    st.sampled_from(("int8", "uint8")),
)
def test_ranges_measured_on_repeats_never_write_one_vector_for_all(vectors, copies, kind):
    """Whatever the sample (a few vectors, each repeated, as a block of one text repeats):
    measuring either refuses, naming a dimension, or gives ranges under which every dimension
    of the sample itself falls on at least two steps: no column is written as one constant."""
    sample = np.repeat(vectors, copies, axis=0)
    try:
        ranges = measure_ranges(sample)
    except JobError as exc:
        event("refused")
        assert "[embed].quantize" in str(exc)
        if len(sample) < 2:
            assert "only 1 text(s) could be scored" in str(exc)
        else:
            assert "dimension" in str(exc)
        return
    event("measured")
    written = to_codes(sample, kind, ranges).astype(int)
    assert (written.max(axis=0) > written.min(axis=0)).all()


# mostly an embedding's values, then the edges: subnormal widths, past float32's largest
finite = st.one_of(
    st.floats(-4, 4),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 1e-45, 1e-40, -1e-40, 3.4e38, -3.4e38, 3.5e38]),
)


@settings(max_examples=200)
@given(st.lists(st.tuples(finite, finite).map(sorted), min_size=1, max_size=3))
def test_ranges_are_usable_exactly_when_they_cut_into_two_steps(pairs):
    """Given ranges: refused (naming the dimension) exactly when float32 cannot cut a
    dimension into 255 steps (a minimum equal to its maximum, a width float32 cannot hold or
    step through); otherwise each dimension's own ends fall on different steps."""
    ranges = (tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))
    problem = unusable(ranges)
    with np.errstate(over="ignore"):  # past float32's largest: infinite, as numpy casts
        ends = np.asarray(ranges, dtype=np.float64).astype(np.float32)
    event("refused" if problem else "usable")
    if problem is not None:
        assert problem.startswith("dimension ")
        with pytest.raises(ValueError, match="calibration ranges"):
            to_codes(ends, "uint8", ranges)
        return
    written = to_codes(ends, "uint8", ranges).astype(int)
    assert (written[1] > written[0]).all()


def test_given_ranges_with_a_flat_dimension_are_refused(tmp_path, shards):
    """A dimension whose minimum is its maximum would write one value for every row: refused
    by `validate` and `run` (exit 2, nothing written), naming the key and the dimension."""
    flat = [[-1.0] * 384, [1.0] * 384]
    flat[0][5] = flat[1][5] = 0.25
    for command in ("validate", "run"):
        result = run(tmp_path, shards, command, embed={"ranges": flat})
        assert result.exit_code == 2, result.output
        assert "[embed].ranges: dimension 5 (from 0): its minimum and maximum are both 0.25" in (
            result.stderr
        )
    assert not (tmp_path / "out").exists() or not output_files(tmp_path / "out")
    with pytest.raises(JobError, match=r"\[embed\].ranges: dimension 5"):
        batchscore.score(["a text", "another"], task="embed", quantize="int8", ranges=flat)


def repeated_first(folder: Path, small_corpus: pa.Table, copies: int) -> Path:
    """One shard whose first ``copies`` rows are one text (an "N/A" block), then real texts."""
    folder.mkdir()
    rows = small_corpus.select(["doc_id", "text"]).slice(0, 100)
    block = pa.table(
        {"doc_id": [f"na-{i}" for i in range(copies)], "text": ["N/A"] * copies},
        schema=rows.schema,
    )
    pq.write_table(pa.concat_tables([block, rows]), folder / "s0.parquet")
    return folder


def encode_at(path: Path, texts: list[str], *, max_length: int) -> np.ndarray:
    """sentence-transformers' vectors with the job's window."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    model.max_seq_length = max_length
    return model.encode(texts, batch_size=32)


def test_a_block_of_one_repeated_text_first_widens_the_sample(tmp_path, small_corpus, minilm_path):
    """The first 64 rows are one text: the ranges come from the first 64 distinct texts (the
    "N/A" and the 63 after it), not from 64 copies of one vector, and the rows differ."""
    folder = repeated_first(tmp_path / "in", small_corpus, copies=150)
    result = run(tmp_path, folder, "run")
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out"
    written = values(read_output(out)["embedding"])
    assert len(np.unique(written, axis=0)) == 101  # "N/A" and the 100 texts after it
    texts = ["N/A", *small_corpus["text"].to_pylist()[:63]]
    floats = encode_at(minilm_path, texts, max_length=128)
    measured = np.vstack((floats.min(0), floats.max(0)))
    assert np.abs(np.asarray(footer_ranges(output_files(out)[0])) - measured).max() < 1e-5


def test_one_text_everywhere_is_refused_not_written_alike(tmp_path, small_corpus):
    """Every row is one text: no range can be measured; the run says so (exit 2, naming
    [embed].quantize) and writes nothing, rather than one vector for all."""
    folder = tmp_path / "in"
    folder.mkdir()
    one_text = pa.table({"doc_id": list(range(80)), "text": ["N/A"] * 80})
    pq.write_table(one_text, folder / "a.parquet")
    result = run(tmp_path, folder, "run")
    assert result.exit_code == 2, result.output
    assert "[embed].quantize" in result.stderr and "distinct texts" in result.stderr
    assert "only 1 text(s) could be scored there" in result.stderr
    assert "Traceback" not in result.output
    assert not output_files(tmp_path / "out")


def test_score_measures_past_repeated_texts_and_refuses_one_text(minilm_path, small_corpus):
    texts = small_corpus["text"].to_pylist()[:40]
    scored = batchscore.score(
        ["N/A"] * 300 + texts, task="embed", quantize="int8", sample_rows=32, precision="fp32"
    )
    assert len(np.unique(scored, axis=0)) == 41
    floats = st_encode(minilm_path, ["N/A", *texts[:31]])
    ranges = measure_ranges(floats)
    reference = to_codes(st_encode(minilm_path, texts), "int8", ranges)
    assert (np.abs(scored[300:].astype(int) - reference.astype(int)) <= 1).all()
    with pytest.raises(JobError, match=r"only 1 text\(s\) could be scored"):
        batchscore.score(["N/A"] * 50, task="embed", quantize="uint8", precision="fp32")
