"""Prompt templates (`[generate].prompt`, `[summarize].prompt`): a field is a column's text as
it is, so a template is refused when the job loads (exit 2, naming the key), or renders every
row's text whatever it holds. A format spec (``{text:.2f}``) or a conversion (``{text!r}``)
would fail on a string at the first row, or quietly change the text, so both are refused.
"""

from __future__ import annotations

import string
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from batchscore.errors import JobError
from batchscore.job.parse import job_from_dict
from batchscore.models.text.inputs import Prompt
from tests.commands import command, environment
from tests.conftest import write_job

ROOT = Path(__file__).resolve().parents[2]
TOY_GPT2 = ROOT / "models" / "toy-gpt2"  # the sample decoder `make data` builds

REFUSED = [
    "Price: {text:.2f}",
    "{text:x}",
    "{text:d}",
    "{text:,}",
    "{text:=10}",
    "{text:>10}",
    "{text:.5}",
    "{text:{kind}}",
    "{text!r}",
    "{text!a}",
    "{text!s}",
    "{text[0]}",
    "{text.attr}",
    "{0}",
    "{}",
    "{text",
    "text}",
    "plain words",
]


def raw_job(task: str, prompt: str) -> dict:
    return {
        "input": {"path": "in"},
        "model": {"task": task, "path": "m"},
        "output": {"path": "out"},
        task: {"prompt": prompt},
    }


@pytest.mark.parametrize("task", ["generate", "summarize"])
@pytest.mark.parametrize("prompt", REFUSED)
def test_a_format_spec_conversion_or_access_is_refused_naming_the_key(tmp_path, task, prompt):
    with pytest.raises(JobError) as info:
        job_from_dict(raw_job(task, prompt), tmp_path / "job.toml")
    assert any(
        p.startswith(f"{tmp_path / 'job.toml'}: [{task}].prompt: ") for p in info.value.problems
    )


def test_plain_fields_and_escaped_braces_are_fine(tmp_path):
    prompt = "{{literal}} Q: {question}\nA: {text:}{text}"
    job = job_from_dict(raw_job("generate", prompt), tmp_path / "job.toml")
    texts, rows, errors = Prompt(job.options.prompt, "text").render(
        pa.table({"question": ["Why {x}?"], "text": ["1.5"]})
    )
    assert texts == ["{literal} Q: Why {x}?\nA: 1.51.5"] and rows.tolist() == [0] and not errors


def literal_render(template: str, row: dict[str, str]) -> str:
    """What a template must render to: its literal text with each field's value as it is."""
    return "".join(
        lit + (row[name] if name else "") for lit, name, _, _ in string.Formatter().parse(template)
    )


# a field: a name (a column, or what is not one), maybe a conversion, maybe a format spec
names = st.sampled_from(["text", "q", "", "0", "text.a", "text[0]", " text"])
conversions = st.sampled_from(["", "!r", "!s", "!a", "!x", "!"])
specs = st.sampled_from(["", ":", ":d", ":.2f", ":x", ":>4", ":=3", ":,", ":.1", ":{q}", ":c"])
fields = st.builds(
    lambda n, c, s: "{" + n + c + s + "}",
    names,
    conversions,
    specs | st.text(max_size=3).map(":".__add__),
)
plain = st.sampled_from(["{text}", "{q}", "{{", "}}", "{text:}"]) | st.text(
    st.characters(blacklist_characters="{}"), max_size=4
)
junk = st.sampled_from(["{", "}", ":", "!", "[", "]"]) | st.text(max_size=3)
# mostly plain parts, so that many templates render; a risky field or a stray brace in some
templates = st.lists(st.one_of(plain, plain, plain, fields, junk), max_size=6).map("".join)


@settings(max_examples=300, deadline=None)
@given(prompt=templates, values=st.lists(st.text(max_size=6), min_size=1, max_size=3))
def test_any_prompt_is_refused_at_load_or_renders_any_text(tmp_path_factory, prompt, values):
    """Whatever the prompt string: either the job is refused (a `JobError` naming
    `[generate].prompt`, exit 2 from `validate`), or it renders every row's text, each field
    replaced by the column's text unchanged, and raises nothing."""
    source = tmp_path_factory.getbasetemp() / "job.toml"
    try:
        job = job_from_dict(raw_job("generate", prompt), source)
    except JobError as exc:
        assert any(p.startswith(f"{source}: [generate].prompt: ") for p in exc.problems), (
            exc.problems
        )
        event("refused")
        return
    event("rendered")
    renderer = Prompt(job.options.prompt, "text")
    table = pa.table({c: values for c in renderer.columns})
    texts, rows, _ = renderer.render(table)
    for text, row in zip(texts, rows.tolist(), strict=True):
        assert text == literal_render(prompt, {c: values[row] for c in renderer.columns})


@pytest.mark.parametrize("task", ["generate", "summarize"])
def test_validate_refuses_a_format_spec_with_exit_2_naming_the_key(tmp_path, task):
    """The black-box case: `batchscore validate` in a real process, before any model loads."""
    (tmp_path / "in").mkdir()
    job = write_job(
        tmp_path / "job.toml",
        input={"path": str(ROOT / "data" / "docs")},
        model={"task": task, "path": str(TOY_GPT2), "max_length": 32},
        output={"path": "out"},
        **{task: {"prompt": "Price: {text:.2f}", "max_new_tokens": 2}},
    )
    out = subprocess.run(
        command(job, verb="validate"),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    assert f"[{task}].prompt: {{text:.2f}}" in out.stderr and "Traceback" not in out.stderr


def test_score_refuses_a_format_spec_naming_the_prompt():
    """`score(..., prompt=...)`: a `JobError` naming the option, not a bare ValueError from
    the first row."""
    import batchscore

    with pytest.raises(JobError, match=r"score\(\): \[generate\]\.prompt: \{text:d\}"):
        batchscore.score(
            ["a"], task="generate", model=TOY_GPT2, prompt="{text:d}", max_new_tokens=2
        )
