"""The modules that read a stack's tokens, each from its own folder's config (no weights): the
Transformer, which turns text into token states (``feature-extraction``) or, in a
SparseEncoder, into a masked-language model's logits (``fill-mask``), and the pooling that makes
one vector of them (Pooling in every mode, or SpladePooling's term weights). `batchscore.models.
stack` chains them with the head (Dense, Normalize) into a `Stack`; ``read_json`` is the one
reader of every JSON file of a model folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchscore.errors import ModelError

# Old flag keys -> mode, in the order sentence-transformers concatenates several of them.
LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
POOLING_MODES = tuple(LEGACY_POOLING.values())
# what each transformer_task reads from the model, as sentence-transformers' Transformer does
TASK_OUTPUTS = {"feature-extraction": "last_hidden_state", "fill-mask": "logits"}
SPLADE_STRATEGIES = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
TRANSFORMER_CONFIGS = [  # the names sentence-transformers has used for it, newest first
    f"sentence_{name}_config.json"
    for name in ("bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet")
]


@dataclass(frozen=True)
class Splade:
    """SpladePooling: ``log(1 + relu(logit))`` per token (``log1p_relu``: log1p once more),
    then the ``max`` (or ``sum``) over the text's tokens, for every word of the vocabulary."""

    strategy: str = "max"
    activation: str = "relu"


def read_json(path: Path) -> Any:
    """A JSON file, or a `ModelError` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot read it: {exc}") from exc


def transformer_config(folder: Path) -> dict[str, Any]:
    for name in TRANSFORMER_CONFIGS:
        if (folder / name).is_file():
            config = read_json(folder / name)
            return config if isinstance(config, dict) else {}
    return {}


def read_transformer(
    folder: Path, task: str = "feature-extraction", default: str = "feature-extraction"
) -> bool:
    """Check the Transformer module reads text as ``task`` needs (token states for pooling,
    or a masked-language model's logits for SPLADE); return its do_lower_case. ``default``:
    the task of a config that names none (an ``MLMTransformer``'s is "fill-mask")."""
    config = transformer_config(folder)
    found = config.get("transformer_task", default)
    modalities = config.get("modality_config") or {"text": {"method": "forward"}}
    text = modalities.get("text") or {}
    output = text.get("method_output_name", TASK_OUTPUTS[task])
    problem = None
    if found != task:
        problem = f'transformer_task "{found}" (batchscore reads "{task}" in this stack)'
    elif text.get("method") != "forward" or output != TASK_OUTPUTS[task]:
        problem = f"a text modality read from {text.get('method')}/{output}"
    elif config.get("module_output_name", "token_embeddings") != "token_embeddings":
        problem = f'module_output_name "{config["module_output_name"]}"'
    elif config.get("processing_kwargs"):
        problem = f"processing_kwargs {sorted(config['processing_kwargs'])}"
    if problem:
        raise ModelError(
            f"{folder}: its Transformer module sets {problem}, which batchscore does not implement"
        )
    return bool(config.get("do_lower_case", False))


def read_splade(folder: Path) -> Splade:
    """SpladePooling's strategy and activation (its config.json, either version's keys)."""
    file = folder / "config.json"
    config = read_json(file) if file.is_file() else {}
    splade = Splade(
        str(config.get("pooling_strategy", "max")), str(config.get("activation_function", "relu"))
    )
    if splade.strategy not in SPLADE_STRATEGIES or splade.activation not in SPLADE_ACTIVATIONS:
        raise ModelError(
            f"{file}: SpladePooling({splade.strategy}, {splade.activation}) is not one "
            f"batchscore implements (pooling {', '.join(SPLADE_STRATEGIES)}; activation "
            f"{', '.join(SPLADE_ACTIVATIONS)})"
        )
    return splade


def read_pooling(folder: Path) -> tuple[tuple[str, ...], bool]:
    """The pooling modes (either config format) and whether the prompt is pooled too."""
    config = read_json(folder / "config.json")
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    else:
        modes = tuple(m for key, m in LEGACY_POOLING.items() if config.get(key)) or ("mean",)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown or not modes:
        raise ModelError(
            f"{folder}/config.json: pooling mode {unknown or modes} is not one of "
            f"{', '.join(POOLING_MODES)}"
        )
    return modes, bool(config.get("include_prompt", True))
