"""Token usage (`[output].usage = true`): each row's `prompt_tokens` equal its model tokenizer's
own count (truncated, special tokens, a prompt and every window counted), for embed, classify,
rerank, sparse and extractive summarize; the run's totals in its report, summary and metrics.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from batchscore.job.parse import load_job
from batchscore.observe.report import RunReport
from batchscore.recipes.driver import run_job
from tests.commands import invoke
from tests.conftest import read_output, write_job
from tests.models.st_folders import save_sparse, tiny_mlm


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


def test_sparse_and_summarize_count_what_they_read(tmp_path, table, tiny_texts):
    sparse = save_sparse(tmp_path / "splade", tiny_mlm(tmp_path / "mlm", tiny_texts))
    tokens, _ = counted(
        tmp_path, job_over(tmp_path, table, model={"task": "embed", "path": str(sparse)})
    )
    assert tokens == own_counts(sparse, table.column("text").to_pylist())
    # extractive summarize reads each sentence as a unit: the row counts all of them
    summarize = job_over(tmp_path, table, model={"task": "summarize"}, output={"path": "summaries"})
    run_job(load_job(summarize))
    out = read_output(tmp_path / "summaries")
    assert all(t is None or t > 0 for t in out.column("prompt_tokens").to_pylist())


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
    values = {
        line.split("{")[0]: line.rsplit(" ", 1)[1]
        for line in metrics.read_text().splitlines()
        if line.startswith("batchscore_")
    }
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


def test_turning_usage_on_refuses_a_folder_written_without(tmp_path, table, minilm_path):
    job = job_over(
        tmp_path,
        table,
        model={"task": "embed", "path": str(minilm_path)},
        output={"usage": False},
    )
    assert invoke("run", str(job), "--progress", "off").exit_code == 0
    result = invoke("run", str(job), "--progress", "off", "--set", "output.usage=true")
    assert result.exit_code == 5 and "usage" in result.output
