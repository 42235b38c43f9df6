"""Numbers a typo turns into a crash or a machine's worth of memory have upper bounds: a value
above one is refused at `validate` (exit 2) naming its `[section].key`; any value in range is
taken as it is. The bounds are the job file reference's (docs/job-file.md)."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.errors import JobError
from batchscore.job.parse import job_from_dict
from tests.commands import invoke
from tests.conftest import write_job

ROOT = Path(__file__).resolve().parents[2]
# every bounded key: (section, key) -> (lowest, highest) value it takes
BOUNDS: dict[tuple[str, str], tuple[float, float]] = {
    ("model", "threads"): (1, 1024),
    ("model", "max_length"): (1, 1 << 20),
    ("batching", "max_tokens"): (1, 1 << 22),
    ("batching", "max_rows"): (1, 1 << 20),
    ("batching", "window_rows"): (1, 1 << 20),
    ("output", "chunk_rows"): (1, 10_000_000),
    ("quality", "sample_rows"): (1, 1 << 16),
    ("quality", "max_share_below"): (0.0, 1.0),
    ("generate", "max_new_tokens"): (1, 1 << 15),
    ("generate", "num_beams"): (1, 64),
    ("generate", "top_k"): (0, 1 << 18),
    ("summarize", "sentences"): (1, 1 << 16),
    ("summarize", "max_sentences"): (1, 1 << 16),
    ("summarize", "max_new_tokens"): (1, 1 << 15),
    ("summarize", "num_beams"): (1, 64),
    ("tensor", "num_features"): (1, 1 << 20),
    ("ray", "actors"): (1, 1024),
    ("ray", "num_cpus"): (0.0, 1024.0),
    ("ray", "num_gpus"): (0.0, 64.0),
}
TASKS = {"generate", "summarize", "tensor"}
LARGEST_TOML_INT = 2**63 - 1


def job_setting(section: str, key: str, value: float) -> dict:
    """A valid job, but for ``[section].key = value``, in the task the section belongs to."""
    task = section if section in TASKS else "embed"
    raw: dict = {
        "input": {"path": "in", "features": ["x0"]} if task == "tensor" else {"path": "in"},
        "model": {"task": task, "path": "m"} if task != "embed" else {"task": task},
        "output": {"path": "out"},
        "tensor": {"output": "value"},
    }
    raw.setdefault(section, {})[key] = value
    if task != "tensor":
        del raw["tensor"]
    return raw


def value_in(key: tuple[str, str], above: bool) -> st.SearchStrategy:
    low, high = BOUNDS[key]
    if isinstance(high, float):
        top = 1e300 if above else high
        return st.floats(high if above else low, top, exclude_min=above)
    return st.integers(high + 1, LARGEST_TOML_INT) if above else st.integers(low, high)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), key=st.sampled_from(sorted(BOUNDS)), above=st.booleans())
def test_above_its_bound_a_value_is_refused_naming_the_key_and_in_range_it_is_taken(
    data, key, above, tmp_path_factory
):
    value = data.draw(value_in(key, above), label="value")
    section, name = key
    source = tmp_path_factory.getbasetemp() / "job.toml"
    try:
        job = job_from_dict(job_setting(section, name, value), source)
    except JobError as exc:
        assert above, exc.problems
        assert exc.problems == [
            f"{source}: [{section}].{name}: must be at most {BOUNDS[key][1]}, got {value!r}"
        ]
    else:
        assert not above, f"[{section}].{name} = {value!r} is above its bound, but was taken"
        got = getattr(job, section) if section not in TASKS else job.options
        assert getattr(got, name) == value


def test_validate_refuses_the_typos_of_the_issue_all_at_once(tmp_path: Path, shards):
    job = write_job(
        tmp_path / "job.toml",
        input={"path": str(shards)},
        model={"task": "generate", "path": "m", "threads": 100000},
        generate={"num_beams": 100000},
        output={"path": "out"},
    )
    result = invoke("validate", str(job), catch=False)
    assert result.exit_code == 2, result.output
    assert "[model].threads: must be at most 1024, got 100000" in result.stderr
    assert "[generate].num_beams: must be at most 64, got 100000" in result.stderr


def test_the_job_file_reference_lists_every_bound():
    page = (ROOT / "docs" / "job-file.md").read_text()
    for (section, key), (_, high) in BOUNDS.items():
        shown = f"{int(high):,}"
        pattern = rf"`\[{section}\]\.{key}` \| {re.escape(shown)}\b"
        assert re.search(pattern, page), (
            f"docs/job-file.md: no bound for [{section}].{key}: {shown}"
        )
