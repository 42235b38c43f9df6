"""Structured generation with a tiny random GPT-2: whatever the weights, every row's value
follows its `[generate].json_schema`, `choices` or `regex`, in static batches and in continuous
batching alike, and a value cut short by max_new_tokens is a row error, never a bad value.

The model's weights are random, so these are the worst case for a grammar: a model that knows
nothing of JSON or of the labels still writes only values that parse.
"""

from __future__ import annotations

import json
import re
import shutil

import jsonschema
import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscore.errors import ModelError, OutputConflictError
from batchscore.job.parse import load_job
from batchscore.models.generation.constraint import unpack_device, unpack_host
from batchscore.models.generation.structure import Structure, arrow_type
from batchscore.recipes.run import run_job
from tests.commands import invoke
from tests.conftest import read_output
from tests.models.generation.test_continuous import stream
from tests.models.test_generate import assert_same_tokens, generate_job, make_task, row_alone

LABELS = ("positive", "negative", "neutral")
SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": list(LABELS)},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    },
    "required": ["label", "score", "ok", "tags"],
    "additionalProperties": False,
}
STRUCT = pa.struct(
    [
        ("label", pa.string()),
        ("score", pa.int64()),
        ("ok", pa.bool_()),
        ("tags", pa.list_(pa.string())),
    ]
)


@pytest.fixture(scope="module")
def prompts(tiny_texts: list[str]) -> pa.Table:
    """Prompts of very different lengths, so rows of one batch differ in what they write."""
    by_length = sorted(tiny_texts, key=len)
    return pa.table({"text": ["Hi.", "x", *by_length[:3], *by_length[200:203], by_length[-1]]})


def values(task, prompts: pa.Table) -> dict[str, pa.Array]:
    """The task's output columns for ``prompts``, each row generated alone."""
    encoded = task.encode(prompts)
    return task.finish(encoded, row_alone(task, encoded))


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("model", ["gpt2_path", "t5_path"])
def test_choices_every_row_writes_exactly_one_of_them(request, prompts, model, do_sample):
    """Classification by a decoder: the row's text is one of the labels and nothing else, from
    a decoder-only model and a seq2seq one (static batches through `generate`) alike."""
    path = request.getfixturevalue(model)
    task = make_task(path, choices=LABELS, max_new_tokens=8, do_sample=do_sample)
    columns = values(task, prompts)
    parsed = columns["parsed"].to_pylist()
    assert set(parsed) <= set(LABELS)
    assert columns["generated"].to_pylist() == parsed
    assert columns["error"].null_count == len(parsed)
    assert set(columns["finish_reason"].to_pylist()) == {"eos"}
    assert task.columns[1] == pa.field("parsed", pa.string())
    if do_sample and model == "gpt2_path":  # sampled, it picks more than one label here (the
        # tiny T5's random logits are too far apart for a second label at any temperature)
        assert len(set(parsed)) > 1


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    choices=st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=4, unique=True),
    seed=st.integers(0, 2**16),
)
def test_any_choices_any_seed_the_row_writes_one_of_them(gpt2_path, prompts, choices, seed):
    """Hypothesis: for any labels (quotes, backslashes, newlines, any script) and any sampled
    stream, every row writes one label exactly."""
    options = {"choices": tuple(choices), "do_sample": True, "seed": seed, "temperature": 2.0}
    task = make_task(gpt2_path, max_new_tokens=40, **options)
    columns = values(task, prompts.slice(0, 4))
    assert columns["error"].null_count == 4
    assert set(columns["parsed"].to_pylist()) <= set(choices)
    assert columns["generated"].to_pylist() == columns["parsed"].to_pylist()


@settings(
    max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**16), temperature=st.sampled_from([0.7, 1.0, 3.0]))
def test_json_schema_values_parse_validate_and_fill_a_struct(gpt2_path, prompts, seed, temperature):
    """Hypothesis: whatever row streams a random model samples, every value is complete,
    parses, validates against the schema and fills the struct column as it reads."""
    options = {"do_sample": True, "seed": seed, "temperature": temperature}
    task = make_task(gpt2_path, json_schema=SCHEMA, max_new_tokens=120, **options)
    columns = values(task, prompts)
    assert columns["error"].null_count == len(prompts)  # every value complete
    for text, value in zip(
        columns["generated"].to_pylist(), columns["parsed"].to_pylist(), strict=True
    ):
        jsonschema.validate(json.loads(text), SCHEMA)
        assert value == json.loads(text)
    assert columns["parsed"].type == STRUCT
    assert task.columns[1] == pa.field("parsed", STRUCT)


def test_regex_values_match_it_whole(gpt2_path, prompts):
    pattern = r"[A-Z]{2}-[0-9]{3}( [a-z]+)?"
    task = make_task(gpt2_path, regex=pattern, max_new_tokens=40, do_sample=True)
    columns = values(task, prompts)
    assert columns["error"].null_count == len(prompts)
    assert all(re.fullmatch(pattern, text) for text in columns["parsed"].to_pylist())


@pytest.mark.parametrize("max_rows", [1, 3, 64])
@pytest.mark.parametrize("key", ["json_schema", "choices"])
def test_continuous_seats_keep_their_own_matcher(gpt2_path, prompts, max_rows, key):
    """Each seat masks with its own matcher: rows that finish leave, rows that join start their
    value from scratch, and every row writes the tokens it writes alone."""
    options = {"json_schema": SCHEMA} if key == "json_schema" else {"choices": LABELS}
    task = make_task(gpt2_path, max_new_tokens=120, do_sample=True, **options)
    assert task.continuous
    encoded = task.encode(prompts)
    alone = row_alone(task, encoded)
    out, schedule = stream(task, encoded, max_rows=max_rows)
    assert_same_tokens(out, alone)
    if key == "json_schema":  # answers of different lengths: seats left one by one
        assert len({len(t) for t in alone}) > 1
    if max_rows == 3:
        assert len(schedule.prefills) > 1  # rows joined a running batch


def test_a_value_cut_short_is_a_row_error_not_a_value(gpt2_path, prompts):
    task = make_task(gpt2_path, json_schema=SCHEMA, max_new_tokens=4)
    columns = values(task, prompts)
    errors = columns["error"].to_pylist()
    assert all(e is not None and "max_new_tokens" in e for e in errors)
    assert all("[generate].json_schema" in e for e in errors)
    assert columns["parsed"].null_count == len(prompts)
    assert set(columns["finish_reason"].to_pylist()) == {"length"}


def test_a_job_writes_parsed_values_and_row_errors(tmp_path, shards, gpt2_path):
    """Through a run: `parsed` beside the raw text, and a row that ran out of tokens kept with
    its reason under on_error = "skip" (its task columns null), or failing its shard under
    "fail"."""
    path = generate_job(tmp_path, gpt2_path, choices=list(LABELS))
    run_job(load_job(path, ["output.on_error='skip'"]))
    out = read_output(tmp_path / "out")
    assert out.column_names[:3] == ["doc_id", "generated", "parsed"]
    assert out.num_rows == 360 and out["error"].null_count == 360
    assert set(out["parsed"].to_pylist()) <= set(LABELS)

    short = tmp_path / "short"
    short.mkdir()
    path = generate_job(short, gpt2_path, json_schema=SCHEMA)
    (short / "in").symlink_to(tmp_path / "in")
    skip = ["output.on_error='skip'", "output.max_bad_share=1.0"]
    run_job(load_job(path, [*skip, "generate.max_new_tokens=3"]))
    out = read_output(short / "out")
    assert out["error"].null_count == 0 and out["parsed"].null_count == 360
    assert "the value was not complete after 3 new tokens" in out["error"][0].as_py()
    failed = invoke("run", str(path), "--set", "generate.max_new_tokens=3", "--restart")
    assert failed.exit_code not in (0, 1), failed.output
    assert "the value was not complete" in failed.stderr


@pytest.mark.parametrize(
    "section, said",
    [
        (
            {"json_schema": {"type": "integer", "minimum": 5, "maximum": 3}},
            "[generate].json_schema: Unsatisfiable schema: minimum (5) is greater than maximum (3)",
        ),
        ({"json_schema": {"type": "frob"}}, "[generate].json_schema: Invalid type: frob"),
        ({"json_schema": {"enum": []}}, "[generate].json_schema: Unsatisfiable schema"),
        ({"regex": "a(b"}, "[generate].regex: "),
        ({"regex": "a(b"}, "unclosed group"),
    ],
)
def test_validate_refuses_a_grammar_the_engine_cannot_satisfy(
    tmp_path, shards, gpt2_path, section, said
):
    """`validate` asks the grammar engine, without the weights: exit 2 naming the key, as the
    run says it, and nothing written."""
    path = generate_job(tmp_path, gpt2_path, **section)
    checked = invoke("validate", str(path))
    ran = invoke("run", str(path), "--progress", "off")
    assert checked.exit_code == ran.exit_code == 2, checked.output
    assert said in checked.stderr and said in ran.stderr
    assert not list((tmp_path / "out").glob("*.parquet"))


def test_the_schema_decides_the_output_and_its_absence_changes_nothing(tmp_path, shards, gpt2_path):
    """A folder written with choices refuses other choices; the keys left out leave the
    fingerprint of a job without them as it was (`tests/models/test_fingerprint_keys.py`)."""
    path = generate_job(tmp_path, gpt2_path, choices=["a", "b"])
    job = load_job(path, ["generate.max_new_tokens=3"])
    run_job(job)
    with pytest.raises(OutputConflictError):
        run_job(load_job(path, ["generate.max_new_tokens=3", "generate.choices=['a', 'c']"]))


def test_a_tokenizer_the_engine_cannot_read_is_a_model_error(tmp_path, gpt2_path, minilm_path):
    """A decoder with a WordPiece vocabulary (MiniLM's here): refused at load naming the key,
    not a traceback."""
    folder = tmp_path / "wordpiece-decoder"
    shutil.copytree(gpt2_path, folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(minilm_path / name, folder / name)
    with pytest.raises(ModelError, match=r"\[generate\]: .*cannot read this model's tokenizer"):
        make_task(folder, choices=LABELS)


@settings(max_examples=25, deadline=None)
@given(
    words=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=2, max_size=2 * 4).filter(
        lambda w: len(w) % 2 == 0
    ),
    width=st.integers(1, 64),
)
def test_a_packed_mask_unpacks_alike_on_host_and_device(words, width):
    """Hypothesis: bit j of word i allows token 32 i + j, by numpy on the host and by torch's
    shifts (a GPU's path, run here on the CPU), cut to the logits' width."""
    bitmask = torch.tensor(words, dtype=torch.int32).reshape(-1, 2)
    expected = np.array(
        [[(w >> j) & 1 for w in row for j in range(32)][:width] for row in bitmask.tolist()],
        dtype=bool,
    )
    assert np.array_equal(unpack_host(bitmask, width), expected)
    assert np.array_equal(unpack_device(bitmask, width).numpy(), expected)


@pytest.mark.parametrize(
    "schema, expected",
    [
        ({"type": "string"}, pa.string()),
        ({"type": ["integer", "null"]}, pa.int64()),
        ({"type": "number"}, pa.float64()),
        ({"enum": ["a", "b"]}, pa.string()),
        ({"enum": ["a", 1]}, None),
        ({"type": "array", "items": {"type": "boolean"}}, pa.list_(pa.bool_())),
        ({"type": "object"}, None),  # no declared properties: the JSON text
        ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, None),
        ({"type": "object", "properties": {"a": {"$ref": "#/x"}}}, None),
        (SCHEMA, STRUCT),
    ],
)
def test_a_schema_maps_to_arrow_where_it_can(schema, expected):
    assert arrow_type(schema) == expected
    structure = Structure("json_schema", schema)
    assert structure.arrow_type() == (expected or pa.string())


def test_a_schema_without_an_arrow_type_is_written_as_json_text():
    structure = Structure("json_schema", {"anyOf": [{"type": "string"}, {"type": "integer"}]})
    parsed, failed = structure.parse(['"x"', "12", None])
    assert parsed.to_pylist() == ['"x"', "12", None] and not failed


def test_a_value_that_does_not_fit_its_column_is_that_rows_error():
    """An unbounded integer past int64, or text that is no JSON once decoded, fails its row
    alone, never the window."""
    structure = Structure(
        "json_schema", {"type": "object", "properties": {"n": {"type": "integer"}}}
    )
    parsed, failed = structure.parse(['{"n": 1}', '{"n": ' + "9" * 30 + "}", '{"n": ', None])
    assert parsed.to_pylist() == [{"n": 1}, None, None, None]
    assert set(failed) == {1, 2}
    assert "does not fit struct<n: int64>" in failed[1] and "not JSON" in failed[2]
