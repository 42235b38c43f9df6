"""`plan` says why its token counts differ: tokens are counted after truncation to the model's
window, and repeated inputs are scored once, so fewer tokens are padded than were counted."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from batchscore.cli import main
from batchscore.job.parse import load_job
from batchscore.recipes.run import run_job
from tests.conftest import write_job


def test_plan_explains_truncation_and_repeats(tmp_path: Path, small_corpus: pa.Table):
    texts = small_corpus.slice(0, 30)
    twice = pa.concat_tables([texts, texts.slice(0, 10)])  # 10 repeats, in one window
    (tmp_path / "in").mkdir()
    pq.write_table(twice, tmp_path / "in" / "part.parquet")
    job = write_job(
        tmp_path / "job.toml",
        input={"path": "in", "text": "text"},
        model={"task": "embed", "max_length": 32, "threads": 1},
        output={"path": "out"},
    )
    result = CliRunner().invoke(main, ["plan", str(job), "--no-timing"])
    assert result.exit_code == 0, result.stderr
    as_json = CliRunner().invoke(main, ["plan", str(job), "--no-timing", "--json"])
    tokens = json.loads(as_json.stdout)["tokens"]
    report = run_job(load_job(job))
    assert tokens["repeats"] == report["duplicates"] == 10
    assert tokens["truncated"] == report["truncated"] > 0
    assert tokens["to_run"] == report["computed_tokens"] < tokens["value"] == report["tokens"]
    lines = result.stdout.splitlines()
    cut = tokens["truncated"]
    assert (
        f"  tokens: {tokens['value']:,} (exact: every row tokenized, after truncation to the "
        f"model's window: {cut:,} input(s) cut)" in lines
    )
    assert (
        f"  repeats: 10 input(s) repeat an earlier one and are scored once: "
        f"{tokens['to_run']:,} tokens to run" in lines
    )
    batches = next(line for line in lines if line.startswith("  batches: "))
    assert f"those {tokens['to_run']:,} padded to {report['padded_tokens']:,};" in batches
