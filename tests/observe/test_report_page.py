"""The report page's numbers (pure functions of a run report) and the `report` command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from batchscore.cli import main
from batchscore.observe.figures import buckets, histogram, page_numbers, pick_run, rates
from batchscore.observe.html import render
from batchscore.observe.phases import PHASES
from batchscore.observe.shape import Shape
from batchscore.pipeline.sampler import form_batches, padded_tokens


def test_shape_counts_lengths_and_batch_widths_like_the_sampler():
    lengths = np.array([3, 9, 4, 4, 12, 7, 3, 30])
    cut = form_batches(lengths, max_tokens=40, max_rows=4)
    shape = Shape()
    shape.add(lengths, cut)
    other = Shape()
    other.add(lengths, cut)
    shape.merge(other)  # two replicas' windows
    data = shape.to_json()
    assert dict(map(tuple, data["lengths"])) == {3: 4, 4: 4, 7: 2, 9: 2, 12: 2, 30: 2}
    assert sum(rows for _, _, rows, _ in data["batches"]) == 2 * len(lengths)
    assert sum(tokens for *_, tokens in data["batches"]) == 2 * lengths.sum()
    padded = sum(rows * width for width, _, rows, _ in data["batches"])
    assert padded == 2 * padded_tokens(lengths, cut)  # what the run report counts
    (bucket,) = buckets([[30, 1, 2, 40]])
    assert bucket["padding_efficiency"] == round(40 / 60, 4)


def test_histogram_bins_every_unit():
    lengths = [[n, n % 5 + 1] for n in range(1, 500)]
    hist = histogram(lengths)
    assert len(hist["counts"]) <= 64 and sum(hist["counts"]) == sum(c for _, c in lengths)
    assert len(hist["edges"]) == len(hist["counts"]) + 1 and hist["edges"][-1] > 499


def test_rates_between_timeline_points():
    timeline = {"t": [0, 1, 3], "rows": [0, 10, 30], "tokens": [0, 100, 500], "busy_s": [0, 1, 2]}
    points = rates(timeline, replicas=1)
    assert [p["rows_per_s"] for p in points] == [10, 10]
    assert [p["tokens_per_s"] for p in points] == [100, 200]
    assert [p["model_busy"] for p in points] == [1.0, 0.5]


def test_the_run_to_report_is_the_newest_that_did_something():
    empty, real = {"rows": 0, "outcome": "ok"}, {"rows": 5, "outcome": "ok"}
    assert pick_run([empty, real, empty]) is real
    assert pick_run([empty]) is empty and pick_run([]) is None
    failed = {"rows": 0, "outcome": "failed"}
    assert pick_run([failed, real]) is failed


def test_a_report_without_recorded_shape_still_renders():
    old = {"job": "j", "rows": 3, "wall_s": 1.0, "outcome": "ok", "failed_shards": []}
    page = render(page_numbers(old, {"shards": []}))
    assert page.count("Not recorded by this run") == 4 and "<script" not in page
    assert "holds no" not in page and "has no shape numbers" in page and "predates" not in page
    assert "No shard to show." in page


def test_report_command(embed_job: Path, tmp_path: Path):
    runner = CliRunner()
    none = runner.invoke(main, ["report", str(embed_job), "-o", str(tmp_path / "r.html")])
    assert none.exit_code == 2 and "no run report" in none.stderr
    assert runner.invoke(main, ["run", str(embed_job), "--progress", "off"]).exit_code == 0
    assert runner.invoke(main, ["run", str(embed_job), "--progress", "off"]).exit_code == 0
    numbers = json.loads(runner.invoke(main, ["report", str(embed_job), "--json"]).output)
    assert numbers["figures"]["rows"] == 360  # the run that scored, not the empty one after it
    assert sum(numbers["histogram"]["counts"]) == 360
    assert sum(b["rows"] for b in numbers["buckets"]) == 360
    assert numbers["timeline"] and all(0 <= p["model_busy"] <= 1 for p in numbers["timeline"])
    assert [s["this_run"] for s in numbers["shards"]] == [120, 120, 120]
    made = runner.invoke(main, ["report", str(embed_job), "-o", str(tmp_path / "r.html")])
    assert made.exit_code == 0 and ": ok" in made.output
    page = (tmp_path / "r.html").read_text()
    assert page.count("<svg") == 5 and "embed" in page


def test_the_page_draws_where_the_whole_runs_time_went():
    """The phases chart spans the whole run, start-up to the end, measuring in seconds."""
    spent = [1.5, 0.5, 31.0, 1.0, 7.0, 0.5]
    phases = dict(zip(PHASES, spent, strict=True))
    report = {"job": "j", "rows": 3, "wall_s": 40.0, "outcome": "ok", "failed_shards": []}
    report["phases"] = phases
    numbers = page_numbers(report, {"shards": []})
    assert [p["phase"] for p in numbers["phases"]] == list(PHASES)
    page = render(numbers)
    chart = page[page.index('id="phases"') : page.index("</figure>", page.index('id="phases"'))]
    assert "<svg" in chart and "measuring 31.0 s" in chart and "start-up 1.5 s" in chart
    assert "<b>31.0 s</b><span>measuring" in page
