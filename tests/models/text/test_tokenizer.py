"""The native tokenizer load gives the token ids transformers' AutoTokenizer gives, or stands aside.

transformers 5 rebuilds a BERT tokenizer from tokenizer_config.json rather than reading
tokenizer.json as it stands, so the native load must agree with that rebuild, and refuse any
folder where the two could differ.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from batchscore.models.text import tokenizer
from batchscore.models.text.text import TextEncoder
from batchscore.models.text.tokenizer import native, through_transformers

FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
         "config.json")  # fmt: skip


@pytest.fixture(scope="module")
def texts(corpus) -> list[str]:
    """300 corpus texts spread over the corpus: short ones, and long ones that truncate."""
    return corpus.column("text").to_pylist()[:: corpus.num_rows // 300][:300]


def auto_ids(path: Path, texts: list[str], pairs: list[str] | None = None) -> list[list[int]]:
    """What the textbook recipe feeds a model: AutoTokenizer, truncated at 256 tokens."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(path)
    return hf(texts, pairs, truncation=True, max_length=256)["input_ids"]


def through(path: Path, monkeypatch: pytest.MonkeyPatch) -> TextEncoder:
    """A TextEncoder made the way it was before the native load: through transformers."""
    with monkeypatch.context() as patch:
        patch.setattr(tokenizer, "native", lambda path: None)
        return TextEncoder(path, 256, False)


def test_minilm_loads_natively_with_transformers_facts(minilm_path, monkeypatch):
    loaded = native(minilm_path)
    assert loaded is not None and loaded.hf is None
    hf = through_transformers(minilm_path, False)
    assert json.loads(loaded.backend.to_str()) == json.loads(hf.backend.to_str())
    assert (loaded.model_max_length, loaded.pad_token_id, loaded.types, loaded.positions) == (
        hf.model_max_length, hf.pad_token_id, hf.types, hf.positions)  # fmt: skip
    ours, theirs = TextEncoder(minilm_path, None, False), through(minilm_path, monkeypatch)
    assert (ours.max_length, ours.pad_id, ours.types) == (theirs.max_length, theirs.pad_id,
                                                          theirs.types)  # fmt: skip


def test_minilm_ids_equal_autotokenizer(minilm_path, texts, monkeypatch):
    encoder = TextEncoder(minilm_path, 256, False)
    ids, truncated = encoder.encode(texts)
    assert truncated > 0  # long texts, truncated, are in the sample
    assert [i.tolist() for i in ids] == auto_ids(minilm_path, texts)
    before, _ = through(minilm_path, monkeypatch).encode(texts)
    assert [i.tolist() for i in ids] == [i.tolist() for i in before]


def test_minilm_pair_ids_equal_autotokenizer(minilm_path, texts):
    firsts, seconds = texts[::2], texts[1::2]
    tokens = TextEncoder(minilm_path, 256, False).pairs(firsts, seconds)
    assert [i.tolist() for i in tokens.ids] == auto_ids(minilm_path, firsts, seconds)
    assert {1} <= {int(t.max()) for t in tokens.type_ids}


def test_minilm_windows_and_lowercase_equal_the_transformers_path(minilm_path, texts, monkeypatch):
    """The parts TextEncoder builds on top (windows, a stack's lowercasing) see the same base."""
    ours = TextEncoder(minilm_path, 128, False, lowercase=True)
    with monkeypatch.context() as patch:
        patch.setattr(tokenizer, "native", lambda path: None)
        theirs = TextEncoder(minilm_path, 128, False, lowercase=True)
    a, b = ours.tokens(texts, chunk=True), theirs.tokens(texts, chunk=True)
    assert a.windows > 0 and [i.tolist() for i in a.ids] == [i.tolist() for i in b.ids]


def copy_minilm(folder: Path, minilm_path: Path) -> Path:
    folder.mkdir(exist_ok=True)
    for name in FILES:
        shutil.copy(minilm_path / name, folder / name)
    return folder


def edit(file: Path, **changes: object) -> None:
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


def test_a_folder_saved_by_transformers_5_loads_natively(tmp_path, minilm_path, texts):
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(minilm_path).save_pretrained(tmp_path)
    shutil.copy(minilm_path / "config.json", tmp_path / "config.json")
    assert native(tmp_path) is not None
    ids, _ = TextEncoder(tmp_path, 256, False).encode(texts)
    assert [i.tolist() for i in ids] == auto_ids(tmp_path, texts)


@pytest.mark.parametrize(
    ("file", "changes"),
    [
        ("tokenizer_config.json", {"do_lower_case": False}),  # transformers rebuilds: cased
        ("tokenizer_config.json", {"strip_accents": True}),
        ("tokenizer_config.json", {"tokenizer_class": "DistilBertTokenizer"}),
        ("tokenizer_config.json", {"some_new_option": 1}),
        ("special_tokens_map.json", {"cls_token": "[MASK]"}),
        ("config.json", {"model_type": "distilbert"}),
    ],
)
def test_folders_it_cannot_prove_load_through_transformers(
    tmp_path, minilm_path, texts, file, changes
):
    folder = copy_minilm(tmp_path / "model", minilm_path)
    edit(folder / file, **changes)
    assert native(folder) is None
    encoder = TextEncoder(folder, 256, False)
    assert encoder.loaded.hf is not None
    ids, _ = encoder.encode(texts[:50])
    assert [i.tolist() for i in ids] == auto_ids(folder, texts[:50])


def test_a_token_special_tokens_map_overrides_is_read_as_transformers_reads_it(
    tmp_path, minilm_path, texts
):
    """Without added_tokens_decoder, special_tokens_map.json wins over tokenizer_config.json."""
    folder = copy_minilm(tmp_path / "model", minilm_path)
    edit(folder / "tokenizer_config.json", cls_token="[MASK]")
    assert native(folder) is not None
    ids, _ = TextEncoder(folder, 256, False).encode(texts[:50])
    assert [i.tolist() for i in ids] == auto_ids(folder, texts[:50])


def test_an_added_token_transformers_would_add_differently_is_refused(tmp_path, minilm_path):
    folder = copy_minilm(tmp_path / "model", minilm_path)
    edit(folder / "tokenizer_config.json", added_tokens_decoder={
        "0": {"content": "[PAD]", "lstrip": True, "rstrip": False, "normalized": False,
              "single_word": False, "special": True}})  # fmt: skip
    assert native(folder) is None


def test_hf_is_loaded_on_demand(minilm_path):
    encoder = TextEncoder(minilm_path, 256, False)
    assert encoder.loaded.hf is None
    assert encoder.hf.pad_token_id == encoder.pad_id  # generation asks for it: loaded then
