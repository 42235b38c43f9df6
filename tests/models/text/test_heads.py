"""A long text is cut before the tokenizer (`heads.Cutter`), and the tokens kept are exactly
the whole text's: for MiniLM's WordPiece, GPT-2's byte-level BPE (cut from either end) and
CLIP's BPE, over texts of words, runs of spaces, punctuation, CJK and emoji; a tokenizer whose
input a cut could change is never cut."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import WordLevel

from batchscore.models.text.heads import Cutter
from batchscore.models.text.text import TextEncoder

ROOT = Path(__file__).resolve().parents[3]
PIECES = st.sampled_from(
    ["the", "Word", "naïve", "漢字", "🙂", "x" * 150, ",", "--", "1234", "don't", "\u200b"]
)
SPACES = st.sampled_from([" ", " ", " ", "  ", "\n", "\t ", " \u3000 "])
WORDS = st.lists(st.tuples(PIECES, SPACES), min_size=1, max_size=40).map(
    lambda pairs: "".join(p + s for p, s in pairs)
)


@pytest.fixture(scope="module")
def encoders(minilm_path: Path) -> dict[str, TextEncoder]:
    """Real tokenizers, each at a short window so that a cut happens at a few thousand
    characters: right truncation for all, left for GPT-2 (a decoder's prompt)."""
    return {
        "minilm": TextEncoder(minilm_path, 32, False),
        "gpt2": TextEncoder(ROOT / "models/toy-gpt2", 32, False),
        "gpt2-left": TextEncoder(ROOT / "models/toy-gpt2", 32, False, truncate_left=True),
        "clip": TextEncoder(ROOT / "models/tiny-clip", 32, False),
    }


def whole(encoder: TextEncoder, texts: list[str]) -> tuple[list[list[int]], int]:
    """The tokens the tokenizer keeps of each text read whole, and how many were cut."""
    encodings = encoder.tokenizer.encode_batch(texts)
    return [e.ids for e in encodings], sum(1 for e in encodings if e.overflowing)


@settings(max_examples=60, deadline=None)
@given(words=WORDS, repeat=st.integers(1, 400), name=st.sampled_from(["minilm", "gpt2",
       "gpt2-left", "clip"]), tail=WORDS)  # fmt: skip
def test_a_cut_text_keeps_the_whole_texts_tokens(encoders, words, repeat, name, tail):
    encoder = encoders[name]
    assert encoder.cutter is not None
    text = words * repeat + tail
    ids, truncated = encoder.encode([text, tail])
    expected, cut = whole(encoder, [text, tail])
    assert [i.tolist() for i in ids] == expected
    assert truncated == cut


def test_a_huge_text_is_tokenized_as_far_as_it_is_kept(encoders):
    """2 MB of text: the tokenizer reads a few thousand characters of it, not 2 MB (4.4 s
    read whole by MiniLM's tokenizer on one core), and keeps the same tokens."""
    encoder = encoders["minilm"]
    huge = ("word " * 400_001)[:2_000_000]
    assert len(encoder.cutter.cut(huge)) <= encoder.cutter.span
    start = time.perf_counter()
    ids, truncated = encoder.encode([huge])
    assert time.perf_counter() - start < 0.5
    assert truncated == 1 and ids[0].tolist() == whole(encoder, [huge[:10_000]])[0][0]


def test_text_with_nowhere_to_cut_is_read_whole(encoders):
    """No space in the part kept (one long word, base64), or a cut text that does not fill
    the window (words the tokenizer reads as one unknown token each): read whole."""
    encoder = encoders["minilm"]
    blob = "QUJD" * 5000
    assert encoder.cutter.cut(blob) is blob
    unknown = ("x" * 150 + " ") * 200  # 150 letters: one [UNK] each, 200 of them
    ids, truncated = encoder.encode([unknown])
    assert ids[0].tolist() == whole(encoder, [unknown])[0][0] and truncated == 1


def word_level(**parts) -> Tokenizer:
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    for name, value in parts.items():
        setattr(tokenizer, name, value)
    return tokenizer


@pytest.mark.parametrize(
    ("parts", "left", "cut"),
    [
        ({}, False, False),  # no pre-tokenizer: the model reads the text as one piece
        ({"pre_tokenizer": pre_tokenizers.Whitespace()}, False, True),
        ({"pre_tokenizer": pre_tokenizers.Punctuation()}, False, False),  # not at spaces
        (
            {
                "pre_tokenizer": pre_tokenizers.Whitespace(),
                "normalizer": normalizers.Replace(Regex("a.*b"), "x"),  # reaches anywhere
            },
            False,
            False,
        ),
        (
            {
                "pre_tokenizer": pre_tokenizers.Whitespace(),
                "normalizer": normalizers.Replace("a b", "x"),  # across a space
            },
            False,
            False,
        ),
        (
            {
                "pre_tokenizer": pre_tokenizers.Whitespace(),
                "normalizer": normalizers.Sequence([normalizers.NFKC(), normalizers.Strip()]),
            },
            True,  # a tail would lose its leading space to Strip
            False,
        ),
    ],
)
def test_a_tokenizer_a_cut_could_change_is_never_cut(parts, left, cut):
    assert (Cutter.of(word_level(**parts), max_length=8, left=left) is not None) == cut
