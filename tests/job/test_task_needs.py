"""What each task asks of the other sections is its section's to say (`model_needed`,
`reads_pairs`, `windows`), and a job that breaks it is refused with one message naming the key,
for every task alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchscore.errors import JobError
from batchscore.job.parse import load_job
from batchscore.job.sections import TASK_SECTIONS
from tests.conftest import write_job


def problems(tmp_path: Path, task: str, **sections) -> str:
    """load_job's message for a ``task`` job with these sections ("" where it loads)."""
    model = {"task": task, **sections.pop("model", {})}
    # tensor reads features, the other tasks a text
    inp = {"path": "in", **({"features": ["a", "b"]} if task == "tensor" else {"text": "text"})}
    if task == "reward":  # a prompt and a response (or a messages column)
        inp["text_pair"] = "response"
    inp.update(sections.pop("input", {}))
    extra = {"tensor": {"output": "class"}} if task == "tensor" else {}
    job = write_job(tmp_path / "job.toml", input=inp, model=model, output={"path": "out"}, **extra)
    try:
        load_job(job)
    except JobError as error:
        return str(error)
    return ""


@pytest.mark.parametrize("task", sorted(TASK_SECTIONS))
def test_each_task_says_what_model_it_needs(tmp_path: Path, task: str):
    said = problems(tmp_path, task)
    needed = TASK_SECTIONS[task].model_needed
    assert ("[model].path: task" in said) == (needed != "any"), said
    if needed == "file":
        assert f"task {task} needs a local model file" in said
    if needed == "own":
        assert f"task {task} needs its own model" in said
        assert not problems(tmp_path, task, model={"path": "some/model"})


@pytest.mark.parametrize("task", sorted(TASK_SECTIONS))
def test_text_pairs_only_where_the_task_reads_them(tmp_path: Path, task: str):
    said = problems(tmp_path, task, model={"path": "m"}, input={"text_pair": "other"})
    readers = ", ".join(t for t, section in TASK_SECTIONS.items() if section.reads_pairs)
    refused = f"[input].text_pair: task {task} reads one text; {readers} read pairs" in said
    assert refused == (not TASK_SECTIONS[task].reads_pairs), said


@pytest.mark.parametrize("task", sorted(TASK_SECTIONS))
def test_windows_only_where_the_task_pools_them(tmp_path: Path, task: str):
    said = problems(tmp_path, task, model={"path": "m", "long_text": "chunk"})
    refused = f"task {task} has no windows to pool" in said
    assert refused == (not TASK_SECTIONS[task].windows), said
    if refused:
        assert '[model].long_text: "chunk" reads long texts in windows for embed, classify' in said
