"""Token usage (`[output].usage = true`): each row's `prompt_tokens` equal its model tokenizer's
own count (truncated, special tokens, a prompt, both texts of a pair and every window counted),
for embed, classify, rerank, sparse and extractive summarize; the run's totals in its report,
summary and metrics; no column and no totals with usage off; a bad value a job error.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from batchscore.job.parse import load_job
from batchscore.job.sections import ClassifyConfig, EmbedConfig, InputConfig, ModelConfig
from batchscore.models.base import tokens_per_row
from batchscore.models.tasks import encoding
from batchscore.models.text.sentences import summary_sentences
from batchscore.observe.run_stats import RunReport
from batchscore.recipes.run import run_job
from tests.commands import invoke
from tests.conftest import read_output, write_job
from tests.models.st_folders import save_sparse, tiny_mlm
from tests.models.test_rerank import classic


@pytest.fixture(scope="module")
def table(small_corpus: pa.Table) -> pa.Table:
    """40 docstrings, short and long (many past a 64-token window), a null text among them."""
    texts = small_corpus.column("text").to_pylist()[::9][:40]
    texts[3] = None
    return pa.table({"id": list(range(len(texts))), "text": texts, "other": texts[::-1]})


def job_over(tmp_path: Path, table: pa.Table, *, model: dict, **sections: dict) -> Path:
    (tmp_path / "in").mkdir(exist_ok=True)
    pq.write_table(table, tmp_path / "in" / "part-0.parquet")
    return write_job(
        tmp_path / "job.toml",
        input={"path": "in", "id": "id", **sections.pop("input", {})},
        model={"threads": 1, "max_length": 64, **model},
        output={"path": "out", "usage": True, "on_error": "skip", **sections.pop("output", {})},
        **sections,
    )


def counted(tmp_path: Path, job: Path) -> tuple[list[int | None], RunReport]:
    """The run's `prompt_tokens` column and its report."""
    report = RunReport.of(run_job(load_job(job)))
    out = read_output(tmp_path / "out")
    return out.column("prompt_tokens").to_pylist(), report


def own_counts(path: Path, texts: list, pairs: list | None = None, **options) -> list:
    """What the model's own tokenizer gives each text (a null text: None)."""
    tok = AutoTokenizer.from_pretrained(path)
    firsts = [options.get("prompt", "") + t if t is not None else None for t in texts]
    out = []
    for i, text in enumerate(firsts):
        if text is None or (pairs is not None and pairs[i] is None):
            out.append(None)
            continue
        args = (text,) if pairs is None else (text, pairs[i])
        out.append(len(tok(*args, truncation=True, max_length=64)["input_ids"]))
    return out


def gauges(metrics: Path) -> dict[str, str]:
    """A metrics file's values by name (each has one sample, labelled with the job)."""
    return {
        line.split("{")[0]: line.rsplit(" ", 1)[1]
        for line in metrics.read_text().splitlines()
        if line.startswith("batchscore_")
    }


def test_embed_counts_equal_the_tokenizer(tmp_path, table, minilm_path):
    tokens, report = counted(
        tmp_path, job_over(tmp_path, table, model={"task": "embed", "path": str(minilm_path)})
    )
    expected = own_counts(minilm_path, table.column("text").to_pylist())
    assert tokens == expected
    assert max(t for t in tokens if t) == 64  # some were truncated, and counted so
    assert report.prompt_tokens == sum(t for t in expected if t) and report.generated_tokens == 0
    assert report.data["total_tokens"] == report.prompt_tokens
    assert f"usage: {report.prompt_tokens:,} prompt tokens" in str(report)


def test_a_prompt_is_counted(tmp_path, table, dense_model):
    """dense_model puts "query: " before every text: the model read it, so it counts."""
    tokens, _ = counted(
        tmp_path, job_over(tmp_path, table, model={"task": "embed", "path": str(dense_model)})
    )
    texts = table.column("text").to_pylist()
    assert tokens == own_counts(dense_model, texts, prompt="query: ")


def test_every_window_of_a_long_text_counts(tmp_path, table, minilm_path):
    """With long_text = "chunk" a text is read in windows that repeat 1/8 of the window: the
    count is the text's tokens, the repeats and each window's [CLS] and [SEP]."""
    model = {"task": "embed", "path": str(minilm_path), "long_text": "chunk"}
    tokens, _ = counted(tmp_path, job_over(tmp_path, table, model=model))
    tok = AutoTokenizer.from_pretrained(minilm_path)
    size, repeat = 64 - 2, 64 // 8
    for text, got in zip(table.column("text").to_pylist(), tokens, strict=True):
        if text is None:
            assert got is None
            continue
        n = len(tok(text, add_special_tokens=False)["input_ids"])
        windows = 1 if n <= size else 1 + math.ceil((n - size) / (size - repeat))
        assert got == n + (windows - 1) * repeat + 2 * windows


def test_classify_pairs_count_both_texts(tmp_path, table, bert_path):
    model = {"task": "classify", "path": str(bert_path)}
    tokens, _ = counted(
        tmp_path, job_over(tmp_path, table, model=model, input={"text_pair": "other"})
    )
    texts, others = table.column("text").to_pylist(), table.column("other").to_pylist()
    assert tokens == own_counts(bert_path, texts, others)


def test_sparse_and_summarize_count_what_they_read(tmp_path, table, tiny_texts, minilm_path):
    sparse = save_sparse(tmp_path / "splade", tiny_mlm(tmp_path / "mlm", tiny_texts))
    tokens, _ = counted(
        tmp_path, job_over(tmp_path, table, model={"task": "embed", "path": str(sparse)})
    )
    assert tokens == own_counts(sparse, table.column("text").to_pylist())
    # extractive summarize reads each sentence of a row as a unit: the row counts them all
    model = {"task": "summarize", "path": str(minilm_path)}
    summarize = job_over(tmp_path, table, model=model, output={"path": "summaries"})
    run_job(load_job(summarize))
    tokens = read_output(tmp_path / "summaries").column("prompt_tokens").to_pylist()
    tok = AutoTokenizer.from_pretrained(minilm_path)
    for text, got in zip(table.column("text").to_pylist(), tokens, strict=True):
        sentences = summary_sentences(text) if text is not None else []
        own = [len(tok(s, truncation=True, max_length=64)["input_ids"]) for s in sentences]
        assert got == (sum(own) if text is not None else None)


def test_generation_totals_and_metrics(tmp_path, table, gpt2_path):
    """generate writes its usage always; the run's totals are its columns' sums, in the report,
    the summary line and the metrics."""
    model = {"task": "generate", "path": str(gpt2_path)}
    job = job_over(tmp_path, table, model=model, generate={"max_new_tokens": 8})
    metrics = tmp_path / "run.prom"
    result = invoke("run", str(job), "--progress", "off", "--metrics-file", str(metrics))
    assert result.exit_code == 0, result.output
    out = read_output(tmp_path / "out")
    read = sum(t or 0 for t in out.column("prompt_tokens").to_pylist())
    wrote = sum(t or 0 for t in out.column("generated_tokens").to_pylist())
    assert wrote > 0
    assert f"usage: {read:,} prompt tokens + {wrote:,} generated = {read + wrote:,}" in (
        result.output
    )
    reports = list((tmp_path / "out/_batchscore/runs").glob("*.json"))
    report = json.loads(reports[0].read_text())
    assert (report["prompt_tokens"], report["generated_tokens"]) == (read, wrote)
    values = gauges(metrics)
    assert float(values["batchscore_prompt_tokens"]) == read
    assert float(values["batchscore_generated_tokens"]) == wrote


def test_abstractive_summaries_count_both_ways(tmp_path, table, gpt2_path):
    model = {"task": "summarize", "path": str(gpt2_path)}
    _, report = counted(
        tmp_path, job_over(tmp_path, table, model=model, summarize={"max_new_tokens": 4})
    )
    out = read_output(tmp_path / "out")
    assert out.column_names[:4] == ["id", "summary", "prompt_tokens", "generated_tokens"]
    wrote = out.column("generated_tokens").to_pylist()
    assert report.generated_tokens == sum(t or 0 for t in wrote) > 0


def test_usage_refused_where_nothing_is_counted(tmp_path, table, minilm_path):
    """A tensor job reads numbers; a carried column named like a usage column would clash."""
    job = write_job(
        tmp_path / "t.toml",
        input={"path": "in", "features": ["x"]},
        model={"task": "tensor", "path": "m.pt"},
        tensor={"output": "value"},
        output={"path": "out", "usage": True},
    )
    result = invoke("validate", str(job))
    assert result.exit_code == 2 and "[output].usage: task tensor reads numbers" in result.output
    clash = job_over(
        tmp_path,
        table.append_column("prompt_tokens", pa.array([0] * table.num_rows)),
        model={"task": "embed", "path": str(minilm_path)},
        input={"keep": ["prompt_tokens"]},
    )
    result = invoke("run", str(clash), "--progress", "off")
    assert result.exit_code == 2 and "'prompt_tokens' has the name of an output column" in (
        result.output
    )


def test_usage_off_writes_no_column_and_no_totals(tmp_path, table, minilm_path):
    """Off (the default), the output is the task's own columns and the run counts nothing; a
    folder written so refuses a run that turns usage on (its columns would differ)."""
    job = job_over(
        tmp_path,
        table,
        model={"task": "embed", "path": str(minilm_path)},
        output={"usage": False},
    )
    metrics = tmp_path / "run.prom"
    result = invoke("run", str(job), "--progress", "off", "--metrics-file", str(metrics))
    assert result.exit_code == 0, result.output
    assert read_output(tmp_path / "out").column_names == ["id", "embedding", "error"]
    assert "usage:" not in result.output
    report = json.loads(next((tmp_path / "out/_batchscore/runs").glob("*.json")).read_text())
    assert (report["prompt_tokens"], report["total_tokens"]) == (0, 0)
    assert float(gauges(metrics)["batchscore_prompt_tokens"]) == 0
    result = invoke("run", str(job), "--progress", "off", "--set", "output.usage=true")
    assert result.exit_code == 5 and "usage" in result.output


# texts a tokenizer meets in the wild: words, punctuation, accents, CJK, emoji, blanks
WORDS = st.sampled_from(
    ["the", "model", "read", "Ünïcödé", "日本語", "🙂", ",", "  ", "\n", "x" * 30]
)
TEXTS = st.lists(st.lists(WORDS, max_size=40).map(" ".join), min_size=1, max_size=6)


@pytest.fixture(scope="module")
def encodings(minilm_path, bert_path):
    """Each (task, max_length)'s encoding, built once: the tokenizer alone, no weights."""
    made = {}

    def get(task: str, max_length: int):
        if (task, max_length) not in made:
            path = minilm_path if task == "embed" else bert_path
            inp = InputConfig(path=("in",), text_pair=None if task == "embed" else "other")
            options = EmbedConfig() if task == "embed" else ClassifyConfig()
            model = ModelConfig(task=task, path=str(path), max_length=max_length)
            made[task, max_length] = (
                encoding(path, model=model, options=options, inp=inp),
                AutoTokenizer.from_pretrained(path),
            )
        return made[task, max_length]

    return get


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=TEXTS, data=st.data(), task=st.sampled_from(["embed", "classify"]))
def test_each_rows_count_is_its_tokenizers(encodings, texts, data, task):
    """Property: for any texts (and pairs), truncated at any window, a row's count is what the
    model's own tokenizer gives it with truncation at that window; a blank row has none."""
    max_length = data.draw(st.sampled_from([8, 16, 64]))
    others = data.draw(st.lists(WORDS.map(str), min_size=len(texts), max_size=len(texts)))
    chosen, tok = encodings(task, max_length)
    encoded = chosen.encode(pa.table({"text": texts, "other": others}))
    counts = dict(zip(encoded.rows.tolist(), tokens_per_row(encoded).to_pylist(), strict=True))
    for row, text in enumerate(texts):
        args = (text,) if task == "embed" else (text, others[row])
        if any(not a.strip() for a in args):
            assert row in encoded.errors and row not in counts
            continue
        own = tok(*args, truncation=True, max_length=max_length)["input_ids"]
        assert counts[row] == len(own)


def test_rerank_pairs_and_their_windows(tmp_path, table, minilm_path):
    """A reranker reads query and passage as one input: truncated, both count with their three
    special tokens; with long_text = "chunk" each window of the passage repeats the query."""
    path = classic(tmp_path / "reranker", minilm_path)
    model = {"task": "classify", "path": str(path)}
    job = job_over(tmp_path, table, model=model, input={"text_pair": "other"})
    tokens, report = counted(tmp_path, job)
    texts, others = table.column("text").to_pylist(), table.column("other").to_pylist()
    expected = own_counts(path, texts, others)
    assert tokens == expected and 64 in tokens  # some pairs were truncated
    assert report.prompt_tokens == sum(t for t in expected if t)
    # windows: a short query (a text's first words) before each window of a long passage
    queries = [" ".join(t.split()[:6]) if t else None for t in texts]
    windowed = job_over(
        tmp_path,
        table.append_column("query", pa.array(queries, pa.string())),
        model={**model, "long_text": "chunk"},
        input={"text": "query", "text_pair": "text"},
        output={"path": "windows"},
    )
    run_job(load_job(windowed))
    tokens = read_output(tmp_path / "windows").column("prompt_tokens").to_pylist()
    tok, step = AutoTokenizer.from_pretrained(path), 64 // 8
    for query, passage, got in zip(queries, texts, tokens, strict=True):
        if passage is None:
            assert got is None
            continue
        q, p = (len(tok(t, add_special_tokens=False)["input_ids"]) for t in (query, passage))
        room = 64 - 3 - q
        windows = 1 if p <= room else 1 + math.ceil((p - room) / (room - step))
        assert got == windows * (q + 3) + p + (windows - 1) * step
    assert max(tokens, key=lambda t: t or 0) > 2 * 64  # some passages were read in windows


def test_bad_usage_is_a_job_error_naming_the_key(tmp_path, table, minilm_path):
    job = job_over(tmp_path, table, model={"task": "embed", "path": str(minilm_path)})
    for value in ('"yes"', "1"):
        result = invoke("validate", str(job), "--set", f"output.usage={value}")
        assert result.exit_code == 2, result.output
        assert "[output].usage: expected true or false" in result.output
        assert "Traceback" not in result.output
