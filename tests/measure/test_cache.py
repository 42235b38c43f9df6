""" "auto" from the first run: fp32 scores the gate's rows first, a faster precision is tried
only where it can pay for itself on the job, and what was measured is kept per machine (in a
cache folder a process or a job can name) and corrected by later runs."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscore.cli import main
from batchscore.job.parse import load_job
from batchscore.job.sections import BatchingConfig, ModelConfig
from batchscore.measure.auto import choose_auto, guessed_speedup
from batchscore.measure.cache import FILE, DecisionCache, Entry, Measured, cache_folder
from batchscore.measure.decide import decide, machine_key
from batchscore.measure.gate import Trial
from batchscore.measure.load import job_sample
from batchscore.models.fingerprint import model_identity
from batchscore.models.source.locate import locate
from batchscore.precision import table
from batchscore.precision.int8_linear import int8_available
from batchscore.precision.table import available
from batchscore.recipes.run import run_job
from tests.conftest import write_job
from tests.models import tiny
from tests.models.test_tensor import FEATURES, tabular_shards
from tests.reliability import make_job

AUTO = ["model.precision=auto", "batching.max_tokens=auto", "quality.sample_rows=24"]


def kept_in(folder: Path) -> dict[str, str]:
    """The environment of a command whose cache folder is ``folder``."""
    return {"BATCHSCORE_CACHE_DIR": str(folder)}


FAST = [p for p in available(torch.device("cpu")) if p != "fp32"]
needs_int8 = pytest.mark.skipif(not int8_available(), reason="no int8 CPU kernels in this torch")


@pytest.fixture
def job(tmp_path: Path, small_corpus) -> Path:
    return make_job(tmp_path, small_corpus.slice(0, 30))


def entries(folder: Path) -> dict:
    return json.loads((folder / FILE).read_text())


def reference(tokens_per_s: float = 10_000.0, load_s: float = 1.0) -> Trial:
    """An fp32 pass over a 256-row sample of 50 padded tokens a row, as the gate would time it."""
    return Trial(
        "fp32",
        {},
        1.0,
        256,
        None,
        None,
        load_s=load_s,
        tokens_per_s=tokens_per_s,
        tokens_per_row=50.0,
    )


def test_auto_is_the_default_and_ray_jobs_default_to_a_fixed_setting(tmp_path: Path):
    assert ModelConfig(task="embed").precision == "auto"
    assert BatchingConfig().max_tokens == "auto"
    path = tmp_path / "job.toml"
    path.write_text(
        'engine = "ray"\n[input]\npath = "in"\n[model]\ntask = "embed"\n[output]\npath = "out"\n'
    )
    ray = load_job(path)
    assert ray.model.precision == "fp32" and ray.batching.max_tokens == 16384


def test_the_guess_leaves_out_openvinos_gain_where_the_candidate_would_not_get_it(monkeypatch):
    """fp32 on OpenVINO is 1.2x torch's; int8 without VNNI stays on torch, so its promise over
    torch's fp32 is not a promise over the fp32 that ran (on an AVX2 EPYC: 1.05x, not 1.2x)."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(table, "weight_levels", lambda: 63)  # a CPU without VNNI
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx2": True})
    on_torch, on_openvino = reference(), dataclasses.replace(reference(), runtime="openvino")
    assert guessed_speedup("int8", cpu, on_torch) == pytest.approx(1.2)
    assert guessed_speedup("int8", cpu, on_openvino) == pytest.approx(1.0)
    monkeypatch.setattr(table, "weight_levels", lambda: 127)  # VNNI: OpenVINO takes int8 too
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_vnni": True})
    assert guessed_speedup("int8", cpu, on_openvino) == pytest.approx(2.0)


def test_a_small_job_scores_in_fp32_and_measures_nothing_beyond_the_gate_pass(job: Path):
    report = run_job(load_job(job, AUTO))  # no environment: no cache folder
    decision = report["settled"]["precision"]
    assert report["precision"] == "fp32" and report["rows"] == 30
    assert report["from_gate"] == 24  # the gate's fp32 pass is the run's own work
    assert decision["why"].startswith("for 30 rows, the fastest that passes the quality gate")
    assert len(decision["trials"]) == 1 + len(FAST)
    assert all(": not tried (" in line for line in decision["trials"][1:])


@needs_int8
def test_a_large_job_tries_int8_and_the_next_job_weighs_what_was_measured(
    job, tmp_path, fake_machine
):
    """On an AVX2 CPU (faked: int8 its only candidate; on an AMX CPU bf16 measures ~2.7x and
    int8's 2.5x guess is then rightly not tried, so the machine at hand cannot decide it)."""
    fake_machine("avx2")
    cache = DecisionCache(tmp_path / "cache")
    # fp32 on torch: OpenVINO's fp32 is as fast as int8 on a CPU without VNNI, never tried there
    settings = load_job(job, [*AUTO, "model.runtime=torch"])
    model_path = locate(settings.model)
    table = job_sample(settings)
    first = choose_auto(settings, model_path, table, rows=10**7, known={}, unusable={})
    assert "int8" in first.measured, first.record.trials
    kept = first.measured["int8"]
    assert kept.speedup > 0 and kept.calibrate_s > 0
    key = machine_key(settings, model_identity(model_path))
    cache.learn(key, first.measured)
    assert DecisionCache(tmp_path / "cache").get(key) == Entry(first.measured, {}, kept_at(cache))
    # a later small job weighs int8 by this machine's measurement, and does not try it
    later = choose_auto(settings, model_path, table, rows=40, known=first.measured, unusable={})
    line = next(t for t in later.record.trials if t.startswith("int8"))
    assert "int8: not tried" in line and "measured here before" in line
    assert later.chosen.precision == "fp32" and later.measured == {}


def kept_at(cache: DecisionCache) -> str:
    return next(iter(json.loads(cache.path.read_text()).values()))["measured_at"]


@needs_int8
def test_a_model_int8_cannot_quantize_is_moved_past_and_remembered(tmp_path: Path, fake_machine):
    """A TorchScript model hides its Linear layers: "auto" moves on to fp32 and keeps why,
    so the next job does not try again (a fixed int8 stays the model's error, exit 4). On an
    AVX2 CPU (faked), where int8 is the only candidate: a bf16 CPU would try bf16 as well."""
    fake_machine("avx2")
    _, files = tiny.mlp_files(tmp_path / "mlp")
    tabular_shards(tmp_path / "in")
    script = write_job(
        tmp_path / "script.toml",
        input={"path": "in", "id": "id", "features": list(FEATURES)},
        model={"task": "tensor", "path": str(files["torchscript"]), "precision": "auto"},
        quality={"sample_rows": 16},
        output={"path": "out"},
        tensor={"output": "class"},
    )
    settings = load_job(script)
    model_path = locate(settings.model)
    table = job_sample(settings)
    known = {"int8": Measured(speedup=50.0, load_s=0.0)}  # as if int8 surely paid: it is tried
    auto = choose_auto(settings, model_path, table, rows=10**7, known=known, unusable={})
    assert auto.chosen.precision == "fp32"
    assert "found no torch.nn.Linear layer" in auto.unusable["int8"]
    assert any(line.startswith("int8: cannot run this model") for line in auto.record.trials)
    again = choose_auto(
        settings, model_path, table, rows=10**7, known=known, unusable=auto.unusable
    )
    assert len(again.record.trials) == 1  # int8 is not even weighed
    cache = DecisionCache(tmp_path / "cache")
    files = model_identity(model_path)
    key = machine_key(settings, files)
    cache.put(key, Entry(known))
    # as a run of a job this large settles it: what int8 cannot do is kept for later jobs
    concrete, _, _ = decide(settings, model_path, None, cache=cache, model_files=files, rows=10**7)
    assert concrete.model.precision == "fp32" and "int8" in cache.get(key).unusable
    report = run_job(settings, environ=kept_in(tmp_path / "cache"))  # end to end: exit 0
    assert report["precision"] == "fp32" and report["rows"] == 120


def damaged_entries() -> st.SearchStrategy:
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    values = st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
        ),
        max_leaves=8,
    )
    measured = st.dictionaries(st.sampled_from(["int8", "bf16", "x"]), values, max_size=2)
    return values | st.fixed_dictionaries(
        {"format": st.sampled_from([2, 1, "2"]), "measured": measured | values},
        optional={"unusable": values, "measured_at": values},
    )


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=damaged_entries())
def test_a_cache_entry_of_any_shape_is_used_or_ignored_never_a_crash(tmp_path: Path, data, caplog):
    folder = tmp_path / "cache"
    folder.mkdir(exist_ok=True)
    (folder / FILE).write_text(json.dumps({"key": data}))
    with caplog.at_level(logging.WARNING, logger="batchscore"):
        caplog.clear()
        entry = DecisionCache(folder).get("key")
    if entry is None:
        assert "does not validate" in caplog.text
    else:
        for measured in entry.measured.values():
            assert measured.speedup > 0 and measured.load_s >= 0
        assert all(isinstance(v, str) for v in entry.unusable.values())


@pytest.mark.parametrize(
    "content",
    [
        "[1, 2]",
        '{"k": "fast"}',
        '{"k": {"format": 2, "measured": {"int8": {"speedup": "fast", "load_s": 1}}}}',
        '{"k": {"format": 2, "measured": {"int8": {"speedup": -1, "load_s": 1}}}}',
        '{"k": {"format": 2, "measured": [], "unusable": {}}}',
        "not json at all",
    ],
)
def test_a_damaged_cache_is_a_warning_and_a_cold_run(job: Path, tmp_path: Path, content, caplog):
    settings = load_job(job, AUTO)
    key = machine_key(settings, model_identity(locate(settings.model)))
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / FILE).write_text(content.replace('"k"', json.dumps(key)))
    with caplog.at_level(logging.WARNING, logger="batchscore"):
        report = run_job(settings, environ=kept_in(folder))
    assert report["rows"] == 30 and report["precision"] == "fp32"
    assert "measuring again" in caplog.text


def test_an_older_entry_is_said_once_and_replaced_even_when_nothing_is_tried(
    job: Path, tmp_path: Path, caplog
):
    """An entry an earlier batchscore wrote (format 1) is ignored with one warning per run, and
    the run writes this format's entry in its place, so the next run says nothing."""
    settings = load_job(job, AUTO)
    key = machine_key(settings, model_identity(locate(settings.model)))
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / FILE).write_text(json.dumps({key: {"format": 1, "speeds": {"fp32": 4000.0}}}))
    with caplog.at_level(logging.WARNING, logger="batchscore"):
        report = run_job(settings, environ=kept_in(folder))  # 30 rows: nothing to try
    assert report["rows"] == 30 and report["precision"] == "fp32"
    assert caplog.text.count("does not validate (not an entry of format 2)") == 1
    assert DecisionCache(folder).lookup(key)[1] is None  # replaced by a valid entry
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="batchscore"):
        run_job(load_job(job, [*AUTO, 'output.path="again"']), environ=kept_in(folder))
    assert "does not validate" not in caplog.text


def test_an_unwritable_cache_folder_is_a_warning_not_an_error(job: Path, tmp_path: Path, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    cache = DecisionCache(blocker / "batchscore")
    with caplog.at_level(logging.WARNING, logger="batchscore"):
        cache.put("key", Entry({"int8": Measured(speedup=1.5, load_s=1.0)}))
    assert "cannot keep what was measured" in caplog.text
    report = run_job(load_job(job, AUTO), environ=kept_in(blocker / "batchscore"))
    assert report["rows"] == 30


def test_the_cache_folder_is_named_for_a_job_a_process_or_the_user(tmp_path: Path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")}
    assert cache_folder(env) == tmp_path / "xdg/batchscore"
    assert cache_folder({"HOME": str(tmp_path / "home")}) == tmp_path / "home/.cache/batchscore"
    process = {**env, "BATCHSCORE_CACHE_DIR": str(tmp_path / "volume")}
    assert cache_folder(process) == tmp_path / "volume"
    assert cache_folder(process, str(tmp_path / "job-cache")) == tmp_path / "job-cache"


@needs_int8
def test_a_run_corrects_a_ratio_the_cache_holds_from_a_busy_moment(job: Path, tmp_path: Path):
    """A cache that overstates int8 (measured while fp32 ran on a busy machine, say) sends the
    next run to try int8; that run measures the truth and keeps it."""
    settings = load_job(job, [*AUTO, "quality.sample_rows=8"])
    model_path = locate(settings.model)
    files = model_identity(model_path)
    key = machine_key(settings, files)
    cache = DecisionCache(tmp_path / "cache")
    cache.put(key, Entry({"int8": Measured(speedup=40.0, load_s=0.0, calibrate_s=0.0)}))
    # settled as for a job large enough to try it (a small one would not spend on trying)
    _, decision, _ = decide(settings, model_path, None, cache=cache, model_files=files, rows=10**7)
    assert decision is not None
    assert not any(t.startswith("int8: not tried") for t in decision.precision.trials)
    kept = cache.get(key).measured["int8"]
    assert 0.3 < kept.speedup < 10  # what this machine ran, not the 40x it was told


def test_check_measures_every_precision_shows_what_was_kept_and_exports_it(job, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    args = ["check", str(job), *[a for s in AUTO for a in ("--set", s)]]
    first = CliRunner(env=env).invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "measured on this machine before" not in first.output
    assert len([line for line in first.output.splitlines() if line.startswith("  ")]) >= 1
    again = CliRunner(env=env).invoke(main, [*args, "--export", str(tmp_path / "ship.json")])
    assert again.exit_code == 0, again.output
    shipped = json.loads((tmp_path / "ship.json").read_text())
    ((key, entry),) = shipped.items()
    assert entry["format"] == 2 and set(entry["measured"]) == set(FAST)
    if FAST:
        assert "measured on this machine before" in again.output
    # the exported file, placed as a container's cache, is what a fresh process reads
    image = tmp_path / "image-cache"
    image.mkdir()
    (image / FILE).write_text((tmp_path / "ship.json").read_text())
    assert DecisionCache(cache_folder({"BATCHSCORE_CACHE_DIR": str(image)})).get(key) is not None


def test_the_command_line_keeps_decisions_in_the_named_cache_folder(job: Path, tmp_path: Path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "BATCHSCORE_CACHE_DIR": str(tmp_path / "vol")}
    sets = [a for s in AUTO for a in ("--set", s)]
    result = CliRunner(env=env).invoke(main, ["check", str(job), "--refresh", *sets])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "vol" / FILE).is_file() and not (tmp_path / "xdg").exists()


def test_a_job_names_its_own_cache_folder_relative_to_its_file(job: Path, tmp_path: Path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "BATCHSCORE_CACHE_DIR": str(tmp_path / "vol")}
    sets = [a for s in [*AUTO, 'quality.cache_dir="decisions"'] for a in ("--set", s)]
    assert load_job(job, ['quality.cache_dir="decisions"']).quality.cache_dir == str(
        job.parent / "decisions"
    )
    result = CliRunner(env=env).invoke(main, ["check", str(job), "--refresh", *sets])
    assert result.exit_code == 0, result.output
    assert (job.parent / "decisions" / FILE).is_file() and not (tmp_path / "vol").exists()
