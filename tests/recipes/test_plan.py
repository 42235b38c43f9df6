"""`batchscore plan`: a dry run whose counts are the run's own, and whose time is an estimate."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import transformers
from click.testing import CliRunner

from batchscore.cli import main
from batchscore.job.parse import load_job
from batchscore.measure.cache import DecisionCache, Entry, Measured
from batchscore.measure.decide import machine_key
from batchscore.models.fingerprint import model_identity
from batchscore.models.source.locate import locate
from batchscore.precision.table import available
from batchscore.recipes.estimate import plan_job
from batchscore.recipes.run import run_job
from tests.conftest import record_of, write_job
from tests.models import tiny
from tests.output.tiny import tiny_job, write_shard
from tests.reliability import make_job


def no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make loading any model's weights fail: the plan must not need them."""

    def refuse(*args, **kwargs):
        raise AssertionError("plan loaded model weights")

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", refuse)
    # every model class (a classifier's, a generator's) loads through this one
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", staticmethod(refuse))


def test_an_exact_plan_counts_what_the_run_then_does(embed_job: Path, monkeypatch):
    sets = ["input.where=\"kind <> 'topic'\""]
    with monkeypatch.context() as patch:
        no_weights(patch)
        planned = plan_job(load_job(embed_job, sets), timing=False)
    assert planned["estimate"] == {
        "wall_s": None,
        "basis": "no earlier run to go by, and timing is off",
    }
    report = run_job(load_job(embed_job, sets))
    assert planned["rows_to_score"] == report["rows"] and planned["filtered"] == report["filtered"]
    assert_tokens_as_run(planned, report)
    assert planned["padding"]["batches"] == report["batches"]
    assert planned["padding"]["efficiency"] == pytest.approx(report["padding_efficiency"], abs=1e-4)
    assert planned["truncated"] == report["truncated"] and planned["rows_committed"] == 0

    done = plan_job(load_job(embed_job, sets), timing=False)
    assert done["rows_committed"] == report["rows"] and done["chunks_to_score"] == 0
    assert done["estimate"]["wall_s"] == 0.0


def test_a_pair_job_in_windows_plans_what_its_run_then_does(tmp_path, shards, minilm_path):
    """Text pairs read in windows (a short text, then a document): the plan reads both columns
    through the classifier's own encoding, without its weights, and counts what the run does."""
    model = tiny.bert_classifier(tmp_path / "nli", minilm_path, ["yes", "no"])
    job = write_job(
        tmp_path / "pairs.toml",
        input={"path": "in", "text": "kind", "text_pair": "text", "id": "doc_id"},
        model={"task": "classify", "path": str(model), "max_length": 64, "long_text": "chunk",
               "threads": 1},
        batching={"max_tokens": 4096, "window_rows": 64},
        output={"path": "out", "chunk_rows": 50},
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        no_weights(patch)
        planned = plan_job(load_job(job), timing=False)
    report = run_job(load_job(job))
    assert planned["rows_to_score"] == report["rows"] == 360 and report["chunked"] > 0
    assert_tokens_as_run(planned, report)
    assert planned["padding"]["batches"] == report["batches"] > 0


def test_a_plan_after_a_run_estimates_from_it_and_changes_nothing(embed_job: Path):
    report = run_job(load_job(embed_job))
    records = [record_of(embed_job.parent / "out", 0, chunk) for chunk in range(3)]
    for record in records:  # shard 0's chunks (50 + 50 + 20 rows) are to do again
        record.unlink()
    planned = plan_job(load_job(embed_job), timing=False)
    assert planned["rows_committed"] == 240 and planned["rows_to_score"] == 120
    estimate = planned["estimate"]
    assert estimate["basis"].startswith(f"the last run ({report['run_id']})")
    assert estimate["load_s"] == pytest.approx(report["load_s"], abs=0.01)
    assert estimate["wall_s"] > estimate["load_s"]
    (embed_job.parent / "in/docs-001.parquet").touch()  # changed since: the run would redo it
    again = plan_job(load_job(embed_job), timing=False)
    assert again["rows_to_score"] == 240
    assert len(list((embed_job.parent / "out/_batchscore/done").iterdir())) == 6  # untouched


def test_a_big_input_is_sampled_with_an_error_bar(embed_job: Path):
    exact = plan_job(load_job(embed_job), timing=False)["tokens"]["value"]
    sampled = plan_job(load_job(embed_job), sample_rows=100, timing=False)
    tokens = sampled["tokens"]
    assert not tokens["exact"] and 60 <= tokens["sampled_rows"] <= 140
    assert tokens["low"] <= exact <= tokens["high"]
    assert tokens["high"] - tokens["low"] < exact  # an interval that says something
    assert sampled["rows_to_score"] == 360 and 0.5 < sampled["padding"]["efficiency"] <= 1


def test_without_a_run_a_timed_sample_gives_the_rate(embed_job: Path):
    estimate = plan_job(load_job(embed_job))["estimate"]
    assert re.match(r"a timed sample on this machine \((\d+) rows, fp32\)", estimate["basis"])
    assert int(re.search(r"\((\d+) rows", estimate["basis"])[1]) == 360  # all of them: < 512
    assert estimate["rate"] > 0 and estimate["wall_s"] > estimate["load_s"] > 0


def test_plan_command_gates_a_scheduler(embed_job: Path):
    runner = CliRunner()
    text = runner.invoke(main, ["plan", str(embed_job), "--no-timing"])
    assert text.exit_code == 0, text.output
    assert "rows to score: 360" in text.output and "ESTIMATE: none" in text.output
    data = json.loads(runner.invoke(main, ["plan", str(embed_job), "--json", "--no-timing"]).output)
    assert data["tokens"]["exact"] and data["rows_to_score"] == 360
    over = runner.invoke(main, ["plan", str(embed_job), "--no-timing", "--max-tokens", "100"])
    assert over.exit_code == 12 and "over the limit" in over.stderr


def relayout(path: Path, **columns: Callable[[pa.Array], pa.Array]) -> None:
    """Write a shard again with some columns in another Arrow layout."""
    table = pq.read_table(path)
    for name, change in columns.items():
        at = table.schema.get_field_index(name)
        table = table.set_column(at, name, change(table[name].combine_chunks()))
    pq.write_table(table, path, row_group_size=30)


def test_a_plan_over_mixed_layouts_and_bad_shards_names_the_bad_ones(embed_job: Path):
    """Text as string_view, large_string and dictionary, ids as strings in one layout or
    another, one shard truncated and one with two columns named ``text``: the plan counts the
    good shards' rows (every row, and a sample of them), times the model on rows drawn from
    all of them, and lists the bad shards among its failures, as the run would fail them."""
    folder = embed_job.parent / "in"
    relayout(folder / "docs-000.parquet", text=lambda c: c.cast(pa.string_view()))
    relayout(
        folder / "docs-001.parquet",
        text=lambda c: c.cast(pa.large_string()),
        doc_id=lambda c: c.cast(pa.large_string()),
        kind=lambda c: c.dictionary_encode(),
    )
    relayout(folder / "docs-002.parquet", text=lambda c: c.dictionary_encode())
    good = pq.read_table(folder / "docs-000.parquet")
    twice = pa.Table.from_arrays([*good.columns, good["text"]], [*good.column_names, "text"])
    pq.write_table(twice, folder / "docs-003.parquet")
    data = (folder / "docs-000.parquet").read_bytes()
    (folder / "docs-004.parquet").write_bytes(data[: len(data) // 2])
    for sample_rows in (50_000, 100):
        where = ["input.where=\"kind <> 'x'\""]
        planned = plan_job(load_job(embed_job, where), sample_rows=sample_rows)
        assert planned["rows_to_score"] == 360
        assert planned["estimate"]["rate"] > 0  # timed on rows of every layout
        failures = {Path(f["shard"]).name: f["error"] for f in planned["failures"]}
        assert sorted(failures) == ["docs-003.parquet", "docs-004.parquet"]
        assert "column 'text' appears 2 times" in failures["docs-003.parquet"]
        assert "not a readable Parquet file" in failures["docs-004.parquet"]


def test_the_estimate_counts_what_auto_will_measure_cold_and_warm(tmp_path, corpus):
    """An unsettled "auto": the estimate has each phase, scores at the precision the run is
    expected to choose, and says which speeds are guesses; with this machine's measurement in
    the cache, the measured ratio replaces the guess. The whole corpus: a job large enough
    that trying a faster precision fits the spending rule."""

    job = load_job(make_job(tmp_path, corpus), ["model.precision=auto", "quality.sample_rows=16"])
    faster = [p for p in available(torch.device("cpu")) if p != "fp32"]
    cache = DecisionCache(tmp_path / "cache")
    environ = {"BATCHSCORE_CACHE_DIR": str(tmp_path / "cache")}
    cold = plan_job(job, environ=environ, startup_s=1.5)["estimate"]
    assert set(cold["parts"]) == {"start-up", "measuring", "loading", "scoring"}
    assert cold["parts"]["start-up"] == 1.5
    assert cold["wall_s"] == pytest.approx(sum(cold["parts"].values()), abs=0.1)
    assert cold["cold_wall_s"] == cold["wall_s"]  # an empty cache: this machine is cold
    if cold["precision"] != "fp32":
        assert cold["parts"]["measuring"] > 0 and cold["guesses"]
    if not faster:
        return
    name = faster[0]
    key = machine_key(job, model_identity(locate(job.model)))
    cache.put(key, Entry({name: Measured(speedup=50.0, load_s=0.1)}))
    warm = plan_job(job, environ=environ)["estimate"]
    assert warm["precision"] == name and not any(name in g for g in warm["guesses"])
    assert warm["parts"]["scoring"] < cold["parts"]["scoring"]


def assert_tokens_as_run(planned: dict, report: dict) -> None:
    """plan's exact token counts are the run's: real, run once (repeats), truncated, padded."""
    assert planned["tokens"] == {
        "value": report["tokens"],
        "exact": True,
        "to_run": report["computed_tokens"],  # repeats are scored once
        "repeats": report["duplicates"],
        "truncated": report["truncated"],
    }
    assert planned["padding"]["padded_tokens"] == report["padded_tokens"]


def test_a_plan_of_a_folder_whose_job_record_is_gone_warns_of_no_conflict(tmp_path: Path):
    """The data files prove whose output it is, so the run rewrites the record: the plan
    neither warns of a conflict nor advises --restart, which would discard every row."""
    job = tiny_job(tmp_path)
    write_shard(tmp_path / "in/a.parquet", 9)
    run_job(load_job(job))
    (tmp_path / "out/_batchscore/job.json").unlink()
    planned = plan_job(load_job(job), timing=False)
    assert planned["conflict"] is None and planned["rows_committed"] == 9


@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_the_estimate_is_within_2x_of_the_run_it_plans(tmp_path: Path, corpus, cache: str):
    """plan's estimate of a default ("auto") job against the run that follows, on the real
    corpus, with an empty cache folder and with one a run filled: within 2x either way (a
    guard against gross regressions; BENCHMARKS.md holds the close comparison, scripts/
    bench_cold.py). Wall times compare in one process, so start-up is no part of either."""
    environ = {"BATCHSCORE_CACHE_DIR": str(tmp_path / "cache")}
    rows = corpus.slice(0, 800)
    if cache == "warm":  # another folder's run of the same job fills the cache: not compared
        run_job(load_job(make_job(tmp_path / "earlier", rows)), environ=environ)
    job = make_job(tmp_path / "planned", rows)
    estimate = plan_job(load_job(job), environ=environ)["estimate"]
    report = run_job(load_job(job), environ=environ)
    ratio = estimate["wall_s"] / report["wall_s"]
    print(f"{cache}: estimate {estimate['wall_s']:.1f} s, run {report['wall_s']:.1f} s")
    assert 0.5 <= ratio <= 2.0, (estimate, report["wall_s"], report["phases"])
