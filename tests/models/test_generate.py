"""Generation with tiny GPT-2, T5 and BART models: padding never changes a row's output.

Models run on one thread: for models this small, more threads only add synchronisation, which
costs seconds per batch when the machine's cores are busy with other work.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from batchscore.errors import JobError, ModelError, OutputConflictError
from batchscore.job.parse import load_job
from batchscore.job.sections import GenerateConfig, InputConfig, ModelConfig, SummarizeConfig
from batchscore.models.generate import GenerateTask
from batchscore.models.generation.architecture import generative_kind
from batchscore.models.generation.decode import Decoding, trim
from batchscore.models.tasks import load_task
from batchscore.pipeline.sampler import form_batches, restore
from batchscore.precision.int8_linear import int8_available
from batchscore.recipes.run import run_job
from batchscore.runtime.executor import Executor
from tests.conftest import read_output, write_job

MODELS = ["gpt2_path", "t5_path", "bart_path"]


def make_task(path: Path, max_length: int = 64, **options) -> GenerateTask:
    model = ModelConfig(task="generate", precision="fp32", max_length=max_length, threads=1)
    config = GenerateConfig(**{"max_new_tokens": 10, **options})
    return GenerateTask(
        path, model=model, options=config, inp=InputConfig(path=()), executor=Executor(model)
    )


@pytest.fixture(scope="module")
def prompts(tiny_texts: list[str]) -> list[str]:
    """Very different lengths side by side: a word, sentences, and pages cut at max_length."""
    by_length = sorted(tiny_texts, key=len)
    return ["Hi.", by_length[0], *by_length[150:153], by_length[-1], "Return the value.", "x"]


def generate(task: GenerateTask, encoded, batches: list[np.ndarray]) -> np.ndarray:
    """Each row's new tokens (an object array), in row order, as the driver restores them."""
    with torch.inference_mode():
        outputs = [task.forward(encoded, b) for b in batches]
    return restore(batches, outputs, np.empty(0))


def row_alone(task: GenerateTask, encoded) -> np.ndarray:
    return generate(task, encoded, [np.array([i]) for i in range(len(encoded.rows))])


def assert_same_tokens(a: np.ndarray, b: np.ndarray) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.tolist() == y.tolist(), f"row {i} differs"


@pytest.mark.parametrize("model", MODELS)
def test_batched_greedy_equals_each_row_alone(model, prompts, request):
    task = make_task(request.getfixturevalue(model))
    encoded = task.encode(pa.table({"text": prompts}))
    assert encoded.lengths.max() >= 10 * encoded.lengths.min()  # really mixed lengths
    one_batch = [np.arange(len(prompts))]
    batched = generate(task, encoded, one_batch)
    assert_same_tokens(batched, row_alone(task, encoded))
    reasons = task.finish(encoded, batched)["finish_reason"]
    assert set(reasons.to_pylist()) <= {"eos", "length"}


def test_batched_greedy_stops_rows_at_different_steps(gpt2_path, tiny_texts):
    """Rows that end early keep padding while the others decode on; none is disturbed."""
    task = make_task(gpt2_path)
    encoded = task.encode(pa.table({"text": tiny_texts[:24]}))
    batches = form_batches(encoded.lengths + encoded.reserve, 600, 64)
    assert len(batches) > 1
    batched = generate(task, encoded, batches)
    assert {len(t) for t in batched} > {10}  # some rows stopped on EOS before the limit
    assert_same_tokens(batched, row_alone(task, encoded))


@pytest.mark.parametrize("model", ["gpt2_path", "t5_path"])
def test_cached_decoding_equals_uncached(model, prompts, request):
    task = make_task(request.getfixturevalue(model))
    encoded = task.encode(pa.table({"text": prompts}))
    batch = [np.arange(len(prompts))]
    cached = generate(task, encoded, batch)
    task.generator.config.use_cache = False  # every step recomputes the whole sequence
    assert_same_tokens(cached, generate(task, encoded, batch))


def test_beam_search_is_padding_free_too(gpt2_path, prompts):
    task = make_task(gpt2_path, num_beams=3)
    encoded = task.encode(pa.table({"text": prompts}))
    batched = generate(task, encoded, [np.arange(len(prompts))])
    assert_same_tokens(batched, row_alone(task, encoded))
    greedy = make_task(gpt2_path)
    assert [t.tolist() for t in batched] != [
        t.tolist() for t in generate(greedy, encoded, [np.arange(len(prompts))])
    ]


def test_seeded_sampling_is_reproducible_per_row_whatever_the_batch(gpt2_path, prompts):
    options = {"do_sample": True, "temperature": 1.5, "top_k": 50, "top_p": 0.95, "seed": 7}
    task = make_task(gpt2_path, **options)
    encoded = task.encode(pa.table({"text": prompts}))
    batched = generate(task, encoded, [np.arange(len(prompts))])
    assert_same_tokens(batched, row_alone(task, encoded))
    assert_same_tokens(batched, generate(task, encoded, [np.arange(len(prompts))]))
    greedy = generate(make_task(gpt2_path), encoded, [np.arange(len(prompts))])
    assert [t.tolist() for t in batched] != [t.tolist() for t in greedy]
    reseeded = make_task(gpt2_path, **{**options, "seed": 8})
    other = generate(reseeded, encoded, [np.arange(len(prompts))])
    assert [t.tolist() for t in batched] != [t.tolist() for t in other]


def test_prompt_template_reads_its_columns_and_names_null_rows(gpt2_path):
    task = make_task(gpt2_path, prompt="Question: {question}\nContext: {context}\nAnswer:")
    assert task.inputs == ("question", "context")
    table = pa.table({"question": ["Why?", None, "How?"], "context": ["a", "b", None]})
    encoded = task.encode(table)
    assert encoded.rows.tolist() == [0]
    assert encoded.errors == {
        1: "column 'question': text is null",
        2: "column 'context': text is null",
    }
    assert encoded.reserve == 10  # the budget holds the tokens still to be generated
    expected = task.generator.encoder.hf("Question: Why?\nContext: a\nAnswer:")["input_ids"]
    assert encoded.ids[0].tolist() == expected


def test_long_prompts_keep_their_end_for_decoders_and_their_start_for_seq2seq(gpt2_path, t5_path):
    text = " ".join(f"word{i}" for i in range(200))
    decoder = make_task(gpt2_path, max_length=16)
    ids = decoder.encode(pa.table({"text": [text]})).ids[0].tolist()
    assert ids == decoder.generator.encoder.hf(text)["input_ids"][-16:]
    seq2seq = make_task(t5_path, max_length=16)
    ids = seq2seq.encode(pa.table({"text": [text]})).ids[0].tolist()
    full = seq2seq.generator.encoder.hf(text)["input_ids"]
    assert ids[:15] == full[:15] and ids[-1] == full[-1]  # the start, then </s>


def test_decoder_positions_must_hold_prompt_plus_new_tokens(gpt2_path):
    with pytest.raises(ModelError, match="too few for prompts"):
        make_task(gpt2_path, max_length=250, max_new_tokens=10)  # 256 positions
    assert make_task(gpt2_path, max_length=None).generator.encoder.max_length == 246


def test_generative_kind_comes_from_the_config(gpt2_path, t5_path, bart_path, minilm_path):
    from transformers import AutoConfig

    kinds = [generative_kind(AutoConfig.from_pretrained(p)) for p in (gpt2_path, t5_path)]
    assert kinds == ["decoder", "seq2seq"]
    assert generative_kind(AutoConfig.from_pretrained(bart_path)) == "seq2seq"
    assert generative_kind(AutoConfig.from_pretrained(minilm_path)) is None
    model = ModelConfig(task="generate", precision="fp32")
    with pytest.raises(ModelError, match="not a text-generation model"):
        GenerateTask(
            minilm_path,
            model=model,
            options=GenerateConfig(),
            inp=InputConfig(path=()),
            executor=Executor(model),
        )


def test_trim_and_finish_reasons(bart_path):
    tokens = np.array([[5, 2, 1, 1], [5, 6, 7, 8], [2, 1, 1, 1]])
    assert [t.tolist() for t in trim(tokens, {2})] == [[5, 2], [5, 6, 7, 8], [2]]
    task = make_task(bart_path, max_new_tokens=4)  # BART forces EOS as its last token
    tokens = [np.array(t) for t in ([5, 2], [5, 6, 7, 2], [5, 6, 7, 8])]
    reasons = task.generator.finish_reasons(tokens, task.generator.contexts([np.array([9])] * 3))
    assert reasons == ["eos", "length", "length"]


def test_decoding_reads_either_section():
    assert Decoding.of(SummarizeConfig(max_new_tokens=30, num_beams=2)) == Decoding(30, 2)
    assert Decoding.of(GenerateConfig(do_sample=True, seed=3)).seed == 3


def generate_job(tmp_path: Path, model: Path, task: str = "generate", **section) -> Path:
    return write_job(
        tmp_path / f"{task}.toml",
        input={"path": "in", "id": "doc_id"},
        model={"task": task, "path": str(model), "max_length": 48, "threads": 1},
        batching={"max_tokens": 2048, "window_rows": 64},
        output={"path": "out", "chunk_rows": 60},
        **{task: {"max_new_tokens": 6, **section}},
    )


def test_generate_job_runs_and_resumes(tmp_path, shards, gpt2_path):
    job = load_job(generate_job(tmp_path, gpt2_path, prompt="{kind}: {text}"))
    report = run_job(job)
    assert report["rows"] == 360 and report["chunks_committed"] == 6
    out = read_output(tmp_path / "out")
    assert out.column_names == [
        "doc_id", "generated", "prompt_tokens", "generated_tokens", "finish_reason"
    ]  # fmt: skip
    assert out.schema.field("prompt_tokens").type == pa.int32()
    assert max(out["prompt_tokens"].to_pylist()) == 48
    assert set(out["generated_tokens"].to_pylist()) <= set(range(7))
    assert set(out["finish_reason"].to_pylist()) <= {"eos", "length"}
    again = run_job(job)
    assert again["rows"] == 0 and again["chunks_already_done"] == 6 and again["load_s"] == 0
    changed = load_job(job.source, ["generate.max_new_tokens=7"])
    with pytest.raises(OutputConflictError):
        run_job(changed)  # generation settings are part of the fingerprint


def test_summarize_with_a_generative_model_is_abstractive(tmp_path, shards, t5_path):
    job = load_job(generate_job(tmp_path, t5_path, "summarize", prompt="summarize: {text}"))
    run_job(job)
    out = read_output(tmp_path / "out")
    assert out.column_names == ["doc_id", "summary"] and out.num_rows == 360
    assert run_job(job)["rows"] == 0


@pytest.mark.skipif(not int8_available(), reason="needs oneDNN int8 CPU kernels")
def test_int8_is_refused_for_generation_before_anything_is_scored(tmp_path, shards, t5_path):
    sets = ["model.precision=int8", "quality.sample_rows=8"]
    job = load_job(generate_job(tmp_path, t5_path, "summarize"), sets)
    with pytest.raises(ModelError, match="generates text; use fp32 or bf16"):
        run_job(job, accept_quality=True)
    assert not list((tmp_path / "out").glob("*.parquet"))


def test_summarize_prompt_with_an_encoder_is_refused(minilm_path):
    model = ModelConfig(task="summarize", precision="fp32", path=str(minilm_path))
    options = dataclasses.replace(SummarizeConfig(), prompt="summarize: {text}")
    with pytest.raises(ModelError, match="reads no prompt"):
        load_task(
            minilm_path,
            model=model,
            options=options,
            inp=InputConfig(path=()),
            executor=Executor(model),
        )


def test_generate_keys_are_checked_when_the_job_loads(tmp_path, gpt2_path):
    path = generate_job(tmp_path, gpt2_path, prompt="{kind} {0} {a.b}")
    with pytest.raises(JobError, match=r"\[generate\].prompt: \{0\} is not a column field"):
        load_job(path)
    with pytest.raises(JobError, match="sampling with num_beams > 1 is not supported"):
        load_job(generate_job(tmp_path, gpt2_path, do_sample=True, num_beams=2))
    with pytest.raises(JobError, match=r"max_length \+ \[generate\].max_new_tokens \(48 \+ 6\)"):
        load_job(generate_job(tmp_path, gpt2_path), ["batching.max_tokens=50"])
    with pytest.raises(JobError, match=r"\[generate\].top_p: must be at most 1.0"):
        load_job(generate_job(tmp_path, gpt2_path, top_p=1.5))


@pytest.mark.parametrize(
    "model, task, sets, said",
    [
        ("gpt2_path", "generate", ["model.max_length=252"], "256 positions, too few"),
        ("minilm_path", "generate", [], "not a text-generation model"),
        ("minilm_path", "summarize", ['summarize.prompt="{text}"'], "reads no prompt"),
    ],
)
def test_validate_refuses_what_the_runs_model_load_refuses(
    tmp_path, shards, request, model, task, sets, said
):
    """What a run's load refuses from the tokenizer and config alone (a window the model's
    positions cannot hold with the tokens to generate; an encoder asked to generate or read a
    prompt), `validate` refuses too, with the run's exit status (4) and its words, before any
    weights load; before, `validate` said ok and `run` exited 4."""
    from click.testing import CliRunner

    from batchscore.cli import main

    path = request.getfixturevalue(model)
    job = generate_job(tmp_path, path, task)
    overrides = [a for s in sets for a in ("--set", s)]
    checked = CliRunner().invoke(main, ["validate", str(job), *overrides])
    ran = CliRunner().invoke(main, ["run", str(job), "--progress", "off", *overrides])
    assert checked.exit_code == ran.exit_code == 4, (checked.output, ran.output)
    assert said in checked.stderr and said in ran.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.parquet"))
