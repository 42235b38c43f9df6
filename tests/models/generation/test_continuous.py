"""Continuous batching for decoder-only generation: rows leave and join the running batch, the
prompts' shared start is computed once, and no row's tokens change for any of it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch

from batchscore.job.parse import load_job
from batchscore.models.generation.decode import generation_config, loop_decodes_alike
from batchscore.models.generation.schedule import shared_start
from batchscore.models.generation.seats import plain_cache
from batchscore.recipes.run import run_job
from tests.conftest import read_output
from tests.models.test_generate import (
    assert_same_tokens,
    generate,
    generate_job,
    make_task,
    row_alone,
)

TEMPLATE = "Summarize the following text in one sentence, please.\nText: {text}\nSummary:"


def stream(task, encoded, *, max_tokens: int = 4096, max_rows: int = 64, reuse_prefix=True):
    """Each row's new tokens in row order (an object array), and the schedule that made them."""
    units = np.argsort(encoded.lengths, kind="stable")  # the sampler's order: by prompt length
    schedule = task.stream(
        encoded, units, max_tokens=max_tokens, max_rows=max_rows, reuse_prefix=reuse_prefix
    )
    out = np.empty(len(units), dtype=object)
    with torch.inference_mode():
        for index, tokens in schedule:
            assert out[units[index]] is None, "a row finished twice"
            out[units[index]] = tokens
    return out, schedule


@pytest.fixture(scope="module")
def mixed(gpt2_path, tiny_texts):
    """A greedy GPT-2 task and 24 prompts of very different lengths, with their row-alone
    answers, which range from a token or two to max_new_tokens."""
    task = make_task(gpt2_path, max_new_tokens=16)
    by_length = sorted(tiny_texts, key=len)
    texts = ["Hi.", "x", *by_length[:6], *by_length[100:108], *by_length[-8:]]
    encoded = task.encode(pa.table({"text": texts}))
    return task, encoded, row_alone(task, encoded)


def test_continuous_greedy_equals_each_row_alone(mixed):
    task, encoded, alone = mixed
    assert task.continuous
    assert encoded.lengths.max() >= 10 * encoded.lengths.min()  # really mixed prompts
    answers = [len(t) for t in alone]
    assert min(answers) <= 3 and max(answers) == 16  # and really mixed answers
    out, schedule = stream(task, encoded)
    assert_same_tokens(out, alone)
    assert len(schedule.prefills) == 1  # all fit at once: rows only leave


@pytest.mark.parametrize("max_rows", [1, 3, 7])
def test_rows_joining_a_running_batch_keep_their_tokens(mixed, max_rows):
    """Few seats: waiting rows are prefilled and join rows mid-answer, many times over."""
    task, encoded, alone = mixed
    out, schedule = stream(task, encoded, max_rows=max_rows)
    assert_same_tokens(out, alone)
    if max_rows > 1:
        assert len(schedule.prefills) > 2
    seated = np.concatenate(schedule.prefills)
    assert sorted(seated.tolist()) == list(range(len(alone)))  # each row prefilled once


def test_the_token_budget_limits_the_seats(mixed):
    task, encoded, alone = mixed
    widest = int((encoded.lengths + encoded.reserve).max())
    out, schedule = stream(task, encoded, max_tokens=2 * widest)
    assert_same_tokens(out, alone)
    sizes = encoded.lengths + encoded.reserve
    units = np.argsort(encoded.lengths, kind="stable")
    for group in schedule.prefills:  # rows x the widest of them: within the budget
        assert len(group) * sizes[units[group]].max() <= 2 * widest
    assert len(schedule.prefills[-1]) <= 2  # the longest rows come last, two at a time


@pytest.mark.parametrize("max_rows", [4, 64])
def test_prefix_sharing_on_or_off_gives_the_same_tokens(gpt2_path, tiny_texts, max_rows):
    task = make_task(gpt2_path, max_length=96, max_new_tokens=12, prompt=TEMPLATE)
    encoded = task.encode(pa.table({"text": ["a", "Return it.", *tiny_texts[:14]]}))
    shared, schedule = stream(task, encoded, max_rows=max_rows)
    plain, without = stream(task, encoded, max_rows=max_rows, reuse_prefix=False)
    assert_same_tokens(shared, plain)
    assert_same_tokens(shared, row_alone(task, encoded))
    start = len(task.generator.encoder.hf(TEMPLATE.split("{text}")[0])["input_ids"])
    whole = int((encoded.lengths < 96).sum())  # prompts cut at the front lost the template
    assert whole >= 2 and schedule.reused >= (start - 1) * whole
    assert without.reused == 0


def test_continuous_sampling_draws_as_generate_does(gpt2_path, mixed):
    _, encoded, _ = mixed
    options = {"do_sample": True, "temperature": 1.5, "top_k": 50, "top_p": 0.95, "seed": 7}
    task = make_task(gpt2_path, max_new_tokens=16, **options)
    assert task.continuous
    static = generate(task, encoded, [np.arange(len(encoded.rows))])
    out, _ = stream(task, encoded, max_rows=5)
    assert_same_tokens(out, static)


def test_shared_start_is_the_common_start_of_whole_prompts():
    prompts = [np.array(p) for p in ([1, 2, 3, 4], [1, 2, 3, 9, 9], [1, 2, 7], [5, 1, 2, 3, 4, 4])]
    assert shared_start(prompts[:2], cut=10).tolist() == [1, 2, 3]
    assert shared_start(prompts[:3], cut=10).tolist() == [1, 2]
    assert shared_start(prompts[:2] + prompts[3:], cut=6).tolist() == [1, 2, 3]  # 4th was cut
    assert shared_start(prompts, cut=10).tolist() == []
    assert shared_start([], cut=10).tolist() == []


def test_seq2seq_beams_and_extra_logits_steps_fall_back_to_static(gpt2_path, t5_path, bart_path):
    assert not make_task(t5_path).continuous
    assert not make_task(bart_path).continuous
    assert not make_task(gpt2_path, num_beams=2).continuous
    config = make_task(gpt2_path).generator.config
    assert loop_decodes_alike(config)
    config.repetition_penalty = 1.3  # the loop applies it as `generate` does
    assert loop_decodes_alike(config)
    config.suppress_tokens = [5]  # `generate` would add a step the loop does not have
    assert not loop_decodes_alike(config)
    config = generation_config(config, make_task(gpt2_path).generator.decoding, pad_id=0)
    config.no_repeat_ngram_size = 2
    assert not loop_decodes_alike(config)


def test_a_cache_that_is_not_plain_falls_back_to_static():
    from transformers import GPT2Config, MistralConfig

    small = {"hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 2}
    sliding = MistralConfig(**small, num_key_value_heads=1, sliding_window=4)
    assert not plain_cache(SimpleNamespace(config=sliding))
    assert plain_cache(SimpleNamespace(config=GPT2Config(n_layer=2, n_embd=16, n_head=2)))


def test_a_job_writes_the_same_rows_and_fingerprint_either_way(tmp_path, shards, gpt2_path):
    path = generate_job(tmp_path, gpt2_path, prompt="{kind}: {text}")
    reports = {}
    for continuous in (True, False):
        out = f"out-{continuous}"
        keys = [f"batching.continuous={str(continuous).lower()}", f'output.path="{out}"']
        reports[continuous] = run_job(load_job(path, keys))
    assert reports[True]["rows"] == reports[False]["rows"] == 360
    assert read_output(tmp_path / "out-True").equals(read_output(tmp_path / "out-False"))
    # neither key is part of the fingerprint: a run with them flipped resumes the folder
    flipped = ["batching.continuous=false", "batching.prefix_cache=false", 'output.path="out-True"']
    assert run_job(load_job(path, flipped))["chunks_already_done"] == 6


@pytest.mark.parametrize("continuous", [True, False])
def test_the_gates_answers_are_the_runs_for_its_rows(tmp_path, shards, gpt2_path, continuous):
    """A new folder's gate (max_tokens = "auto" gates fp32 and times budgets with its model)
    answers the first 30 prompts; the run takes those answers, continuously batched or not, and
    writes what a run without a gate writes."""
    path = generate_job(tmp_path, gpt2_path, prompt="{kind}: {text}")
    mode = f"batching.continuous={str(continuous).lower()}"
    gated = run_job(load_job(path, [mode, "batching.max_tokens=auto", "quality.sample_rows=30"]))
    plain = run_job(load_job(path, [mode, 'output.path="plain"']))
    assert gated["from_gate"] == 30 and plain["from_gate"] == 0
    assert gated["rows"] == plain["rows"] == 360
    assert read_output(tmp_path / "out").equals(read_output(tmp_path / "plain"))
