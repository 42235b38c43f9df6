"""[generate].stop and [generate].repetition_penalty, as transformers defines them.

Every row, statically batched (one padded batch of very different lengths) or continuously
batched (rows leaving and joining), decoder-only (GPT-2) or seq2seq (T5, BART), generates what
transformers' greedy ``generate`` generates for it alone with ``stop_strings`` (and the
tokenizer) and ``repetition_penalty``. The stop strings are drawn from what the models write
without them, so some rows stop on them and others do not.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.errors import JobError, OutputConflictError
from batchscore.job.parse import job_from_dict, load_job
from batchscore.models.generation.stops import Stops
from batchscore.recipes.run import run_job
from tests.conftest import read_output
from tests.models.generation.test_continuous import stream
from tests.models.test_generate import generate, generate_job, make_task, row_alone

NEW = 12
RUNS = [
    ("gpt2_path", "static"),
    ("gpt2_path", "continuous"),
    ("t5_path", "static"),
    ("bart_path", "static"),
]


@functools.cache
def reference(path: Path):
    """transformers' own tokenizer and model for a folder, loaded apart from batchscore."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    seq2seq = AutoConfig.from_pretrained(path).is_encoder_decoder
    auto = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
    model = auto.from_pretrained(path, dtype=torch.float32).eval()
    return AutoTokenizer.from_pretrained(path), model, seq2seq


def alone(path: Path, prompt: np.ndarray, *, stops=(), penalty=None) -> tuple[list[int], list]:
    """transformers' greedy ``generate`` on one prompt by itself: its new tokens, and the
    sequence its stopping criteria saw (a decoder's prompt and tokens; a seq2seq decoder's)."""
    hf, model, seq2seq = reference(path)
    eos = model.generation_config.eos_token_id
    pad = hf.pad_token_id if hf.pad_token_id is not None else eos
    options = {"max_new_tokens": NEW, "do_sample": False, "num_beams": 1, "pad_token_id": pad}
    if stops:
        options |= {"stop_strings": list(stops), "tokenizer": hf}
    if penalty is not None:
        options["repetition_penalty"] = penalty
    ids = torch.from_numpy(np.asarray(prompt, dtype=np.int64))[None]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **options)
    new = out[0, 1:] if seq2seq else out[0, ids.shape[1] :]
    return new.tolist(), out[0].tolist()


@pytest.fixture(scope="module")
def prompts(tiny_texts: list[str]) -> list[str]:
    by_length = sorted(tiny_texts, key=len)
    return ["Hi.", "x", *by_length[:4], *by_length[100:104], *by_length[-3:], "Return it."]


def encode(path: Path, prompts: list[str], **options):
    task = make_task(path, max_new_tokens=NEW, **options)
    return task, task.encode(pa.table({"text": prompts}))


@functools.cache
def plain_texts(path: Path, prompts: tuple[str, ...]) -> list[str]:
    """What the model writes for each prompt with neither control."""
    _, encoded = encode(path, list(prompts))
    hf = reference(path)[0]
    return [hf.decode(alone(path, ids)[0], skip_special_tokens=True) for ids in encoded.ids]


def chosen_stops(path: Path, prompts: list[str]) -> tuple[str, ...]:
    """A three-character piece of every third row's plain text, past its first two characters:
    those rows stop on them. Pieces of a character the decoder could not spell whole (U+FFFD,
    where a token ends inside a UTF-8 sequence) are passed over: no token spells them."""
    pieces = []
    for text in plain_texts(path, tuple(prompts))[1::3]:
        found = (text[i : i + 3] for i in range(2, len(text) - 2))
        pieces += [p for p in found if p.strip() and "\ufffd" not in p][:1]
    return tuple(dict.fromkeys(pieces))


def run(task, encoded, mode: str) -> np.ndarray:
    if mode == "static":  # one batch: the short rows padded to the longest
        return generate(task, encoded, [np.arange(len(encoded.rows))])
    return stream(task, encoded, max_rows=4)[0]


@pytest.mark.parametrize(("model", "mode"), RUNS)
def test_stop_strings_end_rows_where_generate_ends_them(model, mode, prompts, request):
    from transformers import StopStringCriteria

    path = request.getfixturevalue(model)
    stops = chosen_stops(path, prompts)
    assert stops
    task, encoded = encode(path, prompts, stop=stops)
    assert task.continuous == (model == "gpt2_path")  # seq2seq models batch statically
    hf = reference(path)[0]
    criterion = StopStringCriteria(hf, list(stops))  # transformers' own: which rows it stopped
    expected = [alone(path, ids, stops=stops) for ids in encoded.ids]
    got = run(task, encoded, mode)
    out = task.finish(encoded, got)
    eos = task.generator.eos
    reasons, written = out["finish_reason"].to_pylist(), out["generated"].to_pylist()
    for i, (want, sequence) in enumerate(expected):
        assert got[i].tolist() == want, f"row {i}"
        stopped = bool(criterion(torch.tensor([sequence]), None)[0])
        ended = bool(want) and want[-1] in eos
        forced = ended and len(want) == NEW and want[-1] in task.generator.forced_eos  # BART
        reason = "eos" if ended and not forced else "stop" if stopped else "length"
        assert reasons[i] == reason, f"row {i}"
        text = hf.decode(want, skip_special_tokens=True)
        if reason != "stop":
            assert written[i] == text, f"row {i}"
            continue
        # the text before the stop string: what follows it in the text is where a stop string
        # starts (or, with nothing before it, the end of one that began in the prompt)
        rest = text[len(written[i]) :]
        assert text.startswith(written[i]) and not any(s in written[i] for s in stops)
        began_in_prompt = not written[i] and any(
            rest.startswith(s[j:]) for s in stops for j in range(1, len(s))
        )
        assert began_in_prompt or any(rest.startswith(s) for s in stops), (
            f"row {i}: {text!r} written as {written[i]!r}"
        )
    assert reasons.count("stop") >= 2 and len(set(reasons)) >= 2  # some rows stopped, not all


@pytest.mark.parametrize(("model", "mode"), RUNS)
@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_is_generates(model, mode, penalty, prompts, request):
    path = request.getfixturevalue(model)
    task, encoded = encode(path, prompts, repetition_penalty=penalty)
    assert task.continuous == (model == "gpt2_path")  # seq2seq models batch statically
    got = run(task, encoded, mode)
    expected = [alone(path, ids, penalty=penalty)[0] for ids in encoded.ids]
    for i, want in enumerate(expected):
        assert got[i].tolist() == want, f"row {i}"
    plain = [alone(path, ids)[0] for ids in encoded.ids]
    assert plain != expected  # the penalty changed some rows


@pytest.fixture(scope="module")
def pieces(gpt2_path, prompts) -> list[str]:
    """Every 1 to 3 character piece of GPT-2's plain texts: stop strings rows may meet."""
    texts = plain_texts(gpt2_path, tuple(prompts))
    found = {t[i : i + n] for t in texts for n in (1, 2, 3) for i in range(len(t) - n + 1)}
    return sorted(p for p in found if p.strip())


@settings(max_examples=20, deadline=None)
@given(data=st.data(), penalty=st.none() | st.floats(0.5, 2.0))
def test_any_stops_and_penalty_static_continuous_and_alone_agree(
    gpt2_path, prompts, pieces, data, penalty
):
    stops = tuple(data.draw(st.lists(st.sampled_from(pieces), max_size=3, unique=True)))
    task, encoded = encode(gpt2_path, prompts, stop=stops, repetition_penalty=penalty)
    static, continuous = run(task, encoded, "static"), run(task, encoded, "continuous")
    for i, ids in enumerate(encoded.ids):
        want = alone(gpt2_path, ids, stops=stops, penalty=penalty)[0]
        assert static[i].tolist() == want, f"row {i} (static)"
        assert continuous[i].tolist() == want, f"row {i} (continuous)"


@pytest.mark.parametrize("model", ["gpt2_path", "t5_path"])
def test_beam_search_stops_rows_as_it_does_alone(model, prompts, request):
    path = request.getfixturevalue(model)
    stops = chosen_stops(path, prompts)
    task, encoded = encode(path, prompts, stop=stops, num_beams=3, repetition_penalty=1.2)
    batched = generate(task, encoded, [np.arange(len(prompts))])
    for i, row in enumerate(row_alone(task, encoded)):
        assert batched[i].tolist() == row.tolist(), f"row {i}"


def test_sampling_with_both_controls_is_the_same_continuous_or_static(gpt2_path, prompts):
    stops = chosen_stops(gpt2_path, prompts)
    options = {"do_sample": True, "temperature": 1.3, "seed": 5, "repetition_penalty": 1.2}
    task, encoded = encode(gpt2_path, prompts, stop=stops, **options)
    assert task.continuous
    static, continuous = run(task, encoded, "static"), run(task, encoded, "continuous")
    for i in range(len(prompts)):
        assert static[i].tolist() == continuous[i].tolist(), f"row {i}"


def test_the_models_own_penalty_and_stop_strings_apply_with_the_jobs(gpt2_path, prompts, tmp_path):
    """A generation_config.json may set both: its penalty applies where the job sets none, and
    its stop strings join the job's; continuous batching still runs, as generate would."""
    stops = chosen_stops(gpt2_path, prompts)
    assert len(stops) >= 2
    folder = tmp_path / "gpt2-own"
    shutil.copytree(gpt2_path, folder)
    config_file = folder / "generation_config.json"
    own = {"repetition_penalty": 1.3, "stop_strings": [stops[0]]}
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **own}))
    task, encoded = encode(folder, prompts, stop=stops[1:])
    assert task.continuous
    got = run(task, encoded, "continuous")
    for i, ids in enumerate(encoded.ids):
        want = alone(folder, ids, stops=(*stops[1:], stops[0]))[0]  # the folder's penalty
        assert got[i].tolist() == want, f"row {i}"
    assert "stop" in task.finish(encoded, got)["finish_reason"].to_pylist()


@pytest.fixture(scope="module")
def gpt2_stops(gpt2_path) -> Stops:
    return Stops(("ab", "b\n", "aaa", "\n\n"), reference(gpt2_path)[0], gpt2_path)


@settings(max_examples=500, deadline=None)
@given(text=st.text("ab\n ", max_size=12), head=st.text("ab\n ", max_size=4))
def test_what_is_written_ends_before_the_first_stop_string(gpt2_stops, text, head):
    """The written text ends where the first stop string that reaches into ``text`` starts
    (one may begin in ``head``, the prompt's end: then nothing is written); every position
    of the text is tried against every string."""
    full = head + text
    starts = [
        i
        for s in gpt2_stops.strings
        for i in range(len(full))
        if full.startswith(s, i) and i + len(s) > len(head)
    ]
    expected = text[: max(0, min(starts) - len(head))] if starts else text
    assert gpt2_stops.cut(text, head) == expected


def test_a_job_with_both_controls_writes_the_same_rows_either_way(tmp_path, shards, gpt2_path):
    controls = {"stop": ["th", "s."], "repetition_penalty": 1.25}
    path = generate_job(tmp_path, gpt2_path, prompt="{kind}: {text}", **controls)
    for continuous in ("true", "false"):
        sets = [f"batching.continuous={continuous}", f'output.path="out-{continuous}"']
        assert run_job(load_job(path, sets))["rows"] == 360
    out = read_output(tmp_path / "out-true")
    assert out.equals(read_output(tmp_path / "out-false"))
    reasons = out["finish_reason"].to_pylist()
    assert "stop" in reasons and "length" in reasons
    texts = out["generated"].to_pylist()
    stopped = [t for t, r in zip(texts, reasons, strict=True) if r == "stop"]
    assert not any("th" in t or "s." in t for t in stopped)
    for change in ('generate.stop=["th"]', "generate.repetition_penalty=1.3"):
        changed = load_job(path, [change, 'output.path="out-true"'])
        with pytest.raises(OutputConflictError, match="task_options"):
            run_job(changed)  # both keys are part of the fingerprint


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"stop": [f"s{i}" for i in range(17)]}, "stop: at most 16 strings, got 17"),
        ({"stop": ["ok", ""]}, "stop: an empty string would end every row"),
        ({"stop": ["x" * 257]}, "is 257 characters long; at most 256"),
        ({"stop": "one"}, None),  # a single string is a list of one, as TOML lists go
        ({"repetition_penalty": 0.0}, "repetition_penalty: must be at least 0.01"),
        ({"repetition_penalty": -1.2}, "repetition_penalty: must be at least 0.01"),
        ({"repetition_penalty": 1000.0}, "repetition_penalty: must be at most 100.0"),
        ({"repetition_penalty": 1.1}, None),
        ({"repetition_penalty": "high"}, "repetition_penalty: expected a finite number"),
    ],
)
def test_the_controls_are_bounded_when_the_job_loads(tmp_path, setting, message):
    raw = {
        "input": {"path": "in"},
        "model": {"task": "generate", "path": "m"},
        "output": {"path": "out"},
        "generate": setting,
    }
    if message is None:
        job_from_dict(raw, tmp_path / "job.toml")
        return
    with pytest.raises(JobError) as caught:
        job_from_dict(raw, tmp_path / "job.toml")
    assert any(f"[generate].{message}" in p or message in p for p in caught.value.problems)
    assert all("[generate]." in p for p in caught.value.problems)


def test_fp16_logits_that_overflow_still_give_every_row_its_token():
    """A model in fp16 whose logits overflow (made by hand: no GPU here, and the toy model's
    fp16 logits stay finite on a CPU): a NaN must not win the argmax, as torch's argmax lets it,
    and a row whose maximum overflowed to inf keeps that token; fp32 pays for no guard."""
    import torch

    from batchscore.models.generation.decode import Decoding, Picker

    nan, inf = float("nan"), float("inf")
    logits = torch.tensor(
        [[nan, 1.0, 9.0, 2.0], [1.0, inf, 3.0, inf], [0.5, 0.25, 2.0, -inf]],
        dtype=torch.float16,
    )
    guarded = Picker(Decoding(max_new_tokens=4), guard=True)
    assert guarded(logits, [None] * 3).tolist() == [2, 1, 2]
    assert Picker(Decoding(max_new_tokens=4))(logits, [None] * 3).tolist()[0] == 0  # unguarded
    sampled = Picker(Decoding(max_new_tokens=4, do_sample=True, top_k=2), guard=True)
    streams = [sampled.stream(np.array([i])) for i in range(3)]
    picked = sampled(logits, streams).tolist()
    assert picked[0] in (2, 3) and picked[1] in (1, 3) and picked[2] in (0, 2)
    # the static batches' `generate` takes the same guard as its first logits processor
    from transformers import LogitsProcessorList

    from batchscore.models.generation.decode import Finite

    scores = LogitsProcessorList([Finite()])(torch.zeros(3, 1, dtype=torch.long), logits)
    assert scores.dtype == torch.float32 and scores.argmax(-1).tolist() == [2, 1, 2]
