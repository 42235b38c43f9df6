"""A sentence-transformers folder's module stack, read from its JSON files alone (no weights).

``modules.json`` lists the modules a model's author chained, in order; each module's folder holds
its config. batchscore implements the stack sentence embeddings are made of (Transformer, Pooling
in every mode, Dense, Normalize) and the prompts of ``config_sentence_transformers.json``. Any
other module is refused by name, never skipped: skipping one would write confident-looking
vectors that are not the model's. Both layouts are read: the hub's (``sentence_transformers.
models.Pooling``, ``pooling_mode_*_tokens`` flags, a ``0_Transformer`` subfolder) and the one
sentence-transformers 6 writes (new class paths, ``pooling_mode = "mean"``).

A plain Hugging Face folder (no ``modules.json``) is read as Transformer then mean pooling.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
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
# Activations a Dense layer may name: torch.nn modules that take no arguments and hold no
# weights, built by name here rather than imported from whatever path a config names.
ACTIVATIONS = {
    "Identity", "Tanh", "ReLU", "GELU", "Sigmoid", "SiLU", "ELU", "LeakyReLU", "Softplus",
    "Softsign", "Mish", "SELU", "CELU", "ReLU6", "Hardtanh", "Tanhshrink",
}  # fmt: skip
KINDS = ("Transformer", "Pooling", "Dense", "Normalize")
TRANSFORMER_CONFIGS = [  # the names sentence-transformers has used for it, newest first
    f"sentence_{name}_config.json"
    for name in ("bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet")
]
EMBEDDING = "sentence_embedding"


@dataclass(frozen=True)
class Dense:
    """A Dense module: ``activation(linear(x))`` (``+ x``, or a projection of it, with residual)."""

    folder: Path
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "Tanh"
    residual: bool = False


@dataclass(frozen=True)
class Stack:
    """What turns a text into the model's sentence embedding.

    ``head`` holds the modules after pooling in order: a `Dense`, or the string "normalize".
    """

    encoder: Path  # the Hugging Face model and tokenizer folder (the Transformer module's)
    modes: tuple[str, ...] = ("mean",)  # pooling modes, concatenated in this order
    include_prompt: bool = True  # False: prompt tokens are left out of the pooling
    head: tuple[Dense | str, ...] = ()
    lowercase: bool = False  # the Transformer's do_lower_case: texts are lowercased first
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt: str | None = None
    source: Path | None = None  # the model folder, for messages

    @property
    def normalize(self) -> bool:
        """Whether the stack ends by L2-normalising (applied after a long text's windows meet)."""
        return bool(self.head) and self.head[-1] == "normalize"

    @property
    def body(self) -> tuple[Dense | str, ...]:
        """The head up to its final Normalize: what runs on each window of a long text."""
        return self.head[:-1] if self.normalize else self.head

    @property
    def plain(self) -> bool:
        """A stack batchscore read the same way before it read whole stacks: one pooling mode,
        no Dense, the Transformer in the folder's root, texts as they are."""
        return (
            len(self.modes) == 1
            and self.modes[0] in ("cls", "max", "mean", "mean_sqrt_len_tokens", "lasttoken")
            and self.include_prompt
            and all(step == "normalize" for step in self.head)
            and not self.lowercase
            and self.encoder == self.source
        )

    def prompt(self, name: str | None) -> str:
        """The text put before every input: the named prompt, else the model's default one."""
        if name is None:
            return self.prompts.get(self.default_prompt, "") if self.default_prompt else ""
        if name not in self.prompts:
            known = ", ".join(f'"{p}"' for p in self.prompts) or "none"
            raise ModelError(
                f'[embed].prompt_name: "{name}" is not a prompt of {self.source} (its '
                f"config_sentence_transformers.json defines: {known})"
            )
        return self.prompts[name]

    def describe(self) -> list[str]:
        """The stack in words, one module each (for the fingerprint and messages)."""
        words = [
            f"Transformer({self.encoder.name if self.encoder != self.source else '.'}"
            f"{', lowercase' if self.lowercase else ''})"
        ]
        prompt = "" if self.include_prompt else ", prompt excluded"
        words.append(f"Pooling({'+'.join(self.modes)}{prompt})")
        for step in self.head:
            if isinstance(step, Dense):
                extra = ", residual" if step.residual else ""
                extra += "" if step.bias else ", no bias"
                words.append(
                    f"Dense({step.in_features}->{step.out_features}, {step.activation}{extra})"
                )
            else:
                words.append("Normalize")
        return words


def read_json(path: Path) -> Any:
    """A JSON file, or a `ModelError` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot read it: {exc}") from exc


def read_stack(path: Path) -> Stack:
    """The stack of the model folder ``path``; a `ModelError` names any module it cannot run."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return Stack(encoder=path, source=path)
    modules = read_json(modules_file)
    if not isinstance(modules, list) or not modules:
        raise ModelError(f"{modules_file}: expected a list of modules")
    kinds = [module_kind(modules_file, m) for m in modules]
    if (
        kinds[:2] != ["Transformer", "Pooling"]
        or "Transformer" in kinds[2:]
        or ("Pooling" in kinds[2:])
    ):
        raise ModelError(
            f"{modules_file}: batchscore runs a Transformer, then Pooling, then Dense and "
            f"Normalize modules; this model chains {' -> '.join(kinds)}"
        )
    folders = [module_folder(path, modules_file, m) for m in modules]
    encoder, lowercase = folders[0], read_transformer(folders[0])
    modes, include_prompt = read_pooling(folders[1])
    head = tuple(
        read_dense(folder) if kind == "Dense" else read_normalize(folder)
        for kind, folder in zip(kinds[2:], folders[2:], strict=True)
    )
    prompts, default = read_prompts(path)
    return Stack(encoder, modes, include_prompt, head, lowercase, prompts, default, path)


def module_kind(modules_file: Path, module: Any) -> str:
    """Transformer, Pooling, Dense or Normalize, from a module's class path (either layout)."""
    kind = str(module.get("type", "")) if isinstance(module, dict) else ""
    name = kind.rsplit(".", 1)[-1]
    if kind.startswith("sentence_transformers.") and name in KINDS:
        return name
    index = module.get("idx", "?") if isinstance(module, dict) else "?"
    raise ModelError(
        f"{modules_file}: module {index} is {kind or 'of no type'}, which batchscore does not "
        f"implement (it runs {', '.join(KINDS)}); it would be wrong to skip it, so this model "
        "cannot be scored here"
    )


def module_folder(root: Path, modules_file: Path, module: dict[str, Any]) -> Path:
    """A module's folder, which must stay inside the model folder."""
    rel = PurePosixPath(str(module.get("path", "")))
    if rel.is_absolute() or ".." in rel.parts:
        raise ModelError(f"{modules_file}: module path {str(rel)!r} leaves the model folder")
    return root / rel


def transformer_config(folder: Path) -> dict[str, Any]:
    for name in TRANSFORMER_CONFIGS:
        if (folder / name).is_file():
            config = read_json(folder / name)
            return config if isinstance(config, dict) else {}
    return {}


def read_transformer(folder: Path) -> bool:
    """Check the Transformer module turns text into token states; return its do_lower_case."""
    config = transformer_config(folder)
    task = config.get("transformer_task", "feature-extraction")
    modalities = config.get("modality_config") or {"text": {"method": "forward"}}
    text = modalities.get("text") or {}
    output = text.get("method_output_name", "last_hidden_state")
    problem = None
    if task != "feature-extraction":
        problem = f'transformer_task "{task}" (batchscore embeds with "feature-extraction")'
    elif text.get("method") != "forward" or output != "last_hidden_state":
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


def read_dense(folder: Path) -> Dense:
    """A Dense module's shape, bias and activation (its weights load with the model)."""
    config = read_json(folder / "config.json")
    names = {config.get("module_input_name", EMBEDDING), config.get("module_output_name")}
    if names - {EMBEDDING, None}:
        raise ModelError(
            f"{folder}/config.json: a Dense module over {sorted(names - {None})}; "
            f"batchscore runs Dense on the {EMBEDDING} only"
        )
    activation = str(config.get("activation_function", "torch.nn.modules.activation.Tanh"))
    name = activation.rsplit(".", 1)[-1]
    if not activation.startswith("torch.nn.") or name not in ACTIVATIONS:
        raise ModelError(
            f"{folder}/config.json: activation_function {activation} is not one batchscore "
            f"implements ({', '.join(sorted(ACTIVATIONS))})"
        )
    try:
        return Dense(
            folder,
            int(config["in_features"]),
            int(config["out_features"]),
            bool(config.get("bias", True)),
            name,
            bool(config.get("use_residual")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"{folder}/config.json: not a Dense config ({exc})") from exc


def read_normalize(folder: Path) -> str:
    config = read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    if config.get("module_input_name", EMBEDDING) != EMBEDDING:
        raise ModelError(
            f"{folder}/config.json: Normalize over {config['module_input_name']}; "
            f"batchscore normalizes the {EMBEDDING} only"
        )
    return "normalize"


def read_prompts(path: Path) -> tuple[dict[str, str], str | None]:
    """The model's prompts and the name of the one ``encode`` uses when none is asked for."""
    file = path / "config_sentence_transformers.json"
    config = read_json(file) if file.is_file() else {}
    kind = config.get("model_type", "SentenceTransformer")
    if kind != "SentenceTransformer":
        raise ModelError(
            f"{file}: a {kind} model, not a SentenceTransformer; batchscore embeds "
            "with SentenceTransformer stacks"
        )
    prompts = {str(k): str(v or "") for k, v in (config.get("prompts") or {}).items()}
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ModelError(f'{file}: default_prompt_name "{default}" is not one of its prompts')
    return prompts, default
