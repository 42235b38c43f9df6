"""`[generate].messages`: a row's text is a whole conversation (JSON), rendered through the
model's chat template as transformers renders it; a row that is not one is that row's error."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from batchscore.errors import JobError
from batchscore.job.parse import job_from_dict
from batchscore.job.sections import GenerateConfig, InputConfig, ModelConfig
from batchscore.models.generate import PromptEncoding
from tests.models import tiny


@pytest.fixture(scope="module")
def chat_path(tmp_path_factory: pytest.TempPathFactory, tiny_texts: list[str]) -> Path:
    return tiny.llama_chat(tmp_path_factory.mktemp("llama-chat"), tiny_texts)


def test_conversations_are_apply_chat_templates_tokens(chat_path: Path):
    from transformers import AutoTokenizer

    model = ModelConfig(task="generate", precision="fp32", max_length=200)
    options = GenerateConfig(chat=True, messages=True, max_new_tokens=4)
    encoding = PromptEncoding(chat_path, model=model, options=options, inp=InputConfig(path=()))
    talk = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "the report"},
        {"role": "assistant", "content": "which one"},
        {"role": "user", "content": "the first"},
    ]
    texts = [json.dumps(talk), "not a conversation", json.dumps([{"role": "user"}])]
    encoded = encoding.encode(pa.table({"text": texts}))
    hf = AutoTokenizer.from_pretrained(chat_path)
    expected = hf.apply_chat_template(talk, add_generation_prompt=True, return_dict=False)
    assert encoded.ids[0].tolist() == expected
    assert list(encoded.rows) == [0] and set(encoded.errors) == {1, 2}


def test_messages_needs_chat(tmp_path: Path):
    raw = {
        "input": {"path": "in"},
        "model": {"task": "generate", "path": "m"},
        "output": {"path": "out"},
        "generate": {"messages": True},
    }
    with pytest.raises(JobError, match=r"messages: .*set chat = true"):
        job_from_dict(raw, tmp_path / "job.toml")
