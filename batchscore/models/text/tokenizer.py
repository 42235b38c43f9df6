"""A model folder's tokenizer, and what batchscore reads beside it, without importing transformers
where the folder allows.

Importing transformers costs seconds of start-up; reading ``tokenizer.json`` with `tokenizers`
costs milliseconds. But transformers 5 does not load a BERT folder's ``tokenizer.json`` as it
stands: its ``BertTokenizer`` keeps the vocabulary and rebuilds the normalizer, pre-tokenizer,
post-processor and added tokens from ``tokenizer_config.json``. So `native` loads the file only
when it can prove the two agree: every part transformers rebuilds is compared with the file's,
and any key, class or file it does not know sends the folder through transformers instead
(`through_transformers`), which every folder can take.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from batchscore.errors import ModelError

log = logging.getLogger("batchscore")
BERT_CLASSES = ("BertTokenizer", "BertTokenizerFast")
BERT_INPUTS = ["input_ids", "token_type_ids", "attention_mask"]  # BertTokenizer.model_input_names
# BertTokenizer's special tokens when neither tokenizer_config.json nor special_tokens_map.json
# names them
BERT_SPECIALS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}
SPECIAL_KEYS = ("bos_token", "eos_token", *BERT_SPECIALS)
# tokenizer_config.json keys whose effect on token ids is known: none beyond what `expected`
# rebuilds (the rest steer transformers' own padding, truncation or decoding, not used here)
KNOWN_KEYS = {
    "tokenizer_class",
    "do_lower_case",
    "tokenize_chinese_chars",
    "strip_accents",
    "do_basic_tokenize",
    "never_split",
    "model_max_length",
    "name_or_path",
    "added_tokens_decoder",
    "special_tokens_map_file",
    "clean_up_tokenization_spaces",
    "model_input_names",
    "padding_side",
    "truncation_side",
    "max_length",
    "stride",
    "pad_to_multiple_of",
    "pad_token_type_id",
    "truncation_strategy",
    "split_special_tokens",
    "backend",
    "extra_special_tokens",
    "additional_special_tokens",
    "is_local",
    "local_files_only",
    *SPECIAL_KEYS,
}
TOKEN_FLAGS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


@dataclass
class LoadedTokenizer:
    """A fast tokenizer and the facts about its folder that `TextEncoder` reads."""

    backend: Tokenizer  # a private copy: truncation set on it never reaches anyone else's
    model_max_length: int | None  # the tokenizer's own input limit, if it states one
    pad_token_id: int | None
    types: bool  # whether the model reads token_type_ids
    positions: int | None  # the model's max_position_embeddings
    hf: Any = None  # the transformers tokenizer, when it was loaded through transformers


def load_tokenizer(path: Path, trust_remote_code: bool) -> LoadedTokenizer:
    """The folder's tokenizer: straight from its files when `native` can, else via transformers."""
    loaded = native(path)
    return loaded if loaded is not None else through_transformers(path, trust_remote_code)


def through_transformers(path: Path, trust_remote_code: bool) -> LoadedTokenizer:
    """``AutoTokenizer`` and ``AutoConfig``: any folder transformers reads."""
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
    return LoadedTokenizer(
        backend=Tokenizer.from_str(backend.to_str()),
        model_max_length=hf.model_max_length,
        pad_token_id=hf.pad_token_id,
        types="token_type_ids" in hf.model_input_names,
        positions=getattr(config, "max_position_embeddings", None),
        hf=hf,
    )


def read_text(file: Path) -> str:
    """The file's text; empty when it is missing or unreadable (then transformers reads it)."""
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return ""


def parse(text: str) -> dict | None:
    """A JSON object, or None for anything else."""
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def read_json(file: Path) -> dict | None:
    return parse(read_text(file))


def native(path: Path) -> LoadedTokenizer | None:
    """A BERT folder's ``tokenizer.json`` as transformers 5 would rebuild it; None (saying why
    in the debug log) when that is not certain."""
    text = read_text(path / "tokenizer.json")
    file = parse(text)
    settings, config = read_json(path / "tokenizer_config.json"), read_json(path / "config.json")
    if not (file and settings and config):
        why = "it lacks tokenizer.json, tokenizer_config.json or config.json"
    else:
        why = refusal(path, settings, config) or disagreement(file, settings, path)
    if why:
        log.debug("%s: tokenizer loaded through transformers: %s", path, why)
        return None
    backend = Tokenizer.from_str(text)
    pad = str(token_content(specials(settings, path)["pad_token"]))
    return LoadedTokenizer(
        backend=backend,
        model_max_length=settings.get("model_max_length"),
        pad_token_id=backend.token_to_id(pad),
        types="token_type_ids" in settings.get("model_input_names", BERT_INPUTS),
        positions=config.get("max_position_embeddings", 512),  # BertConfig's default
    )


def refusal(path: Path, settings: dict, config: dict) -> str | None:
    """Why the folder's files are not ones `native` knows; None if they are."""
    unknown = sorted(set(settings) - KNOWN_KEYS)
    checks = {
        f"tokenizer_class {settings.get('tokenizer_class')!r}": (
            settings.get("tokenizer_class") not in BERT_CLASSES
        ),
        "model_type is not bert": config.get("model_type") != "bert",
        "its code is the folder's own (auto_map)": "auto_map" in settings or "auto_map" in config,
        f"tokenizer_config.json keys {unknown}": bool(unknown),
        "extra special tokens": bool(
            settings.get("extra_special_tokens") or settings.get("additional_special_tokens")
        ),
        "split_special_tokens": bool(settings.get("split_special_tokens")),
        "an added_tokens.json": (path / "added_tokens.json").exists(),
    }
    return next((why for why, refused in checks.items() if refused), None)


def token_content(value: Any) -> Any:
    """A special token's text, whether the file gives it as a string or as an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def specials(settings: dict, path: Path) -> dict[str, Any]:
    """The named special tokens as transformers resolves them: special_tokens_map.json over
    tokenizer_config.json (only when the latter has no added_tokens_decoder), over defaults."""
    named = {**BERT_SPECIALS, **{k: settings[k] for k in SPECIAL_KEYS if k in settings}}
    if "added_tokens_decoder" not in settings:
        named |= {
            k: v
            for k, v in (read_json(path / "special_tokens_map.json") or {}).items()
            if k in SPECIAL_KEYS
        }
    return named


def expected(settings: dict, named: dict[str, Any], ids: dict[str, int]) -> dict:
    """The parts of tokenizer.json transformers' ``BertTokenizer`` rebuilds, as it rebuilds them."""
    unk, cls, sep = (str(token_content(named[k])) for k in ("unk_token", "cls_token", "sep_token"))
    tokenizer = Tokenizer(WordPiece({unk: 0}, unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=settings.get("tokenize_chinese_chars", True),
        strip_accents=settings.get("strip_accents"),
        lowercase=settings.get("do_lower_case", True),
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, ids[cls]), (sep, ids[sep])],
    )
    return json.loads(tokenizer.to_str())


def disagreement(file: dict, settings: dict, path: Path) -> str | None:
    """Where the file differs from what transformers builds from the folder; None if nowhere."""
    model = file.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") != "WordPiece" or not isinstance(vocab, dict):
        return "not a WordPiece vocabulary"
    named = specials(settings, path)
    contents = {str(token_content(v)) for v in named.values() if v is not None}
    if not contents <= set(vocab):
        return "a special token outside the vocabulary"
    build = expected(settings, named, vocab)
    for part in ("normalizer", "pre_tokenizer", "post_processor"):
        if file.get(part) != build[part]:
            return f"its {part} is not the one tokenizer_config.json makes"
    if {**model, "vocab": None} != {**build["model"], "vocab": None}:
        return "its WordPiece settings are not transformers' defaults"
    added = {int(t["id"]): {f: t.get(f) for f in TOKEN_FLAGS} for t in file.get("added_tokens", [])}
    source = settings.get("added_tokens_decoder")
    if source is not None and added != {
        int(i): {f: t.get(f) for f in TOKEN_FLAGS} for i, t in source.items()
    }:
        return "its added tokens are not tokenizer_config.json's"
    if any(not t["special"] or vocab.get(t["content"]) != i for i, t in added.items()):
        return "an added token that is not a special token of the vocabulary"
    if not contents <= {t["content"] for t in added.values()}:
        return "a special token transformers would add"
    return None
