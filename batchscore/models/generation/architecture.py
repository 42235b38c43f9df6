"""Whether a model folder holds a text-generation model, and of which architecture: read from
its config (``architectures``, ``is_encoder_decoder``), never from a name. The generate task
reads it to pad prompts on the side the architecture needs; the task table and summarize read
it to tell an abstractive summarizer from an encoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchscore.errors import ModelError


def generative_kind(config: Any) -> str | None:
    """ "seq2seq", "decoder" or None (an encoder, a classifier, ...) for a transformers config."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    architectures = set(getattr(config, "architectures", None) or [])
    if architectures & set(MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.values()):
        return "seq2seq"
    if architectures & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
        return "seq2seq" if config.is_encoder_decoder else "decoder"
    if not architectures and config.is_encoder_decoder:
        return "seq2seq"
    return None


def is_generative(path: Path, trust_remote_code: bool = False) -> bool:
    """Whether ``path`` is a Hugging Face folder holding a text-generation model."""
    if not (path / "config.json").is_file():
        return False
    return generative_kind(read_config(path, trust_remote_code)) is not None


def read_config(path: Path, trust_remote_code: bool) -> Any:
    """A model folder's config; one that needs code the job did not allow is a model error."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelError(f"{path}: cannot read config.json: {exc}") from exc
