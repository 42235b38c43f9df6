"""The run report's counters: every field of `RunStats`, copied, with the rates derived."""

from __future__ import annotations

import dataclasses
import json

import pytest

from batchscore.job.parse import load_job
from batchscore.observe.figures import page_numbers
from batchscore.observe.html import render
from batchscore.observe.metrics import render as render_metrics
from batchscore.observe.run_stats import RunReport, RunStats, headline, summary
from batchscore.recipes.run import run_job
from tests.reliability import make_job


def test_the_report_holds_every_counter_and_does_not_share_the_stats_dicts():
    stats = RunStats(rows=10, tokens=120, computed_tokens=120, padded_tokens=150, wall_s=2.0)
    stats.committed("a.parquet", 6, 1, 0)
    stats.committed("b.parquet", 4, 0, 2)
    stats.timeline = {"at": [0.5, 1.0], "rows": [5, 10]}
    report = stats.report(job="j")
    stats.phases = {"preparing": 0.25, "scoring": 1.5}
    report = stats.report(job="j")
    skip = ("shape", "phases")
    expected = {k: v for k, v in dataclasses.asdict(stats).items() if k not in skip}
    assert {k: report[k] for k in expected} == expected
    # the wall time split: "finishing" is what the timed phases leave of it
    assert report["phases"] == {"preparing": 0.25, "scoring": 1.5, "finishing": 0.25}
    assert report["padding_efficiency"] == 0.8 and report["rows_per_s"] == 5.0
    assert report["job"] == "j" and json.loads(json.dumps(report)) == report
    stats.committed("a.parquet", 1, 0, 0)  # the run goes on: the report already made stays
    stats.timeline["at"].append(2.0)
    assert report["shards"]["a.parquet"]["rows"] == 6 and report["timeline"]["at"] == [0.5, 1.0]


def test_a_job_the_quality_gate_scored_counts_the_gates_batches(tmp_path, small_corpus):
    """Issue 51: a small job whose rows the quality gate scored said "0 padded in 0 batches",
    "model busy 0.0%" and "model load 0.0 s", and its report page said the run "predates the
    report page". The gate's pass, adopted, is the run's own: its batches, padded tokens, model
    time and load are counted, each unit in one batch (never scored twice)."""
    job = make_job(tmp_path, small_corpus.slice(0, 30))
    report = run_job(load_job(job, ["batching.max_tokens=auto", "quality.sample_rows=64"]))
    assert report["from_gate"] == 30 and report["rows"] == 30
    assert report["batches"] > 0 and report["padded_tokens"] >= report["computed_tokens"] > 0
    assert report["computed_tokens"] == report["tokens"]  # no repeats: every unit was run once
    assert sum(rows for _, _, rows, _ in report["shape"]["batches"]) == report["units"] == 30
    assert 0 < report["model_busy_share"] <= 1 and report["load_s"] > 0
    assert report["tuning_s"] == pytest.approx(report["phases"]["measuring"], abs=0.01)
    said = summary(report)
    assert " 0 batches" not in said and "model busy 0.0%" not in said, said
    assert "model load 0.0 s" not in said, said
    page = render(page_numbers(report, {"shards": []}))
    assert "predates" not in page and "Not recorded" not in page


def test_generation_says_generated_tokens_per_second_and_names_the_prompts():
    """Issue 51: generation's tokens/s counted prompt tokens only; the figure people compare is
    generated tokens/s. The summary, the report and the metrics carry both, each named."""
    stats = RunStats(rows=8, tokens=100, generated_tokens=400, wall_s=2.0, chunks_pending=1)
    report = stats.report(job="j", outcome="ok", output="out", device="cpu", precision="fp32")
    assert report["generated_tokens_per_s"] == 200.0 and report["tokens_per_s"] == 50.0
    assert "(4.0 rows/s, 200 generated tokens/s, 50 prompt tokens/s)" in headline(report)
    assert RunReport.of(report).generated_tokens_per_s == 200.0
    text = render_metrics(report, None)
    assert 'batchscore_generated_tokens_per_second{job="j"} 200.0' in text
    assert 'batchscore_tokens_per_second{job="j"} 50.0' in text
    plain = RunStats(rows=8, tokens=100, wall_s=2.0, chunks_pending=1).report(job="j", outcome="ok")
    assert headline(plain).endswith("(4.0 rows/s, 50 tokens/s)")
