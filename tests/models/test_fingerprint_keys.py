"""A task key added to a section after output folders were first written leaves the fingerprint
as it was while the key is at its default, so a folder an older batchscore wrote still resumes;
set, the key is recorded, so a change of it refuses the folder as any change of output does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from batchscore.errors import OutputConflictError
from batchscore.job.parse import load_job
from batchscore.job.sections import ClassifyConfig, EmbedConfig, GenerateConfig, SummarizeConfig
from batchscore.models.fingerprint import task_options
from batchscore.recipes.run import run_job
from tests.conftest import write_job

# What the fingerprint recorded of each section at its defaults before the keys of "every model
# a scoring team brings" (truncate_dim, quantize, ranges, top_k; activation; chat, system, stop,
# repetition_penalty) existed: folders written then hold exactly these.
RECORDED_BEFORE = {
    EmbedConfig: {"normalize": True},
    ClassifyConfig: {"all_scores": False},
    GenerateConfig: {
        "prompt": None,
        "max_new_tokens": 64,
        "num_beams": 1,
        "do_sample": False,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "seed": 0,
    },
}

SET = {
    EmbedConfig: {"truncate_dim": 64, "quantize": "binary", "top_k": 8},
    ClassifyConfig: {"activation": "none"},
    GenerateConfig: {
        "chat": True,
        "system": "Be brief.",
        "stop": ("\n",),
        "repetition_penalty": 1.2,
        "json_schema": {"type": "object", "properties": {"a": {"type": "string"}}},
        "choices": ("yes", "no"),
        "regex": "[0-9]+",
    },
}


@pytest.mark.parametrize("section", list(RECORDED_BEFORE), ids=lambda s: s.__name__)
def test_keys_at_their_defaults_leave_the_fingerprint_as_it_was(section):
    assert task_options(section()) == RECORDED_BEFORE[section]


@pytest.mark.parametrize("section", list(SET), ids=lambda s: s.__name__)
def test_a_key_set_away_from_its_default_is_recorded(section):
    for key, value in SET[section].items():
        recorded = task_options(section(**{key: value}))
        assert recorded == {**RECORDED_BEFORE[section], key: value}


def test_every_section_field_is_recorded_or_marked():
    """A field that is neither in the old record nor marked would change every old folder's
    fingerprint: a new key must carry ``WHEN_SET``."""
    for section in (EmbedConfig, ClassifyConfig, GenerateConfig, SummarizeConfig):
        before = RECORDED_BEFORE.get(section)
        for f in dataclasses.fields(section):
            if before is not None and f.name not in before and f.name != "prompt_name":
                assert f.metadata.get("fingerprint") == "when set", f"{section.__name__}.{f.name}"


def test_a_folder_resumes_at_the_defaults_and_is_refused_when_a_new_key_changes(
    tmp_path: Path, shards: Path
):
    job = write_job(
        tmp_path / "job.toml",
        input={"path": str(shards), "text": "text", "id": "doc_id"},
        model={"task": "embed", "max_length": 32, "precision": "fp32"},
        output={"path": "out"},
    )
    run_job(load_job(job))
    resumed = run_job(load_job(job))  # the defaults: the same job, nothing left to score
    assert resumed["rows"] == 0 and resumed["chunks_already_done"] > 0
    with pytest.raises(OutputConflictError, match=r"changed: task_options\.truncate_dim\)"):
        run_job(load_job(job, ["embed.truncate_dim=64"]))
