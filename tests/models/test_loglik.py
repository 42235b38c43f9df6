"""loglik against transformers computed directly, on a random GPT-2 and a random Llama-style
model built from configs and saved (tests/models/tiny.py): a text's log-probability after its
BOS token, a long text's strided windows as transformers' perplexity guide loops over them, a
continuation given its context with lm-evaluation-harness's boundary and `is_greedy`; a batch
equal to its rows one at a time (a shared context's KV cache included); bad input named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from batchscore.errors import ModelError
from batchscore.job.lm_sections import LoglikConfig
from batchscore.job.sections import InputConfig, ModelConfig, QualityConfig
from batchscore.models.tasks import load_task
from batchscore.models.text.windows import strided
from batchscore.runtime.executor import Executor
from tests.commands import invoke
from tests.conftest import read_output
from tests.models import tiny

TEXTS = [
    "Return the number of items in a container.",
    "x",
    "Open a file and return a stream; raise OSError upon failure. " * 3,
]
# (context, continuation): shared contexts (a multiple-choice item), a context ending in a
# space (it moves to the continuation), an empty context (BOS alone before the continuation)
PAIRS = [
    ("Question: what does len return? Answer:", " the number of items"),
    ("Question: what does len return? Answer:", " a string"),
    ("Question: what does len return? Answer:", " nothing at all"),
    ("The file is opened and ", "a stream is returned"),
    ("", "Return the value."),
    ("Raise an error", " when it fails."),
]


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory: pytest.TempPathFactory, tiny_texts: list[str]) -> Path:
    return tiny.llama_chat(tmp_path_factory.mktemp("llama"), tiny_texts)


@pytest.fixture(params=["gpt2", "llama"])
def lm(request: pytest.FixtureRequest, gpt2_path: Path) -> Path:
    return gpt2_path if request.param == "gpt2" else request.getfixturevalue("llama_path")


def loaded(path: Path, *, pair: bool = False, max_length: int | None = None, **options):
    model = ModelConfig(task="loglik", path=str(path), precision="fp32", max_length=max_length)
    inp = InputConfig(path=("in",), text="text", text_pair="pair" if pair else None)
    executor = Executor(model)
    task = load_task(path, model=model, options=LoglikConfig(**options), inp=inp, executor=executor)
    return task, executor


def scored(task, executor, table: pa.Table, *, alone: bool = False) -> dict[str, pa.Array]:
    """The task's columns for ``table``: every unit in one batch, or each alone."""
    encoded = task.encode(table)
    units = np.arange(len(encoded.lengths))
    batches = [units[i : i + 1] for i in units] if alone else [units]
    results = np.concatenate([executor.run(lambda b=b: task.forward(encoded, b)) for b in batches])
    return {"errors": encoded.errors, **task.finish(encoded, results)}


def reference_model(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


@torch.inference_mode()
def strided_loop(model, ids: list[int], *, max_length: int, stride: int) -> tuple[float, int]:
    """transformers' "perplexity of fixed-length models" loop, its labels masked to the
    tokens each window adds: (the summed log-probability, the tokens it counts)."""
    seq = torch.tensor([ids])
    nll, count, prev_end = 0.0, 0, 0
    for begin in range(0, seq.size(1), stride):
        end = min(begin + max_length, seq.size(1))
        trg_len = end - prev_end
        input_ids = seq[:, begin:end]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        loss = model(input_ids, labels=target_ids).loss
        counted = int((target_ids[:, 1:] != -100).sum())  # the labels shift inside the model
        nll += float(loss) * counted
        count += counted
        prev_end = end
        if end == seq.size(1):
            break
    return -nll, count


@torch.inference_mode()
def harness(model, tokenizer, context: str, continuation: str) -> tuple[float, bool, int]:
    """lm-evaluation-harness's `_encode_pair` and `_loglikelihood_tokens`, for one request."""
    spaces = len(context) - len(context.rstrip())
    if spaces > 0:
        continuation, context = context[-spaces:] + continuation, context[:-spaces]
    encode = lambda text: tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731
    if context == "":
        context_enc, continuation_enc = [tokenizer.bos_token_id], encode(continuation)
    else:
        whole = encode(context + continuation)
        context_enc = encode(context)
        continuation_enc = whole[len(context_enc) :]
    inp = torch.tensor([(context_enc + continuation_enc)[:-1]])
    logits = model(inp).logits[0].float().log_softmax(-1)[-len(continuation_enc) :]
    wanted = torch.tensor(continuation_enc)
    greedy = bool((logits.argmax(-1) == wanted).all())
    return float(logits.gather(1, wanted[:, None]).sum()), greedy, len(continuation_enc)


def test_a_text_is_scored_after_its_bos_as_transformers_scores_it(lm: Path):
    model, tokenizer = reference_model(lm)
    task, executor = loaded(lm, token_logprobs=True)
    out = scored(task, executor, pa.table({"text": TEXTS}))
    for i, text in enumerate(TEXTS):
        ids = [tokenizer.bos_token_id, *tokenizer(text, add_special_tokens=False).input_ids]
        logprob, count = strided_loop(model, ids, max_length=len(ids), stride=len(ids))
        assert out["logprob"][i].as_py() == pytest.approx(logprob, abs=1e-4)
        assert out["tokens"][i].as_py() == count == len(ids) - 1
        assert out["perplexity"][i].as_py() == pytest.approx(np.exp(-logprob / count), rel=1e-5)
        listed = out["token_logprobs"][i].as_py()
        assert len(listed) == count and sum(listed) == pytest.approx(out["logprob"][i].as_py())
    assert [f.name for f in task.columns] == ["logprob", "tokens", "perplexity", "token_logprobs"]
    assert [str(f.type) for f in task.columns] == [
        "double",
        "int32",
        "double",
        "list<item: double>",
    ]


@pytest.mark.parametrize("stride", [None, 5])
def test_a_long_text_in_strided_windows_equals_the_reference_loop(gpt2_path: Path, stride):
    model, tokenizer = reference_model(gpt2_path)
    task, executor = loaded(gpt2_path, max_length=16, stride=stride)
    out = scored(task, executor, pa.table({"text": TEXTS}))
    for i, text in enumerate(TEXTS):
        ids = [tokenizer.bos_token_id, *tokenizer(text, add_special_tokens=False).input_ids]
        logprob, count = strided_loop(model, ids, max_length=16, stride=stride or 8)
        assert out["logprob"][i].as_py() == pytest.approx(logprob, abs=1e-4)
        assert out["tokens"][i].as_py() == count
        assert out["perplexity"][i].as_py() == pytest.approx(np.exp(-logprob / count), rel=1e-5)


def test_strided_windows_score_every_token_once_with_context_before_it():
    ids = np.arange(40)
    windows = strided(ids, window=16, stride=5)
    assert sum(t for _, t in windows) == len(ids) - 1
    scored = np.concatenate([w[len(w) - t :] for w, t in windows])
    assert scored.tolist() == ids[1:].tolist()
    assert all(len(w) > t for w, t in windows)
    with pytest.raises(ValueError):
        strided(ids, window=16, stride=16)


def test_a_continuation_given_its_context_is_lm_evaluation_harness(lm: Path):
    model, tokenizer = reference_model(lm)
    # one continuation the model's own greedy choice, so is_greedy is true somewhere
    context = PAIRS[0][0]
    ids = tokenizer(context, add_special_tokens=False, return_tensors="pt").input_ids
    best = model.generate(ids, max_new_tokens=2, do_sample=False)[0, ids.shape[1] :]
    pairs = [*PAIRS, (context, tokenizer.decode(best))]
    table = pa.table({"text": [c for c, _ in pairs], "pair": [p for _, p in pairs]})
    task, executor = loaded(lm, pair=True)
    out = scored(task, executor, table)
    alone = scored(task, executor, table, alone=True)
    expected = [harness(model, tokenizer, c, p) for c, p in pairs]
    for i, (logprob, greedy, count) in enumerate(expected):
        assert out["logprob"][i].as_py() == pytest.approx(logprob, abs=1e-4)
        assert out["is_greedy"][i].as_py() is greedy
        assert out["tokens"][i].as_py() == count
        assert alone["logprob"][i].as_py() == pytest.approx(out["logprob"][i].as_py(), abs=1e-5)
        assert alone["is_greedy"][i].as_py() is greedy
    if tokenizer(tokenizer.decode(best), add_special_tokens=False).input_ids == best.tolist():
        assert expected[-1][1]  # the model's own choice, where its text encodes back to it
    assert [f.name for f in task.columns] == ["logprob", "tokens", "is_greedy"]


def test_rows_sharing_a_context_read_its_cache_once(gpt2_path: Path):
    """The first three pairs share their context: one batch computes it once (the KV path)."""
    task, executor = loaded(gpt2_path, pair=True)
    calls = []
    model = task.likelihood.model
    model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    table = pa.table({"text": [c for c, _ in PAIRS[:3]], "pair": [p for _, p in PAIRS[:3]]})
    scored(task, executor, table)
    assert calls[0][0] == 1 and len(calls) == 2  # the context once, then the continuations


def test_a_long_text_batched_equals_it_alone(gpt2_path: Path, texts: list[str]):
    task, executor = loaded(gpt2_path, max_length=32, stride=12, token_logprobs=True)
    table = pa.table({"text": texts[:6]})
    together, alone = scored(task, executor, table), scored(task, executor, table, alone=True)
    np.testing.assert_allclose(
        together["logprob"].to_numpy(), alone["logprob"].to_numpy(), rtol=0, atol=1e-5
    )
    assert together["tokens"] == alone["tokens"]


def test_bad_rows_are_row_errors_naming_their_key(gpt2_path: Path):
    table = pa.table(
        {
            "text": ["A context", "A context", "word " * 80, None],
            "pair": [" fine", "   ", " ok", " ok"],
        }
    )
    task, executor = loaded(gpt2_path, pair=True, max_length=32)
    out = scored(task, executor, table)
    errors = out["errors"]
    assert sorted(errors) == [1, 2, 3]
    assert errors[1] == "column 'pair': text is empty"
    assert "[model].max_length" in errors[2] and "more than the model's window of 32" in errors[2]
    assert errors[3] == "column 'text': text is null"
    assert len(out["logprob"]) == 1


def test_a_tokenizer_without_bos_and_a_stride_past_the_window_are_refused_by_key(
    gpt2_path: Path, tmp_path: Path
):
    with pytest.raises(ModelError, match=r"\[loglik\].stride: 32 tokens"):
        loaded(gpt2_path, max_length=32, stride=32)
    folder = shutil.copytree(gpt2_path, tmp_path / "no-bos")
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("bos_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(ModelError, match=r"\[loglik\]: .* has no BOS token"):
        loaded(folder)
    loaded(folder, pair=True)  # a context predicts the continuation's first token: no BOS needed


def test_the_gate_passes_the_same_scores_and_fails_moved_ones():
    task_class = load_task.__globals__["TASKS"]["loglik"]
    gate = QualityConfig()
    reference = {
        "logprob": pa.array([-20.0, -3.0, -50.0]),
        "tokens": pa.array([10, 2, 25], pa.int32()),
        "is_greedy": pa.array([False, True, False]),
    }
    same = task_class.agreement(None, reference, reference, gate)
    assert same.passed and same.metrics["order_kept"] == 1.0
    moved = {**reference, "logprob": pa.array([-20.5, -3.0, -50.0])}  # 5 % per token
    assert not task_class.agreement(None, reference, moved, gate).passed
    flipped = {**reference, "is_greedy": pa.array([False, False, False])}
    assert "greedy_agreement" in task_class.agreement(None, reference, flipped, gate).failures[0]


def test_the_shipped_perplexity_job_runs_and_writes_its_columns(tmp_path: Path, small_corpus):
    """jobs/perplexity.toml as shipped, through the command line, on the toy GPT-2 that
    scripts/generate_example.py builds (briefly trained) and a slice of the sample corpus, laid
    out as the repository lays them out; with token usage counted and increments by row."""
    import generate_example
    import sample_corpus

    root = Path(__file__).resolve().parents[2]
    shutil.copytree(root / "jobs", tmp_path / "jobs")
    generate_example.build(small_corpus, tmp_path / "models" / "toy-gpt2", steps=1)
    sample_corpus.write_shards(small_corpus.slice(0, 40), tmp_path / "data" / "docs", shards=2)
    job = tmp_path / "jobs" / "perplexity.toml"
    sets = ["--set", "output.usage=true", "--set", 'input.increments="rows"']
    result = invoke("run", str(job), *sets)
    assert result.exit_code == 0, result.stderr
    out = read_output(tmp_path / "out" / "perplexity")
    assert out.num_rows == 40
    types = {f.name: str(f.type) for f in out.schema}
    assert types["logprob"] == "double" and types["perplexity"] == "double"
    assert types["tokens"] == "int32" and types["prompt_tokens"] == "int32"
    assert out.column_names[:2] == ["doc_id", "kind"]
    tokens, read = out["tokens"].to_numpy(), out["prompt_tokens"].to_numpy()
    assert (read >= tokens + 1).all()  # every window's tokens, the BOS and overlaps included
    perplexity = np.exp(-out["logprob"].to_numpy() / tokens)
    np.testing.assert_allclose(out["perplexity"].to_numpy(), perplexity)
