"""Job files: every problem reported at once, named by file and [section].key."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchscore.errors import JobError
from batchscore.job.parse import load_job, parse_override
from batchscore.job.sections import DEFAULT_MODEL
from tests.conftest import write_job

ROOT = Path(__file__).resolve().parents[2]


def minimal(tmp_path: Path, **extra) -> Path:
    sections = {
        "input": {"path": "data"},
        "model": {"task": "embed"},
        "output": {"path": "out"},
    }
    for name, table in extra.items():
        sections.setdefault(name, {}).update(table)
    return write_job(tmp_path / "job.toml", **sections)


def problems(path: Path, overrides=()) -> list[str]:
    with pytest.raises(JobError) as info:
        load_job(path, list(overrides))
    return info.value.problems


def test_defaults_and_relative_paths(tmp_path: Path):
    job = load_job(minimal(tmp_path))
    assert job.name == "job"
    assert job.input.path == (str(tmp_path / "data"),)
    assert job.output.path == str(tmp_path / "out")
    assert job.model.name == DEFAULT_MODEL and job.model.path is None
    assert job.batching.max_tokens == 16384 and job.batching.sort is True
    assert job.options.normalize is True


def test_all_errors_at_once_each_naming_file_and_key(tmp_path: Path):
    path = minimal(
        tmp_path,
        model={"precision": "fp61", "max_lenght": 12, "device": "gpu"},
        batching={"max_tokens": "lots", "max_rows": 0},
        outptu={"path": "x"},
    )
    found = problems(path)
    expected = [
        '[model].precision: expected one of fp32, fp16, bf16, int8, auto, got "fp61" '
        '(did you mean "fp16"?)',
        '[model].max_lenght: unknown key (did you mean "max_length"?)',
        '[batching].max_tokens: expected an integer or one of auto, got "lots"',
        "[batching].max_rows: must be at least 1, got 0",
        '[outptu]: unknown section (did you mean "output"?)',
    ]
    for message in expected:
        assert any(p == f"{path}: {message}" for p in found), (message, found)


def test_missing_required_keys(tmp_path: Path):
    path = write_job(tmp_path / "job.toml", model={"task": "embed"})
    found = problems(path)
    assert f"{path}: [input].path: required key is missing" in found
    assert f"{path}: [output].path: required key is missing" in found


def test_device_and_name_path_conflicts(tmp_path: Path):
    path = minimal(tmp_path, model={"device": "tpu", "name": "x", "path": "m"})
    found = "\n".join(problems(path))
    assert "[model].device: expected auto, cpu, cuda or cuda:N" in found
    assert "set name or path, not both" in found


def test_budget_must_hold_the_longest_row(tmp_path: Path):
    path = minimal(tmp_path, model={"max_length": 512}, batching={"max_tokens": 256})
    assert "[batching].max_tokens: 256 is below [model].max_length 512" in problems(path)[0]


def test_the_tokens_to_generate_are_max_new_tokens_and_the_budget_says_what_it_is(tmp_path):
    """vLLM's and transformers' max_tokens is the tokens to generate; here that is
    max_new_tokens, and [batching].max_tokens says it is one batch's budget."""
    model = {"task": "generate", "path": "m", "max_length": 64}
    path = minimal(tmp_path, model=model, generate={"max_tokens": 32})
    assert problems(path) == [
        f'{path}: [generate].max_tokens: unknown key (did you mean "max_new_tokens"?)'
    ]
    path = minimal(tmp_path, model=model, batching={"max_tokens": 80})
    assert problems(path) == [
        f"{path}: [batching].max_tokens: 80 is below [model].max_length + "
        "[generate].max_new_tokens (64 + 64), so one long row could never fit (it is the token "
        "budget of one batch, rows x padded length, not the tokens to generate)"
    ]


def test_overrides_read_toml_values(tmp_path: Path):
    path = minimal(tmp_path)
    job = load_job(
        path,
        ["model.max_length=128", "model.precision=bf16", "batching.sort=false", 'name="x"'],
    )
    assert job.model.max_length == 128
    assert job.model.precision == "bf16"
    assert job.batching.sort is False
    assert job.name == "x"


def test_override_errors_name_the_key(tmp_path: Path):
    found = problems(minimal(tmp_path), ["model.max_length=abc", "modle.task=embed"])
    assert any("[model].max_length: expected an integer" in p for p in found)
    assert any('[modle]: unknown section (did you mean "model"?)' in p for p in found)
    with pytest.raises(JobError, match=r"expected section\.key=value"):
        parse_override("no-equals-sign")


def test_unreadable_files(tmp_path: Path):
    with pytest.raises(JobError, match="job file not found"):
        load_job(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(JobError, match="not valid TOML"):
        load_job(bad)


def test_list_or_single_path(tmp_path: Path):
    job = load_job(minimal(tmp_path, input={"path": ["a", "b/*.parquet"]}))
    assert job.input.path == (str(tmp_path / "a"), str(tmp_path / "b/*.parquet"))


def test_each_stage_gets_its_own_section(tmp_path: Path):
    job = load_job(minimal(tmp_path, input={"id": "doc_id", "keep": ["doc_id", "lang"]}))
    assert job.input.carried == ("doc_id", "lang")


@pytest.mark.parametrize("path", sorted((ROOT / "jobs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_job_loads(path: Path):
    job = load_job(path)
    assert job.output.path and job.input.path


def test_engine_ray_section_and_where(tmp_path: Path):
    job = load_job(minimal(tmp_path), ['engine="ray"', 'ray.address="auto"', "ray.num_gpus=1"])
    assert job.engine == "ray" and job.ray.address == "auto" and job.ray.num_gpus == 1.0
    assert load_job(minimal(tmp_path)).engine == "local"
    found = problems(
        minimal(tmp_path, input={"where": "lang = = 'en'"}, ray={"actor": 2}),
        ['engine="spark"'],
    )
    assert any('engine: expected one of local, ray, got "spark"' in p for p in found)
    assert any('[ray].actor: unknown key (did you mean "actors"?)' in p for p in found)
    assert any("[input].where: not a SQL predicate polars can read" in p for p in found)


def test_urls_pass_through_unresolved(tmp_path: Path):
    job = load_job(minimal(tmp_path), ['input.path="s3://b/docs/"', 'output.path="s3://b/out"'])
    assert job.input.path == ("s3://b/docs/",) and job.output.path == "s3://b/out"


def test_one_message_per_mistake_with_a_did_you_mean_for_values(tmp_path: Path):
    """A wrong value gets one message, naming the key, the choices and the closest of them;
    a key given with a wrong value is not also "missing"."""
    path = minimal(tmp_path, model={"task": "embedding", "precision": "fp16x", "runtime": "ov"})
    assert sorted(problems(path)) == [
        f'{path}: [model].precision: expected one of fp32, fp16, bf16, int8, auto, got "fp16x" '
        '(did you mean "fp16"?)',
        f'{path}: [model].runtime: expected one of auto, torch, openvino, got "ov"',
        f"{path}: [model].task: expected one of embed, classify, generate, summarize, tensor, "
        'loglik, reward, got "embedding" (did you mean "embed"?)',
    ]
    path = minimal(tmp_path, output={"on_error": "skipp"}, batching={"max_tokens": "autoo"})
    assert sorted(problems(path)) == [
        f'{path}: [batching].max_tokens: expected an integer or one of auto, got "autoo" '
        '(did you mean "auto"?)',
        f'{path}: [output].on_error: expected one of fail, skip, got "skipp" '
        '(did you mean "skip"?)',
    ]


def test_a_section_that_is_no_table_is_said_once(tmp_path: Path):
    path = tmp_path / "job.toml"
    path.write_text('input = "data"\n[model]\ntask = "embed"\n[output]\npath = "out"\n')
    assert problems(path) == [f'{path}: input: expected a [input] table, got "data"']
    text = 'engine = "rey"\n[input]\npath = "d"\n[model]\ntask = "embed"\n[output]\npath = "o"\n'
    path.write_text(text)
    assert problems(path) == [
        f'{path}: engine: expected one of local, ray, got "rey" (did you mean "ray"?)'
    ]


def test_a_bad_number_deep_in_a_list_is_named_by_its_place(tmp_path: Path):
    """A nan among 768 numbers (or a number among strings): the message names the key and the
    first bad value's place, in plain words, and never prints the whole list back."""
    ranges = [[-1.0] * 768, [1.0] * 768]
    ranges[1][5] = float("nan")
    path = minimal(tmp_path, embed={"quantize": "int8", "ranges": ranges})
    assert problems(path) == [
        f"{path}: [embed].ranges: expected a list of lists of finite numbers; [1][5] is nan"
    ]
    path = minimal(tmp_path, input={"keep": ["lang", *range(300)]})
    assert problems(path) == [f"{path}: [input].keep: expected a list of strings; [1] is 0"]
    long = "x" * 500
    path = minimal(tmp_path, model={"device": [long]})
    (message,) = problems(path)
    assert (
        message.startswith(f"{path}: [model].device: expected a string, got [")
        and len(message) < len(str(path)) + 140
    )
