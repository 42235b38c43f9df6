"""The sentence-transformers stack, exactly: every pooling mode, Dense, Normalize and prompts,
in the folders sentence-transformers 6 saves and in the hub's older layout, each compared with
``SentenceTransformer(folder).encode`` (run with ``-s`` to see the cosine figures)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from batchscore.cli import main
from batchscore.errors import ModelError
from batchscore.job.parse import load_job
from batchscore.job.sections import EmbedConfig
from batchscore.models.fingerprint import fingerprint_parts
from batchscore.models.stack.stack import read_stack
from tests.conftest import write_job
from tests.models.st_folders import (
    cosines,
    embed_column,
    floats,
    save_st,
    st_encode,
    tiny_bert,
    to_hub_layout,
)


def embed(path: Path, texts: list[str], *, prompt_name=None, normalize=True, **model) -> np.ndarray:
    """batchscore's embeddings of ``texts``, in length-bucketed, padded batches."""
    return floats(embed_column(path, texts, EmbedConfig(normalize, prompt_name), **model))


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory, minilm_path) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("tiny") / "bert", minilm_path)


def test_dense_normalize_and_prompts_equal_sentence_transformers(dense_model, texts):
    for prompt_name in (None, "passage"):
        ours = embed(dense_model, texts, prompt_name=prompt_name)
        reference = st_encode(dense_model, texts, prompt_name=prompt_name)
        assert ours.shape == reference.shape == (len(texts), 128)
        cosine = cosines(ours, reference)
        gap = np.abs(ours - reference).max()
        print(
            f"\nMiniLM + Dense(128) + Normalize, prompt {prompt_name or 'default (query)'}: "
            f"cosine with SentenceTransformer.encode min {cosine.min():.7f} "
            f"mean {cosine.mean():.7f}, max |difference| {gap:.2e}"
        )
        assert cosine.min() >= 0.9999
        assert np.abs(ours - reference).max() < 1e-4
    # the prompt matters, so it is really applied: the two sets differ
    passage = embed(dense_model, texts[:5], prompt_name="passage")
    assert cosines(embed(dense_model, texts[:5]), passage).min() < 0.9999


@pytest.mark.parametrize(
    ("modes", "include_prompt", "dense"),
    [
        ("cls", True, []),
        ("max", True, []),
        ("mean", False, []),
        ("mean_sqrt_len_tokens", True, []),
        ("weightedmean", False, [(24, "GELU", False)]),
        ("lasttoken", True, []),
        (("cls", "mean", "max"), False, [(96, "Identity", True), (16, "ReLU", False)]),
        ("cls", False, [(32, "Sigmoid", True)]),
    ],
)
def test_every_pooling_mode_and_head_equals_sentence_transformers(
    tmp_path, tiny_encoder, texts, modes, include_prompt, dense
):
    folder = save_st(
        tmp_path / "st",
        tiny_encoder,
        modes=modes,
        include_prompt=include_prompt,
        dense=dense,
        prompts={"q": "represent this: "},
        default_prompt="q",
        max_seq_length=48,
    )
    reference = st_encode(folder, texts)  # no Normalize module: raw vectors
    raw = embed(folder, texts, normalize=False)
    assert raw.shape == reference.shape
    assert np.abs(raw - reference).max() < 1e-4 * max(1.0, float(np.abs(reference).max()))
    assert cosines(embed(folder, texts), reference).min() >= 0.9999  # [embed].normalize


def test_the_hub_layout_with_lowercase_and_pickled_dense(tmp_path, tiny_texts, texts):
    """ST 2.x folders: old class paths, pooling flags, 0_Transformer/, do_lower_case, a Dense
    saved as pytorch_model.bin (a pickle: loaded only when the job allows it)."""
    cased = tiny_bert(tmp_path / "cased", None, tiny_texts)
    saved = save_st(
        tmp_path / "st", cased, modes=("mean", "max"), dense=[(8, "Tanh", False)], normalize=True
    )
    folder = to_hub_layout(saved, tmp_path / "hub", lowercase=True)
    assert read_stack(folder).lowercase and read_stack(folder).encoder == folder / "0_Transformer"
    reference = st_encode(folder, texts)
    with pytest.raises(ModelError, match=r"pytorch_model\.bin: Dense weights in a pickle"):
        embed(folder, texts)
    ours = embed(folder, texts, allow_pickle=True)
    assert cosines(ours, reference).min() >= 0.9999
    assert cosines(ours, st_encode(saved, texts)).min() < 0.999  # lowercasing mattered


def validate(tmp_path: Path, shards: Path, model: dict, embed: dict | None = None):
    job = write_job(
        tmp_path / "job.toml",
        input={"path": str(shards)},
        model={"task": "embed", **model},
        output={"path": "out"},
        **({"embed": embed} if embed else {}),
    )
    return CliRunner().invoke(main, ["validate", str(job)], catch_exceptions=False), job


def test_modules_batchscore_does_not_run_are_refused_at_validate(tmp_path, shards, tiny_encoder):
    folder = save_st(tmp_path / "st", tiny_encoder, dense=[(8, "Tanh", False)])
    ok, _ = validate(tmp_path, shards, {"path": str(folder)})
    assert ok.exit_code == 0, ok.stderr
    modules = json.loads((folder / "modules.json").read_text())
    for kind in ("sentence_transformers.models.LayerNorm", "my_package.modules.Pooling"):
        broken = tmp_path / kind
        shutil.copytree(folder, broken)
        extra = {"idx": 3, "name": "3", "path": "3_Extra", "type": kind}
        (broken / "modules.json").write_text(json.dumps([*modules, extra]))
        result, _ = validate(tmp_path, shards, {"path": str(broken)})
        assert result.exit_code == 4, result.stderr
        assert f"module 3 is {kind}, which batchscore does not implement" in result.stderr
    dense_config = folder / "2_Dense" / "config.json"
    config = json.loads(dense_config.read_text())
    dense_config.write_text(json.dumps({**config, "activation_function": "my.Swish"}))
    result, _ = validate(tmp_path, shards, {"path": str(folder)})
    assert result.exit_code == 4 and "activation_function my.Swish" in result.stderr


def test_prompt_names_are_checked_and_fingerprinted(tmp_path, shards, dense_model, minilm_path):
    result, _ = validate(tmp_path, shards, {"path": str(dense_model)}, {"prompt_name": "doc"})
    assert result.exit_code == 4
    assert '[embed].prompt_name: "doc" is not a prompt of' in result.stderr
    assert 'defines: "document", "passage", "query"' in result.stderr
    parts = {}
    for name, prompt in (("default", None), ("passage", "passage"), ("chunked", None)):
        chunk = {"long_text": "chunk"} if name == "chunked" else {}
        _, job = validate(
            tmp_path,
            shards,
            {"path": str(dense_model), **chunk},
            {"prompt_name": prompt} if prompt else None,
        )
        parts[name] = fingerprint_parts(load_job(job), dense_model)
    assert parts["default"]["prompt"] == "query: " and parts["passage"]["prompt"] == "passage: "
    assert parts["default"]["stack"] == [
        "Transformer(.)",
        "Pooling(mean)",
        "Dense(384->128, Tanh)",
        "Normalize",
    ]
    assert parts["chunked"]["long_text"] == "chunk" and "long_text" not in parts["default"]
    _, job = validate(tmp_path, shards, {"path": str(minilm_path)})
    plain = fingerprint_parts(load_job(job), minilm_path)  # as recorded before stacks were read
    assert not {"stack", "prompt", "long_text", "revision"} & set(plain)
