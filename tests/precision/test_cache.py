""" "auto" is the default, measured once per machine and kept in the user's cache folder; the
quality gate still runs on every output folder's first run, with that job's rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchscore.cli import main
from batchscore.job.load import load_job
from batchscore.job.sections import BatchingConfig, ModelConfig
from batchscore.pipeline.driver import run_job
from batchscore.precision.cache import FILE, DecisionCache, user_cache_folder
from tests.reliability import make_job

AUTO = ["model.precision=auto", "batching.max_tokens=auto", "quality.sample_rows=24"]


@pytest.fixture
def job(tmp_path: Path, small_corpus) -> Path:
    return make_job(tmp_path, small_corpus.slice(0, 30))


def entries(folder: Path) -> dict:
    return json.loads((folder / FILE).read_text())


def test_auto_is_the_default_and_ray_jobs_default_to_a_fixed_setting(tmp_path: Path):
    assert ModelConfig(task="embed").precision == "auto"
    assert BatchingConfig().max_tokens == "auto"
    path = tmp_path / "job.toml"
    path.write_text('engine = "ray"\n[input]\npath = "in"\n[model]\ntask = "embed"\n'
                    '[output]\npath = "out"\n')  # fmt: skip
    ray = load_job(path)
    assert ray.model.precision == "fp32" and ray.batching.max_tokens == 16384


def test_a_second_output_folder_reuses_this_machines_measurement(job: Path, tmp_path: Path):
    cache = DecisionCache(tmp_path / "cache")
    first = run_job(load_job(job, AUTO), cache=cache)
    measured = first["settled"]["precision"]
    assert measured["why"].startswith("the fastest that passes the quality gate")
    ((key, entry),) = entries(tmp_path / "cache").items()
    assert "embed" in key and "torch" in key and entry["precision"] == measured["precision"]
    assert entry["budgets"][measured["precision"]]["max_tokens"] > 0
    second = run_job(load_job(job, [*AUTO, 'output.path="out2"']), cache=cache)
    cached = second["settled"]["precision"]
    assert cached["precision"] == measured["precision"] and cached["trials"] == entry["trials"]
    assert cached["why"].startswith("cached on this machine")
    assert second["settled"]["batching"]["max_tokens"] == first["settled"]["batching"]["max_tokens"]
    if cached["precision"] != "fp32":  # the gate ran again, on this job's rows
        assert "on this job's rows" in cached["why"] and cached["agreement"]
    assert second["rows"] == 30


def test_a_cached_precision_that_fails_this_jobs_gate_is_measured_again(job: Path, tmp_path):
    cache = DecisionCache(tmp_path / "cache")
    run_job(load_job(job, AUTO), cache=cache)
    ((key, entry),) = entries(tmp_path / "cache").items()
    budgets = {"int8": {"max_tokens": 4096, "why": "test"}}
    cache.put(key, {**entry, "precision": "int8", "budgets": budgets})
    strict = [*AUTO, "quality.min_cosine=1.0", "quality.min_agreement=1.0", 'output.path="o3"']
    report = run_job(load_job(job, strict), cache=cache)
    decision = report["settled"]["precision"]
    assert not decision.get("cached") and decision["precision"] == "fp32"  # measured afresh
    assert report["rows"] == 30


def test_check_shows_the_cached_table_and_refresh_measures_again(job: Path, tmp_path: Path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    folder = user_cache_folder(env)
    args = ["check", str(job), *[a for s in AUTO for a in ("--set", s)]]
    measured = CliRunner(env=env).invoke(main, args)
    assert measured.exit_code == 0, measured.output
    stamp = entries(folder)
    shown = CliRunner(env=env).invoke(main, args)
    assert shown.exit_code == 0 and "cached on this machine" in shown.output
    assert entries(folder) == stamp  # shown, not measured
    refreshed = CliRunner(env=env).invoke(main, [*args, "--refresh"])
    assert refreshed.exit_code == 0 and "cached on this machine" not in refreshed.output


def test_the_command_line_keeps_decisions_in_xdg_cache_home(job: Path, tmp_path: Path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    sets = [a for s in AUTO for a in ("--set", s)]
    result = CliRunner(env=env).invoke(main, ["run", str(job), "--progress", "off", *sets])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "xdg/batchscore" / FILE).is_file()
