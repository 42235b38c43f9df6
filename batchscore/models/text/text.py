"""Text in, token ids out: the fast tokenizer in large calls, and padding of one batch at a time.

Token ids live as one numpy array per unit (row, sentence, or a long text's window), so the
sampler sees lengths and a batch is padded only to its own longest unit, never to the window's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, normalizers

from batchscore.errors import ModelError
from batchscore.models.text.heads import Cutter
from batchscore.models.text.template import Template, learn
from batchscore.models.text.tokenizer import load_tokenizer, through_transformers
from batchscore.models.text.windows import cut, overlap
from batchscore.work.units import Encoded


def default_max_length(path: Path, tokenizer_limit: int | None, positions: int | None) -> int:
    """The input length the model was trained for: its sentence-transformers limit, else its own."""
    st_config = path / "sentence_bert_config.json"
    if st_config.is_file():
        limit = json.loads(st_config.read_text()).get("max_seq_length")
        if limit:
            return int(limit)
    limits = [n for n in (tokenizer_limit, positions) if n and n < 1_000_000]
    return min(limits) if limits else 512


@dataclass
class Tokens:
    """Token ids of some texts as units: one per text, or a long text's windows."""

    ids: list[np.ndarray]
    owners: np.ndarray  # unit -> text
    truncated: int = 0
    chunked: int = 0  # texts cut into windows
    windows: int = 0  # the windows of those texts
    type_ids: list[np.ndarray] | None = None  # a pair's segments (for models that read them)
    errors: dict[int, str] = field(default_factory=dict)  # text -> why it has no units

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter(map(len, self.ids), dtype=np.int64, count=len(self.ids))

    def encoded(self, rows: np.ndarray, errors: dict[int, str]) -> Encoded:
        """An `Encoded` window for texts that came from ``rows``; texts that failed here join
        ``errors`` (window row -> message)."""
        owners = self.owners
        if self.errors:
            keep = np.ones(len(rows), dtype=bool)
            keep[list(self.errors)] = False
            errors = {**errors, **{int(rows[t]): m for t, m in self.errors.items()}}
            owners, rows = (np.cumsum(keep) - 1)[owners], rows[keep]
        return Encoded(
            self.lengths,
            owners,
            rows,
            errors,
            self.ids,
            self.truncated,
            type_ids=self.type_ids,
            chunked=self.chunked,
            windows=self.windows,
        )


class TextEncoder:
    """Wraps a model folder's fast tokenizer with truncation fixed at `max_length`.

    ``reserve`` tokens of the model's positions are kept free (for tokens a decoder generates
    after the prompt) when the length comes from the model; ``truncate_left`` drops the start of a
    long text rather than its end, which a decoder-only prompt needs: its end is what it continues.
    ``lowercase`` lowercases texts first (a sentence-transformers ``do_lower_case``).
    """

    def __init__(
        self,
        path: Path,
        max_length: int | None,
        trust_remote_code: bool,
        reserve: int = 0,
        truncate_left: bool = False,
        *,
        lowercase: bool = False,
    ) -> None:
        loaded = load_tokenizer(path, trust_remote_code)
        positions = loaded.positions
        # the model's own input length: the tokens a prompt and what is generated after it share
        self.window = default_max_length(path, loaded.model_max_length, positions)
        self.max_length = max_length or self.window - reserve
        if self.max_length < 1 or (positions and self.max_length + reserve > positions):
            raise ModelError(
                f"{path}: the model has {positions} positions, too few for prompts of "
                f"{self.max_length} tokens plus {reserve} to generate; lower [model].max_length"
            )
        base = loaded.backend  # already a private copy: truncation set here stays here
        if lowercase:  # lowercasing twice changes nothing, so any normalizer of its own stays
            own = [base.normalizer] if base.normalizer is not None else []
            base.normalizer = normalizers.Sequence([normalizers.Lowercase(), *own])
        base.no_padding()
        base.no_truncation()
        self.whole = base  # no truncation: texts whole, for windows
        self.tokenizer = Tokenizer.from_str(base.to_str())
        direction = "left" if truncate_left else "right"
        self.tokenizer.enable_truncation(self.max_length, direction=direction)
        # a long text is cut first where that keeps the same tokens (`heads`)
        self.cutter = Cutter.of(self.tokenizer, max_length=self.max_length, left=truncate_left)
        self.pad_id = loaded.pad_token_id if loaded.pad_token_id is not None else 0
        self.types = loaded.types  # whether the model reads token_type_ids
        self.trust_remote_code = trust_remote_code
        self.loaded = loaded
        self.path = path

    @property
    def hf(self) -> Any:
        """The transformers tokenizer (decoding, generation settings), loaded on first use when
        the tokenizer itself came straight from the folder's files."""
        if self.loaded.hf is None:
            self.loaded.hf = through_transformers(self.path, self.trust_remote_code).hf
        return self.loaded.hf

    def encode(
        self, texts: list[str], *, add_special_tokens: bool = True
    ) -> tuple[list[np.ndarray], int]:
        """Token ids of every text and how many were truncated, in one tokenizer call (two
        when a long text, cut first, did not overflow the window: it is read whole then)."""
        cut = texts if self.cutter is None else [self.cutter.cut(t) for t in texts]
        # parallel in Rust, GIL released
        encodings = self.tokenizer.encode_batch(cut, add_special_tokens=add_special_tokens)
        short = [i for i, e in enumerate(encodings) if cut[i] is not texts[i] and not e.overflowing]
        if short:
            whole = [texts[i] for i in short]
            again = self.tokenizer.encode_batch(whole, add_special_tokens=add_special_tokens)
            for i, encoding in zip(short, again, strict=True):
                encodings[i] = encoding
        ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
        return ids, sum(1 for e in encodings if e.overflowing)

    def encode_rows(self, texts: list[str], rows: np.ndarray, errors: dict[int, str]) -> Encoded:
        """An `Encoded` window with one unit per text."""
        return self.tokens(texts).encoded(rows, errors)

    def tokens(self, texts: list[str], *, chunk: bool = False, head: int = 0) -> Tokens:
        """One unit per text, truncated; or with ``chunk``, a long text's windows, each led by
        its first ``head`` tokens (a prompt)."""
        if not chunk:
            ids, truncated = self.encode(texts)
            return Tokens(ids, np.arange(len(ids)), truncated)
        size, step = self.max_length - self.single.specials, overlap(self.max_length)
        out = Tokens([], np.empty(0, dtype=np.int64))
        owners = []
        for text, encoding in enumerate(self.whole.encode_batch(texts, add_special_tokens=False)):
            parts = cut(np.asarray(encoding.ids, np.int64), size=size, overlap=step, head=head)
            out.ids += [self.single.wrap(part) for part in parts]
            owners += [text] * len(parts)
            if len(parts) > 1:
                out.chunked, out.windows = out.chunked + 1, out.windows + len(parts)
        out.owners = np.asarray(owners, dtype=np.int64)
        return out

    def pairs(self, firsts: list[str], seconds: list[str], *, chunk: bool = False) -> Tokens:
        """One unit per (text, pair), the pair truncated longest first as transformers does; or
        with ``chunk``, the pair whole: windows of the second text, each after the whole first."""
        if not chunk:
            encodings = self.tokenizer.encode_batch(list(zip(firsts, seconds, strict=True)))
            ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
            types = [np.asarray(e.type_ids, dtype=np.int64) for e in encodings]
            truncated = sum(1 for e in encodings if e.overflowing)
            return Tokens(ids, np.arange(len(ids)), truncated, type_ids=types)
        template, step = self.pair, overlap(self.max_length)
        out = Tokens([], np.empty(0, dtype=np.int64), type_ids=[])
        owners = []
        a_all = self.whole.encode_batch(firsts, add_special_tokens=False)
        b_all = self.whole.encode_batch(seconds, add_special_tokens=False)
        for text, (a, b) in enumerate(zip(a_all, b_all, strict=True)):
            first, second = np.asarray(a.ids, np.int64), np.asarray(b.ids, np.int64)
            room = self.max_length - template.specials - len(first)
            if len(second) > room and room <= step:
                out.errors[text] = (
                    f"the first text of the pair takes {len(first)} of the model's "
                    f"{self.max_length} tokens, too many to read the second in windows"
                )
                continue
            parts = cut(second, size=room, overlap=step)
            out.ids += [template.wrap(first, part) for part in parts]
            out.type_ids += [template.wrap_types(len(first), len(part)) for part in parts]
            owners += [text] * len(parts)
            if len(parts) > 1:
                out.chunked, out.windows = out.chunked + 1, out.windows + len(parts)
        out.owners = np.asarray(owners, dtype=np.int64)
        return out

    @cached_property
    def single(self) -> Template:
        return learn(self.whole, False, self.path)

    @cached_property
    def pair(self) -> Template:
        return learn(self.whole, True, self.path)

    def prompt_tokens(self, prompt: str) -> tuple[int, int]:
        """A prompt's length in tokens: without special tokens (what leads every window), and
        as sentence-transformers counts it (with those before it) to leave it out of pooling."""
        alone = self.tokenizer.encode(prompt)
        counted = len(alone.ids) - int(bool(alone.ids) and alone.special_tokens_mask[-1] == 1)
        return len(self.whole.encode(prompt, add_special_tokens=False).ids), counted

    def collate(self, ids: list[np.ndarray], left: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Pad a batch to its longest row: (input_ids, attention_mask), padded right or left."""
        lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
        width = int(lengths.max())
        positions = np.arange(width)
        mask = positions >= (width - lengths)[:, None] if left else positions < lengths[:, None]
        input_ids = np.full((len(ids), width), self.pad_id, dtype=np.int64)
        input_ids[mask] = np.concatenate(ids)
        return input_ids, mask.astype(np.int64)

    def collate_types(self, type_ids: list[np.ndarray], mask: np.ndarray) -> np.ndarray:
        """Token type ids padded like `collate`'s right-padded ``mask`` (padding: type 0)."""
        types = np.zeros(mask.shape, dtype=np.int64)
        types[mask.astype(bool)] = np.concatenate(type_ids)
        return types
