"""reward against the model's own forward on its templated conversation, as a reward model's
card computes it (``apply_chat_template(messages, tokenize=True)``, then the model), on random
Llama-style reward models built from configs and saved (tests/models/tiny.py): one logit, and
several named ones; a messages column (structs or JSON text) or a prompt and a response;
batched equal to alone; a conversation the template refuses and a missing template named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from batchscore.errors import JobError, ModelError
from batchscore.job.lm_sections import RewardConfig
from batchscore.job.parse import job_from_dict
from batchscore.job.sections import InputConfig, ModelConfig, QualityConfig
from batchscore.models.tasks import check_model, load_task
from batchscore.runtime.executor import Executor
from tests.models import tiny


def turns(*said: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in said]


CONVERSATIONS = [
    turns(("user", "What does len return?"), ("assistant", "The number of items.")),
    turns(("user", "Open a file."), ("assistant", "Use open(path) and read it; close it after.")),
    turns(("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello.")),
]
# refuses a conversation that does not end with the assistant's turn
STRICT = (
    "{% if messages[-1]['role'] != 'assistant' %}"
    "{{ raise_exception('the last turn must be the assistant turn') }}{% endif %}" + tiny.CHATML
)


@pytest.fixture(scope="module")
def one_logit(tmp_path_factory: pytest.TempPathFactory, tiny_texts: list[str]) -> Path:
    return tiny.llama_reward(tmp_path_factory.mktemp("reward"), tiny_texts, ["LABEL_0"])


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory, tiny_texts: list[str]) -> Path:
    """Three named logits, and no pad token: transformers scores its rows one at a time."""
    labels = ["helpful", "correct", "safe"]
    return tiny.llama_reward(tmp_path_factory.mktemp("named"), tiny_texts, labels, pad=False)


def loaded(path: Path, inp: InputConfig):
    model = ModelConfig(task="reward", path=str(path), precision="fp32")
    executor = Executor(model)
    task = load_task(path, model=model, options=RewardConfig(), inp=inp, executor=executor)
    return task, executor


def scored(task, executor, table: pa.Table, *, alone: bool = False):
    encoded = task.encode(table)
    units = np.arange(len(encoded.lengths))
    batches = [units[i : i + 1] for i in units] if alone else [units]
    results = np.concatenate([executor.run(lambda b=b: task.forward(encoded, b)) for b in batches])
    return encoded.errors, task.finish(encoded, results)["reward"]


@torch.inference_mode()
def card(path: Path, conversation: list[dict]) -> np.ndarray:
    """The reward as a reward model's card computes it."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    ids = tokenizer.apply_chat_template(conversation, tokenize=True, return_tensors="pt")
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    return model(ids).logits[0].numpy()


def test_a_messages_column_scores_as_the_card_does(one_logit: Path):
    structs = pa.array(CONVERSATIONS)
    as_json = pa.array([json.dumps(c) for c in CONVERSATIONS])
    task, executor = loaded(one_logit, InputConfig(path=("in",), messages="messages"))
    errors, together = scored(task, executor, pa.table({"messages": structs}))
    _, alone = scored(task, executor, pa.table({"messages": as_json}), alone=True)
    assert not errors and together.type == pa.float32()
    expected = [card(one_logit, c)[0] for c in CONVERSATIONS]
    np.testing.assert_allclose(together.to_numpy(), expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(alone.to_numpy(), together.to_numpy(), rtol=0, atol=1e-5)


def test_a_prompt_and_response_are_one_user_and_one_assistant_turn(named: Path):
    prompts = [c[0]["content"] for c in CONVERSATIONS[:2]]
    table = pa.table({"prompt": prompts, "response": [c[1]["content"] for c in CONVERSATIONS[:2]]})
    task, executor = loaded(named, InputConfig(path=("in",), text="prompt", text_pair="response"))
    _, rewards = scored(task, executor, table)
    assert rewards.type == pa.struct([(n, pa.float32()) for n in ("helpful", "correct", "safe")])
    for i, conversation in enumerate(CONVERSATIONS[:2]):
        got = list(rewards[i].as_py().values())
        np.testing.assert_allclose(got, card(named, conversation), rtol=0, atol=1e-5)
    same = task.agreement({"reward": rewards}, {"reward": rewards}, QualityConfig())
    assert same.passed and "safe: max_score_error" in same.metrics


def test_a_conversation_the_template_refuses_is_a_row_error_naming_the_key(one_logit: Path):
    tiny.set_chat_template(one_logit, STRICT)
    try:
        task, executor = loaded(one_logit, InputConfig(path=("in",), messages="messages"))
        rows = [CONVERSATIONS[0], CONVERSATIONS[0][:1], None, "not json"]
        column = pa.array([json.dumps(r) if isinstance(r, list) else r for r in rows])
        errors, rewards = scored(task, executor, pa.table({"messages": column}))
    finally:
        tiny.set_chat_template(one_logit, tiny.CHATML)
    assert sorted(errors) == [1, 2, 3] and len(rewards) == 1
    assert errors[1].startswith("[input].messages: the model's chat template refuses it")
    assert "the conversation is null" in errors[2] and "[input].messages" in errors[3]


def test_a_model_without_a_chat_template_is_refused_by_key(one_logit: Path, tmp_path: Path):
    folder = shutil.copytree(one_logit, tmp_path / "bare")
    tiny.set_chat_template(folder, None)
    with pytest.raises(ModelError, match=r'\[model\].task = "reward": .* has no chat template'):
        check_model("reward", folder, options=RewardConfig())


def test_a_reward_job_reads_messages_or_a_pair_not_neither(tmp_path: Path):
    base = {"model": {"task": "reward", "path": "m"}, "output": {"path": "out"}}
    with pytest.raises(JobError, match=r"\[input\].messages: task reward scores a conversation"):
        job_from_dict({"input": {"path": "in"}, **base}, tmp_path / "job.toml")
    job = job_from_dict({"input": {"path": "in", "messages": "chat"}, **base}, tmp_path / "j.toml")
    assert job.input.messages == "chat"
    embed = {"model": {"task": "embed"}, "output": {"path": "out"}}
    with pytest.raises(JobError, match=r"\[input\].messages: task reward reads conversations"):
        job_from_dict({"input": {"path": "in", "messages": "chat"}, **embed}, tmp_path / "e.toml")
