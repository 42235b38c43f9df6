"""`batchscore run-batch`: OpenAI Batch files in, OpenAI Batch results out, through ordinary
jobs (their reader, batching, checkpoints and resume)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pyarrow as pa
import pytest
import torch

from tests.commands import environment, invoke
from tests.models import tiny

EMBED_MODEL = "all-MiniLM-L6-v2"


def request(custom_id: str, url: str = "/v1/embeddings", **body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def results(path: Path) -> list[dict]:
    return [json.loads(text) for text in path.read_text().splitlines()]


def official(body: dict, kind: str) -> object:
    """A result body parsed by the openai package's own response types (the API's truth):
    ``embeddings`` or ``chat``; a missing field or a wrong type fails the test."""
    from openai.types import CreateEmbeddingResponse
    from openai.types.chat import ChatCompletion

    parser = CreateEmbeddingResponse if kind == "embeddings" else ChatCompletion
    return parser.model_validate(body, strict=True)


def serve(requests: list[str], tmp_path: Path, model: str, *extra: str) -> list[dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    source, target = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    source.write_text("\n".join(requests) + "\n")
    args = ["-i", str(source), "-o", str(target), "--model", model]
    done = invoke("run-batch", *args, "--set", "model.precision=fp32", *extra)
    assert done.exit_code == 0, done.output
    return results(target)


def test_embeddings_are_the_models_own_and_bad_lines_stand_alone(tmp_path: Path, minilm_path):
    """Each input's vector equals sentence-transformers' own embedding; ``dimensions`` cuts
    and renormalizes; base64 is little-endian float32; usage is the tokenizer's count; bad
    lines are error lines in their place and the others are served."""
    from sentence_transformers import SentenceTransformer

    lines = serve(
        [
            request("a", model=EMBED_MODEL, input="The cat sat on the mat."),
            "{broken",
            request("b", input=["first text", "a second, longer text"], dimensions=16),
            request("c", input="The cat sat on the mat.", encoding_format="base64"),
            request("a", input="a repeated custom_id"),
            request("d", model="text-embedding-3-small", input="another model"),
        ],
        tmp_path,
        EMBED_MODEL,
    )
    assert [line["custom_id"] for line in lines] == ["a", None, "b", "c", "a", "d"]
    assert [line["response"]["status_code"] for line in lines] == [200, 400, 200, 200, 400, 400]
    assert [line["error"] and line["error"]["code"] for line in lines] == [
        None,
        "invalid_json",
        None,
        None,
        "duplicate_custom_id",
        "model_mismatch",
    ]
    own = SentenceTransformer(str(minilm_path), device="cpu")
    texts = ["The cat sat on the mat.", "first text", "a second, longer text"]
    expected = own.encode(texts, normalize_embeddings=True)
    body = lines[0]["response"]["body"]
    assert official(body, "embeddings").usage.prompt_tokens > 0
    official(lines[2]["response"]["body"], "embeddings")
    assert body["object"] == "list" and body["model"] == EMBED_MODEL
    assert body["data"][0]["object"] == "embedding" and body["data"][0]["index"] == 0
    assert np.dot(body["data"][0]["embedding"], expected[0]) > 0.9999
    for item, vector in zip(lines[2]["response"]["body"]["data"], expected[1:], strict=True):
        cut = vector[:16] / np.linalg.norm(vector[:16])
        assert len(item["embedding"]) == 16 and np.dot(item["embedding"], cut) > 0.9999
    packed = lines[3]["response"]["body"]["data"][0]["embedding"]
    unpacked = np.frombuffer(base64.b64decode(packed), dtype="<f4")
    assert np.allclose(unpacked, body["data"][0]["embedding"], atol=1e-7)
    counted = [len(own.tokenizer(t)["input_ids"]) for t in texts]
    assert body["usage"] == {"prompt_tokens": counted[0], "total_tokens": counted[0]}
    assert lines[2]["response"]["body"]["usage"]["prompt_tokens"] == sum(counted[1:])


@pytest.fixture(scope="module")
def chat_path(tmp_path_factory: pytest.TempPathFactory, small_corpus: pa.Table) -> Path:
    texts = small_corpus.column("text").to_pylist()
    return tiny.llama_chat(tmp_path_factory.mktemp("llama-chat"), texts)


def greedy(chat_path: Path, messages: list[dict], max_new_tokens: int) -> tuple[str, int, int]:
    """transformers' own answer: the chat template's prompt, greedy ``generate``; the text,
    prompt tokens and new tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoTokenizer.from_pretrained(chat_path)
    model = AutoModelForCausalLM.from_pretrained(chat_path, dtype=torch.float32).eval()
    ids = hf.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
    new = out[0, len(ids) :].tolist()
    return hf.decode(new, skip_special_tokens=True), len(ids), len(new)


SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["yes", "no"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},  # ends within 40 tokens
    },
    "required": ["label", "n"],
    "additionalProperties": False,
}


def test_chat_completions_answer_as_transformers_does(tmp_path: Path, chat_path: Path):
    """A whole conversation through the model's chat template, greedy at temperature 0, each
    request with its own max_tokens; a response_format's schema holds the answer while it
    decodes (a random model's answer parses)."""
    chat = "/v1/chat/completions"
    talk = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "the report"},
        {"role": "assistant", "content": "which one"},
        {"role": "user", "content": "the first"},
    ]
    short = [{"role": "user", "content": "a question about the data"}]
    lines = serve(
        [
            request("long", chat, messages=talk, max_tokens=6, temperature=0),
            request("short", chat, messages=short, max_completion_tokens=3),
            request(
                "schema",
                chat,
                messages=short,
                max_tokens=40,
                response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}},
            ),
        ],
        tmp_path,
        str(chat_path),
    )
    for line, (messages, most) in zip(lines[:2], [(talk, 6), (short, 3)], strict=True):
        text, prompt, new = greedy(chat_path, messages, most)
        body = line["response"]["body"]
        assert official(body, "chat").choices[0].message.role == "assistant"
        assert body["object"] == "chat.completion" and line["error"] is None
        (choice,) = body["choices"]
        assert choice["message"] == {"role": "assistant", "content": text}
        assert choice["finish_reason"] == ("length" if new == most else "stop")
        usage = {"prompt_tokens": prompt, "completion_tokens": new, "total_tokens": prompt + new}
        assert body["usage"] == usage
    # the random model's answer, held to the schema while it decoded, parses and validates
    body = lines[2]["response"]["body"]
    assert lines[2]["error"] is None and official(body, "chat").choices[0].message.content
    answer = json.loads(body["choices"][0]["message"]["content"])
    jsonschema.validate(answer, SCHEMA)


def test_a_killed_run_batch_resumed_writes_each_custom_id_once(tmp_path: Path):
    """SIGKILL right after the first chunk commits: no results file yet; started again, the
    committed chunk is not scored again and every custom_id has exactly one line."""
    source, target = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    ids = [f"req-{i}" for i in range(6)]
    source.write_text("".join(request(i, input=f"text number {i}") + "\n" for i in ids))
    command = [
        *(sys.executable, "-m", "batchscore", "run-batch"),
        *("-i", str(source), "-o", str(target), "--model", EMBED_MODEL),
        *("--set", "model.precision=fp32", "--set", "output.chunk_rows=2"),
        *("--set", "batching.window_rows=2"),  # a window, and its commit, per chunk
    ]
    killed = subprocess.run(
        command, env=environment("after-record@1:kill"), capture_output=True, timeout=300
    )
    assert killed.returncode == -9, killed.stderr.decode()
    assert not target.exists()
    output = tmp_path / "results.jsonl.work" / "embeddings" / "output"
    (first,) = [p for p in output.glob("*.parquet")]
    before = first.stat().st_ino
    done = subprocess.run(command, env=environment(), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert first.stat().st_ino == before  # committed before the kill: kept, not re-scored
    assert len(list(output.glob("*.parquet"))) == 3
    assert [line["custom_id"] for line in results(target)] == ids
    assert all(line["response"]["status_code"] == 200 for line in results(target))


def test_an_unreadable_request_file_is_a_clear_error(tmp_path: Path):
    done = invoke(
        "run-batch", "-i", str(tmp_path / "nowhere.jsonl"), "-o", str(tmp_path / "r.jsonl"),
        "--model", EMBED_MODEL,
    )  # fmt: skip
    assert done.exit_code == 2
    assert "cannot read the request file" in done.output and "Traceback" not in done.output


def test_request_and_result_files_on_s3(bucket: str, tmp_path: Path):
    """Both files and the work folder in an object store (moto's S3 server): the same lines
    as a local run."""
    from batchscore.storage.fs import filesystem

    requests = [request("x", input="on a bucket"), "not json"]
    local = serve(requests, tmp_path, EMBED_MODEL)
    fs, key = filesystem(f"{bucket}/requests.jsonl")
    with fs.open_output_stream(key) as stream:
        stream.write(("\n".join(requests) + "\n").encode())
    args = ["-i", f"{bucket}/requests.jsonl", "-o", f"{bucket}/results.jsonl"]
    done = invoke("run-batch", *args, "--model", EMBED_MODEL, "--set", "model.precision=fp32")
    assert done.exit_code == 0, done.output
    with fs.open_input_stream(filesystem(f"{bucket}/results.jsonl")[1]) as stream:
        remote = [json.loads(text) for text in stream.read().decode().splitlines()]
    assert remote == local


def test_requests_the_model_cannot_serve_are_error_lines(tmp_path: Path):
    """Chat requests to an embedding model are error lines, and its embeddings are served;
    when no request can be served the model is wrong, and run-batch says so (exit 2 for
    a built-in encoder named for a task that needs its own model, as `run` exits)."""
    chat = request("talk", "/v1/chat/completions", messages=[{"role": "user", "content": "hi"}])
    lines = serve([chat, request("vec", input="served")], tmp_path, EMBED_MODEL)
    assert [line["custom_id"] for line in lines] == ["talk", "vec"]
    assert lines[0]["error"]["code"] == "model_not_supported"
    assert lines[1]["error"] is None
    source = tmp_path / "chat.jsonl"
    source.write_text(chat + "\n")
    args = ["-i", str(source), "-o", str(tmp_path / "chat-results.jsonl")]
    done = invoke("run-batch", *args, "--model", EMBED_MODEL)
    assert done.exit_code == 2, done.output
    assert not (tmp_path / "chat-results.jsonl").exists()


def test_a_row_the_model_failed_is_a_500_error_line():
    """A committed row with its error (``on_error = "skip"``) answers its request with status
    500 and the row's reason; the others in its job answer as usual."""
    from batchscore.recipes.batch_requests import read_requests
    from batchscore.recipes.run_batch import group_lines, groups

    talk = [{"role": "user", "content": "hi"}]
    chat = "/v1/chat/completions"
    lines = [request(c, chat, messages=talk).encode() for c in ("ok", "bad")]
    (group,) = groups(read_requests(lines, {"m"})).values()
    committed = pa.table(
        {
            "line": [0, 1],
            "item": [0, 0],
            "generated": ["fine", None],
            "prompt_tokens": [5, None],
            "generated_tokens": [2, None],
            "finish_reason": ["eos", None],
            "error": [None, "[generate].chat: the model's chat template refuses it"],
        }
    )
    ok, bad = group_lines(group, None, committed, "m").values()
    assert ok["response"]["body"]["choices"][0]["finish_reason"] == "stop"
    assert ok["response"]["body"]["usage"]["total_tokens"] == 7
    assert bad["response"]["status_code"] == 500
    assert bad["error"] == {
        "code": "scoring_error",
        "message": "[generate].chat: the model's chat template refuses it",
    }


def test_a_chat_request_over_the_models_context_is_its_own_error_line(
    tmp_path: Path, chat_path: Path
):
    """The tiny model has 256 positions, which the prompt and the completion share. A
    request asking for more (a completion longer than the whole context, a prompt too long for
    its max_tokens, or for the default completion) is its own 400 ``context_length_exceeded``
    line in OpenAI's words, never a prompt cut to fit; a message holding half an emoji is its
    own line too; the others are served whole. A file where no chat request fits still gets
    its results file, and exits 3: not one request was served."""
    chat = "/v1/chat/completions"
    short = [{"role": "user", "content": "a question about the data"}]
    medium = [{"role": "user", "content": "the first report " * 10}]
    long = [{"role": "user", "content": "the first report " * 22}]
    cut = [{"role": "user", "content": "half an emoji \ud83d"}]
    lines = serve(
        [
            request("huge", chat, messages=short, max_tokens=400),
            request("fits", chat, messages=short, max_tokens=3),
            request("medium", chat, messages=medium, max_tokens=200),
            request("medium-default", chat, messages=medium),
            request("long-default", chat, messages=long),
            request("surrogate", chat, messages=cut, max_tokens=3),
        ],
        tmp_path,
        str(chat_path),
    )
    prompt, middle, most = (greedy(chat_path, m, 1)[1] for m in (short, medium, long))
    assert middle + 200 > 256 >= middle + 64 and most + 64 > 256  # the cases as meant
    codes = [line["error"] and line["error"]["code"] for line in lines]
    over = "context_length_exceeded"
    assert codes == [over, None, over, None, over, "invalid_unicode"]
    huge = lines[0]
    assert huge["response"]["status_code"] == 400
    assert huge["response"]["body"]["error"]["type"] == "invalid_request_error"
    assert huge["error"]["message"] == (
        f"This model's maximum context length is 256 tokens. However, you requested "
        f"{prompt + 400} tokens ({prompt} in the messages, 400 in the completion). Please "
        "reduce the length of the messages or completion."
    )
    assert f"({middle} in the messages, 200 in the completion)" in lines[2]["error"]["message"]
    assert f"({most} in the messages, 64 in the completion)" in lines[4]["error"]["message"]
    assert "sets no max_tokens" in lines[4]["error"]["message"]
    assert lines[3]["response"]["body"]["usage"]["prompt_tokens"] == middle  # whole, not cut
    assert lines[1]["response"]["body"]["usage"]["prompt_tokens"] == prompt
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "requests.jsonl").write_text(request("huge", chat, messages=short, max_tokens=400))
    args = ["-i", str(alone / "requests.jsonl"), "-o", str(alone / "results.jsonl")]
    done = invoke("run-batch", *args, "--model", str(chat_path), "--set", "model.precision=fp32")
    assert done.exit_code == 3, done.output
    (only,) = results(alone / "results.jsonl")
    assert only["error"]["code"] == over


# The example lines of OpenAI's Batch guide, as teams write them: each body names an OpenAI model
OPENAI_EMBEDDINGS = [
    {
        "custom_id": "request-1",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": "text-embedding-3-small", "input": "Hello world!"},
    },
    {
        "custom_id": "request-2",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {
            "model": "text-embedding-3-small",
            "input": ["The food was delicious", "and the waiter was friendly."],
            "encoding_format": "float",
        },
    },
]


def openai_chat(custom_id: str, system: str) -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hello world!"}]
    body = {"model": "gpt-4o-mini", "messages": messages, "max_tokens": 8}  # the guide asks 1000
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_openai_example_lines_are_served_under_the_names_they_give(tmp_path: Path, chat_path):
    """--served-model-name, as vLLM's flag of that name: the names replace the model's own in
    the requests (a body naming the model's own name is then another model's), any of them is
    served, and every response's ``model`` is the first. Files written as OpenAI's Batch guide
    shows serve as they are, and the results parse with the openai package's types."""
    names = ("--served-model-name", "text-embedding-3-small")
    own = {**OPENAI_EMBEDDINGS[0], "custom_id": "own-name"}
    own["body"] = {**own["body"], "model": EMBED_MODEL}
    unnamed = {**OPENAI_EMBEDDINGS[0], "custom_id": "no-model", "body": {"input": "no model"}}
    lines = [json.dumps(line) for line in [*OPENAI_EMBEDDINGS, own, unnamed]]
    served = serve(lines, tmp_path / "embed", EMBED_MODEL, *names)
    assert [line["error"] and line["error"]["code"] for line in served] == [
        None,
        None,
        "model_mismatch",
        None,
    ]
    for line in (served[0], served[1], served[3]):
        parsed = official(line["response"]["body"], "embeddings")
        assert parsed.model == "text-embedding-3-small" and parsed.usage.prompt_tokens > 0
    assert len(official(served[1]["response"]["body"], "embeddings").data) == 2
    assert "--served-model-name" in served[2]["error"]["message"]
    aliases = (*names, "--served-model-name", "text-embedding-ada-002")
    ada = {**OPENAI_EMBEDDINGS[0], "body": {"model": "text-embedding-ada-002", "input": "hi"}}
    (first,) = serve([json.dumps(ada)], tmp_path / "ada", EMBED_MODEL, *aliases)
    assert first["error"] is None
    assert first["response"]["body"]["model"] == "text-embedding-3-small"  # the first name
    chats = [json.dumps(openai_chat(f"request-{i}", s)) for i, s in enumerate(("Be kind.", "Be"))]
    answered = serve(chats, tmp_path / "chat", str(chat_path), "--served-model-name", "gpt-4o-mini")
    for line in answered:
        assert line["error"] is None, line
        assert official(line["response"]["body"], "chat").model == "gpt-4o-mini"


def test_without_served_names_openai_example_lines_fail_and_say_how(tmp_path: Path):
    """Without --served-model-name a file naming OpenAI's model is never answered by another
    model: every line is its error line, the results file is written, and the command exits
    3 (no request could be served), saying how many lines and why."""
    source, target = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in OPENAI_EMBEDDINGS))
    args = ["-i", str(source), "-o", str(target), "--model", EMBED_MODEL]
    done = invoke("run-batch", *args, "--set", "model.precision=fp32")
    assert done.exit_code == 3, done.output
    assert "no request" in done.stderr and "2 lines" in done.stderr
    assert "model_mismatch" in done.stderr and "--served-model-name" in done.stderr
    assert [line["error"]["code"] for line in results(target)] == ["model_mismatch"] * 2
    assert "Traceback" not in done.output


def test_a_file_with_no_servable_line_exits_3_whatever_the_reason(tmp_path: Path):
    """Lines refused as they are read (not JSON, another url) and requests the model failed
    alike: when not one request was answered, run-batch exits 3 with every error line
    written; one served line among them is exit 0."""
    bad = ["{broken", request("u", "/v1/completions", prompt="hi"), request("e", input="")]
    source, target = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    source.write_text("\n".join(bad) + "\n")
    args = ["-i", str(source), "-o", str(target), "--model", EMBED_MODEL]
    done = invoke("run-batch", *args, "--set", "model.precision=fp32")
    assert done.exit_code == 3, done.output
    assert len(results(target)) == 3
    assert all(line["error"] for line in results(target))
    source.write_text("\n".join([*bad, request("ok", input="served")]) + "\n")
    again = invoke("run-batch", *args, "--set", "model.precision=fp32")
    assert again.exit_code == 0, again.output
    assert [line["error"] is None for line in results(target)] == [False, False, False, True]
