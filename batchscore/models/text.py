"""Text in, token ids out: the fast tokenizer in large calls, and padding of one batch at a time.

Token ids live as one numpy array per unit (row or sentence), so the sampler sees lengths and a
batch is padded only to its own longest row, never to the window's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from batchscore.errors import ModelError
from batchscore.models.base import Encoded


def default_max_length(path: Path, tokenizer_limit: int | None, positions: int | None) -> int:
    """The input length the model was trained for: its sentence-transformers limit, else its own."""
    st_config = path / "sentence_bert_config.json"
    if st_config.is_file():
        limit = json.loads(st_config.read_text()).get("max_seq_length")
        if limit:
            return int(limit)
    limits = [n for n in (tokenizer_limit, positions) if n and n < 1_000_000]
    return min(limits) if limits else 512


class TextEncoder:
    """Wraps a model folder's fast tokenizer with truncation fixed at `max_length`.

    ``reserve`` tokens of the model's positions are kept free (for tokens a decoder generates
    after the prompt) when the length comes from the model; ``truncate_left`` drops the start of a
    long text rather than its end, which a decoder-only prompt needs: its end is what it continues.
    """

    def __init__(
        self,
        path: Path,
        max_length: int | None,
        trust_remote_code: bool,
        reserve: int = 0,
        truncate_left: bool = False,
    ) -> None:
        from tokenizers import Tokenizer
        from transformers import AutoConfig, AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        except Exception as exc:  # any failure here means: this folder has no usable tokenizer
            raise ModelError(f"{path}: cannot load a tokenizer: {exc}") from exc
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise ModelError(f"{path}: batchscore needs a fast (tokenizers) tokenizer")
        try:
            config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        except Exception as exc:  # a config that needs remote code the job did not allow, say
            raise ModelError(f"{path}: cannot read the model config: {exc}") from exc
        positions = getattr(config, "max_position_embeddings", None)
        default = default_max_length(path, hf.model_max_length, positions) - reserve
        self.max_length = max_length or default
        if self.max_length < 1 or (positions and self.max_length + reserve > positions):
            raise ModelError(
                f"{path}: the model has {positions} positions, too few for prompts of "
                f"{self.max_length} tokens plus {reserve} to generate; lower [model].max_length"
            )
        # A private copy, so truncation settings never leak into the transformers tokenizer.
        self.tokenizer = Tokenizer.from_str(backend.to_str())
        self.tokenizer.no_padding()
        direction = "left" if truncate_left else "right"
        self.tokenizer.enable_truncation(self.max_length, direction=direction)
        self.pad_id = hf.pad_token_id if hf.pad_token_id is not None else 0
        self.hf = hf

    def encode(self, texts: list[str]) -> tuple[list[np.ndarray], int]:
        """Token ids of every text and how many were truncated, in one tokenizer call."""
        encodings = self.tokenizer.encode_batch(texts)  # parallel in Rust, GIL released
        ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
        return ids, sum(1 for e in encodings if e.overflowing)

    def encode_rows(self, texts: list[str], rows: np.ndarray, errors: dict[int, str]) -> Encoded:
        """An `Encoded` window with one unit per text."""
        ids, truncated = self.encode(texts)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        owners = np.arange(len(ids), dtype=np.int64)
        return Encoded(lengths, owners, rows, errors, ids, truncated)

    def collate(self, ids: list[np.ndarray], left: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Pad a batch to its longest row: (input_ids, attention_mask), padded right or left."""
        lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
        width = int(lengths.max())
        positions = np.arange(width)
        mask = positions >= (width - lengths)[:, None] if left else positions < lengths[:, None]
        input_ids = np.full((len(ids), width), self.pad_id, dtype=np.int64)
        input_ids[mask] = np.concatenate(ids)
        return input_ids, mask.astype(np.int64)
