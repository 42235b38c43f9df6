"""[generate].chat: each row as the user turn of the model's chat template, tokenized and
generated as transformers' ``apply_chat_template`` and ``generate`` do, row by row.

The model is a tiny Llama-style decoder (random weights) whose tokenizer adds BOS to every text
and ships a ChatML template in tokenizer_config.json, as hub instruction models do.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.cli import main
from batchscore.errors import JobError, ModelError, OutputConflictError
from batchscore.job.parse import job_from_dict, load_job
from batchscore.job.sections import GenerateConfig, InputConfig, ModelConfig
from batchscore.models.generate import PromptEncoding
from batchscore.models.generation.chat import Chat, has_chat_template
from batchscore.recipes.run import run_job
from tests.commands import command, environment
from tests.conftest import read_output
from tests.models import tiny
from tests.models.generation.test_continuous import stream
from tests.models.test_generate import generate, generate_job, make_task

SYSTEM = "You are a careful assistant. Answer in one line."
USER = "Summarize: {text}"
# pieces of user text that a template or a tokenizer could mistake for its own
TRICKY = ["<|im_start|>", "<|im_end|>", "<s>", "</s>", "{{ bos_token }}", "{% if %}", "\n", " "]


@pytest.fixture(scope="module")
def chat_path(tmp_path_factory: pytest.TempPathFactory, tiny_texts: list[str]) -> Path:
    return tiny.llama_chat(tmp_path_factory.mktemp("llama-chat"), tiny_texts)


@pytest.fixture(scope="module")
def reference(chat_path):
    """transformers' own tokenizer and model for the folder, loaded apart from batchscore."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(chat_path, dtype=torch.float32).eval()
    return AutoTokenizer.from_pretrained(chat_path), model


def messages(text: str, system: str | None) -> list[dict[str, str]]:
    head = [{"role": "system", "content": system}] if system is not None else []
    return [*head, {"role": "user", "content": text}]


def templated(hf, text: str, system: str | None) -> list[int]:
    """``apply_chat_template``'s prompt: what the issue compares with."""
    return hf.apply_chat_template(
        messages(text, system), add_generation_prompt=True, tokenize=True, return_dict=False
    )


def alone(model, ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy ``generate`` on one prompt, by itself: its new tokens."""
    eos = model.generation_config.eos_token_id
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=eos,
        )
    return out[0, len(ids) :].tolist()


user_texts = st.lists(st.one_of(st.text(max_size=8), st.sampled_from(TRICKY)), max_size=6).map(
    "".join
)


@pytest.fixture(scope="module")
def chat_encoding(chat_path) -> PromptEncoding:
    """The chat job's encoding alone (its tokenizer, no weights), as `batchscore plan` loads it."""
    model = ModelConfig(task="generate", precision="fp32", max_length=200)
    options = GenerateConfig(chat=True, max_new_tokens=10)
    return PromptEncoding(chat_path, model=model, options=options, inp=InputConfig(path=()))


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(user_texts, min_size=1, max_size=4),
    system=st.none() | st.text(max_size=12),
)
def test_chat_prompts_are_apply_chat_templates_tokens(chat_path, chat_encoding, texts, system):
    """Whatever the user text (the template's own markers, Jinja, newlines, any Unicode) and
    whatever the system message, a row's prompt is the ids of ``apply_chat_template``."""
    encoding = chat_encoding
    hf = encoding.encoder.hf
    chat = Chat(hf, system, chat_path)
    rows = np.arange(len(texts))
    encoded = chat.encode(encoding.encoder, texts, rows, {})
    assert encoded.truncated == 0 and encoded.rows.tolist() == rows.tolist()
    for i, text in enumerate(texts):
        assert encoded.ids[i].tolist() == templated(hf, text, system), f"row {i}: {text!r}"


def test_the_template_writes_the_special_tokens_and_nothing_adds_more(chat_path):
    """The tokenizer adds BOS to plain text; the template writes its own, so tokenizing the
    rendered prompt with special tokens would lead with two: a prompt here has one."""
    task = make_task(chat_path, max_length=200, chat=True, system=SYSTEM)
    hf = task.generator.encoder.hf
    bos = hf.bos_token_id
    conversation = messages("Hi", SYSTEM)
    rendered = hf.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    assert hf(rendered)["input_ids"][:2] == [bos, bos]  # what adding special tokens would do
    ids = task.encode(pa.table({"text": ["Hi"]})).ids[0].tolist()
    assert ids[0] == bos and ids[1] != bos
    assert ids == templated(hf, "Hi", SYSTEM)


@pytest.fixture(scope="module")
def chat_rows(tiny_texts: list[str]) -> list[str]:
    """Row texts of very different lengths whose prompts fit the window whole."""
    by_length = sorted(tiny_texts, key=len)
    return ["Hi.", "x", *by_length[:10], *by_length[60:66], *by_length[120:124]]


@pytest.mark.parametrize("system", [None, SYSTEM])
def test_chat_outputs_equal_generate_on_apply_chat_templates_prompt(
    chat_path, reference, chat_rows, system
):
    """Every row, statically batched and continuously batched, generates exactly what
    transformers' ``generate`` generates alone on ``apply_chat_template``'s prompt."""
    hf, model = reference
    new = 12
    task = make_task(chat_path, max_length=200, max_new_tokens=new, chat=True, system=system)
    encoded = task.encode(pa.table({"text": chat_rows}))
    assert encoded.truncated == 0 and len(encoded.rows) == len(chat_rows)
    expected = [alone(model, templated(hf, text, system), new) for text in chat_rows]
    static = generate(task, encoded, [np.arange(len(chat_rows))])
    assert task.continuous
    continuous, schedule = stream(task, encoded, max_rows=5)
    assert len(schedule.prefills) > 2  # rows joined a running batch
    for i, want in enumerate(expected):
        assert static[i].tolist() == want, f"row {i} (static)"
        assert continuous[i].tolist() == want, f"row {i} (continuous)"
    lengths = {len(t) for t in expected}
    assert min(lengths) < new and max(lengths) == new  # some rows chose EOS, others ran on
    out = task.finish(encoded, static)
    texts = [hf.decode(t, skip_special_tokens=True) for t in expected]
    assert out["generated"].to_pylist() == texts
    eos = model.generation_config.eos_token_id
    reasons = ["eos" if t and t[-1] == eos else "length" for t in expected]
    assert out["finish_reason"].to_pylist() == reasons


@pytest.fixture(scope="module")
def chat_tasks(chat_path):
    """One loaded chat task per system message (None, or SYSTEM), built on first use."""
    tasks = {}

    def get(system: str | None):
        if system not in tasks:
            options = {"max_length": 200, "max_new_tokens": 8, "chat": True, "system": system}
            tasks[system] = make_task(chat_path, **options)
        return tasks[system]

    return get


@settings(max_examples=40, deadline=None)
@given(texts=st.lists(user_texts, min_size=1, max_size=5), system=st.sampled_from([None, SYSTEM]))
def test_any_rows_generate_what_generate_gives_each_alone(reference, chat_tasks, texts, system):
    """Whatever the user texts (template markers, Jinja, any Unicode, empty), every row,
    statically and continuously batched, generates what transformers' greedy ``generate``
    generates alone on ``apply_chat_template``'s prompt."""
    hf, model = reference
    task = chat_tasks(system)
    encoded = task.encode(pa.table({"text": texts}))
    assert encoded.rows.tolist() == list(range(len(texts)))
    static = generate(task, encoded, [np.arange(len(texts))])
    continuous, _ = stream(task, encoded, max_rows=2)
    for i, text in enumerate(texts):
        want = alone(model, templated(hf, text, system), 8)
        assert static[i].tolist() == want, f"row {i} (static): {text!r}"
        assert continuous[i].tolist() == want, f"row {i} (continuous): {text!r}"


def test_the_prompt_template_fills_the_user_turn(chat_path, reference, chat_rows):
    hf, model = reference
    task = make_task(
        chat_path, max_length=200, max_new_tokens=8, chat=True, system=SYSTEM, prompt=USER
    )
    assert task.inputs == ("text",)
    rows = chat_rows[:8]
    encoded = task.encode(pa.table({"text": rows}))
    batched = generate(task, encoded, [np.arange(len(rows))])
    for i, text in enumerate(rows):
        prompt = templated(hf, USER.format(text=text), SYSTEM)
        assert encoded.ids[i].tolist() == prompt
        assert batched[i].tolist() == alone(model, prompt, 8), f"row {i}"


def copy_tokenizer(source: Path, folder: Path) -> Path:
    """A folder with ``source``'s tokenizer files only (enough for the tokenizer and `validate`)."""
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    return folder


def test_where_a_template_is_found_agrees_with_transformers(chat_path, tmp_path):
    """`validate` reads the files; transformers' tokenizer loads them: both find the same
    default template, in every layout the hub ships."""
    from transformers import AutoTokenizer

    layouts = {
        "config string": tiny.CHATML,
        "config list with a default": [
            {"name": "default", "template": tiny.CHATML},
            {"name": "tool_use", "template": tiny.CHATML},
        ],
        "config list without one": [{"name": "tool_use", "template": tiny.CHATML}],
        "none": None,
        "jinja file": None,
        "additional default": None,
        "additional without a default, beside a config string": tiny.CHATML,
    }
    found = {}
    for i, (name, template) in enumerate(layouts.items()):
        folder = copy_tokenizer(chat_path, tmp_path / f"layout{i}")
        tiny.set_chat_template(folder, template)
        if name == "jinja file":
            (folder / "chat_template.jinja").write_text(tiny.CHATML)
        if name.startswith("additional"):  # these files replace the config's templates
            (folder / "additional_chat_templates").mkdir()
            named = "default" if name == "additional default" else "tool_use"
            (folder / "additional_chat_templates" / f"{named}.jinja").write_text(tiny.CHATML)
        try:
            AutoTokenizer.from_pretrained(folder).get_chat_template()
            loads = True
        except ValueError:
            loads = False
        assert has_chat_template(folder) == loads, name
        found[name] = loads
    assert found == {
        "config string": True,
        "config list with a default": True,
        "config list without one": False,
        "none": False,
        "jinja file": True,
        "additional default": True,
        "additional without a default, beside a config string": False,
    }


def test_a_model_without_a_chat_template_is_refused_at_validate(tmp_path, shards, gpt2_path):
    job = generate_job(tmp_path, gpt2_path, chat=True)
    result = CliRunner().invoke(main, ["validate", str(job)], catch_exceptions=False)
    assert result.exit_code == 4, result.output
    assert "[generate].chat" in result.stderr and "has no chat template" in result.stderr
    with pytest.raises(ModelError, match=r"\[generate\].chat: .* has no chat template"):
        make_task(gpt2_path, chat=True)
    plain = CliRunner().invoke(main, ["validate", str(generate_job(tmp_path, gpt2_path))])
    assert plain.exit_code == 0, plain.output


def test_a_system_message_needs_chat(tmp_path):
    raw = {
        "input": {"path": "in"},
        "model": {"task": "generate", "path": "m"},
        "output": {"path": "out"},
        "generate": {"system": "Be brief."},
    }
    with pytest.raises(JobError, match=r"\[generate\].system: .*set chat = true"):
        job_from_dict(raw, tmp_path / "job.toml")
    raw["generate"]["chat"] = True
    assert job_from_dict(raw, tmp_path / "job.toml").options.system == "Be brief."


def test_a_template_that_refuses_the_system_role_or_a_row_says_so(chat_path, tmp_path):
    """Templates raise on what they do not take (Gemma's on a system turn, say): a system
    message the template refuses is a model error naming the key; a row it refuses is that
    row's error, and the other rows are encoded."""
    folder = tmp_path / "strict"
    shutil.copytree(chat_path, folder)
    strict = (
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}"
        "{% if 'forbidden' in message['content'] %}{{ raise_exception('no, thanks') }}{% endif %}"
        "{% endfor %}" + tiny.CHATML
    )
    tiny.set_chat_template(folder, strict)
    with pytest.raises(ModelError, match=r"\[generate\].system: .*System role not supported"):
        make_task(folder, max_length=200, chat=True, system=SYSTEM)
    task = make_task(folder, max_length=200, chat=True)
    encoded = task.encode(pa.table({"text": ["fine", "a forbidden word", "also fine"]}))
    assert encoded.rows.tolist() == [0, 2]
    assert list(encoded.errors) == [1] and "no, thanks" in encoded.errors[1]
    hf = task.generator.encoder.hf
    assert encoded.ids[1].tolist() == templated(hf, "also fine", None)


def test_a_chat_job_runs_and_its_system_message_is_in_the_fingerprint(tmp_path, shards, chat_path):
    path = generate_job(tmp_path, chat_path, chat=True, system="Be brief.", prompt=USER)
    job = load_job(path, ["model.max_length=96", "batching.max_tokens=4096"])  # all fit
    report = run_job(job)
    assert report["rows"] == 360
    out = read_output(tmp_path / "out")
    assert set(out["finish_reason"].to_pylist()) <= {"eos", "length"}
    assert max(out["prompt_tokens"].to_pylist()) == 96
    sets = ["model.max_length=96", "batching.max_tokens=4096"]
    changed = load_job(path, [*sets, 'generate.system="Be kind."'])
    with pytest.raises(OutputConflictError, match="task_options"):
        run_job(changed)
    record = json.loads((tmp_path / "out" / "_batchscore" / "job.json").read_text())
    assert record["parts"]["task_options"]["chat"] is True


def test_score_takes_the_chat_keys_by_name(chat_path, reference, chat_rows):
    """`batchscore.score` reads `chat` and `system` as a job file's [generate] keys."""
    import batchscore

    hf, model = reference
    rows = chat_rows[:6]
    options = {"max_new_tokens": 8, "max_length": 200, "precision": "fp32", "threads": 1}
    table = pa.table({"text": rows})
    out = batchscore.score(
        table, task="generate", model=chat_path, chat=True, system=SYSTEM, **options
    )
    expected = [alone(model, templated(hf, text, SYSTEM), 8) for text in rows]
    texts = [hf.decode(t, skip_special_tokens=True) for t in expected]
    assert out["generated"].to_pylist() == texts


# Templates that refuse a system turn, as hub instruction models ship them: Gemma's names the
# role; Mistral-Instruct v0.1's makes the roles alternate from a user turn, and takes no other
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{% endfor %}"
)
TEMPLATES = {
    "chatml": tiny.CHATML,
    "gemma": GEMMA,
    "mistral": MISTRAL,
    "refuses every turn": "{{ raise_exception('This model takes no chat') }}",
    "broken jinja": "{% for message in messages %}{{ message['content'] }",
}


@pytest.fixture(scope="module")
def template_folders(chat_path, tmp_path_factory) -> dict[str, Path]:
    """The chat model with each of `TEMPLATES` as its own."""
    folders = {}
    for name, template in TEMPLATES.items():
        folder = tmp_path_factory.mktemp("template") / "model"
        shutil.copytree(chat_path, folder)
        tiny.set_chat_template(folder, template)
        folders[name] = folder
    return folders


def loads(folder: Path, system: str | None) -> str | None:
    """What loading the chat task for a run says: None when it loads, else its model error."""
    try:
        make_task(folder, max_length=200, chat=True, system=system)
    except ModelError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("system", [None, SYSTEM])
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_validate_renders_the_probe_conversation_as_run_does(
    tmp_path, shards, template_folders, name, system
):
    """`validate` and `run` agree on every template, with and without a system message: where
    the run's model load refuses the template (exit 4), `validate` exits 4 with the same
    message, naming the model and what the template said; where it loads, `validate` passes."""
    folder = template_folders[name]
    job = generate_job(
        tmp_path, folder, chat=True, **({} if system is None else {"system": system})
    )
    result = CliRunner().invoke(main, ["validate", str(job)], catch_exceptions=False)
    refusal = loads(folder, system)
    if refusal is None:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 4, result.output
        assert refusal in result.stderr and str(folder) in refusal
    expected_refusals = {
        ("gemma", SYSTEM): "System role not supported",
        ("mistral", SYSTEM): "Conversation roles must alternate",
        ("refuses every turn", None): "This model takes no chat",
        ("refuses every turn", SYSTEM): "This model takes no chat",
    }
    if (name, system) in expected_refusals:
        assert expected_refusals[name, system] in result.stderr
    elif name != "broken jinja":
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 4 and "[generate].chat" in result.stderr


def test_validate_refuses_a_system_turn_a_gemma_template_refuses(
    tmp_path, shards, template_folders
):
    """The black-box case, in a real process: `validate` exits 4 naming the model, the key and
    the template's own message, as `run` would, before any weights load."""
    folder = template_folders["gemma"]
    job = generate_job(tmp_path, folder, chat=True, system=SYSTEM)
    out = subprocess.run(
        command(job, verb="validate"),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 4, out.stderr
    assert "[generate].system" in out.stderr and str(folder) in out.stderr
    assert "System role not supported" in out.stderr and "Traceback" not in out.stderr
