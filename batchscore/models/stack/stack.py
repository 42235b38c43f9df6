"""A sentence-transformers folder's module stack, read from its JSON files alone (no weights).

``modules.json`` lists the modules a model's author chained, in order; each module's folder holds
its config. batchscore implements the stack sentence embeddings are made of (Transformer, Pooling
in every mode, Dense, Normalize) and the prompts of ``config_sentence_transformers.json``. Any
other module is refused by name, never skipped: skipping one would write confident-looking
vectors that are not the model's. Both layouts are read: the hub's (``sentence_transformers.
models.Pooling``, ``pooling_mode_*_tokens`` flags, a ``0_Transformer`` subfolder) and the one
sentence-transformers 6 writes (new class paths, ``pooling_mode = "mean"``).

A ``SparseEncoder`` folder is a masked-language model's Transformer (``transformer_task =
"fill-mask"``, or the older ``MLMTransformer``) then ``SpladePooling``: its vectors are term
weights over the vocabulary (`batchscore.models.sparse`).

A plain Hugging Face folder (no ``modules.json``) is read as Transformer then mean pooling.

Here: the `Stack`, the head it ends in (Dense, Normalize) and the model's own config; the
modules that read tokens (Transformer, Pooling, SpladePooling) are read in `stack_modules`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from batchscore.errors import ModelError
from batchscore.models.stack.stack_modules import (
    Splade,
    read_json,
    read_pooling,
    read_splade,
    read_transformer,
)

# Activations a Dense layer may name: torch.nn modules that take no arguments and hold no
# weights, built by name here rather than imported from whatever path a config names.
ACTIVATIONS = {
    "Identity", "Tanh", "ReLU", "GELU", "Sigmoid", "SiLU", "ELU", "LeakyReLU", "Softplus",
    "Softsign", "Mish", "SELU", "CELU", "ReLU6", "Hardtanh", "Tanhshrink",
}  # fmt: skip
KINDS = ("Transformer", "Pooling", "Dense", "Normalize", "SpladePooling")
SPARSE_KINDS = ("SpladePooling", "MLMTransformer")  # found under sparse_encoder.models/modules
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
    splade: Splade | None = None  # a SparseEncoder's pooling (then ``modes`` and ``head`` unused)
    truncate_dim: int | None = None  # a dense model's own cut (its config's, as encode applies)
    max_active_dims: int | None = None  # a sparse model's own limit on its non-zero weights

    @property
    def sparse(self) -> bool:
        """Whether the stack writes sparse term weights (SPLADE) rather than a dense vector."""
        return self.splade is not None

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
            not self.sparse
            and len(self.modes) == 1
            and self.modes[0] in ("cls", "max", "mean", "mean_sqrt_len_tokens", "lasttoken")
            and self.include_prompt
            and all(step == "normalize" for step in self.head)
            and not self.lowercase
            and self.encoder == self.source
        )

    def width(self) -> int | None:
        """The length of the stack's vectors before any cut, from configs alone (what
        `validate` checks a job against): the last Dense's outputs, else the Transformer's
        hidden size per pooling mode; a sparse encoder's vocabulary. None where no config says."""
        denses = [step for step in self.head if isinstance(step, Dense)]
        if denses and not self.sparse:
            return denses[-1].out_features
        file = self.encoder / "config.json"
        config = read_json(file) if file.is_file() else {}
        keys = ("vocab_size",) if self.sparse else ("hidden_size", "d_model", "dim", "n_embd")
        size = next((config[k] for k in keys if isinstance(config.get(k), int)), None)
        return None if size is None else size * (1 if self.sparse else len(self.modes))

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
            f"{', fill-mask' if self.sparse else ''}{', lowercase' if self.lowercase else ''})"
        ]
        if self.splade is not None:
            return [*words, f"SpladePooling({self.splade.strategy}, {self.splade.activation})"]
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


def read_stack(path: Path) -> Stack:
    """The stack of the model folder ``path``; a `ModelError` names any module it cannot run."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return Stack(encoder=path, source=path)
    modules = read_json(modules_file)
    if not isinstance(modules, list) or not modules:
        raise ModelError(f"{modules_file}: expected a list of modules")
    kinds = [module_kind(modules_file, m) for m in modules]
    folders = [module_folder(path, modules_file, m) for m in modules]
    if any(kind in SPARSE_KINDS for kind in kinds):
        return read_sparse(path, modules_file, kinds, folders)
    if (
        kinds[:2] != ["Transformer", "Pooling"]
        or "Transformer" in kinds[2:]
        or ("Pooling" in kinds[2:])
    ):
        raise ModelError(
            f"{modules_file}: batchscore runs a Transformer, then Pooling, then Dense and "
            f"Normalize modules; this model chains {' -> '.join(kinds)}"
        )
    encoder, lowercase = folders[0], read_transformer(folders[0])
    modes, include_prompt = read_pooling(folders[1])
    head = tuple(
        read_dense(folder) if kind == "Dense" else read_normalize(folder)
        for kind, folder in zip(kinds[2:], folders[2:], strict=True)
    )
    config = read_config(path, "SentenceTransformer")
    prompts, default = read_prompts(path, config)
    return Stack(
        encoder,
        modes,
        include_prompt,
        head,
        lowercase,
        prompts,
        default,
        path,
        truncate_dim=positive(config, "truncate_dim", path),
    )


def stack_parts(
    path: Path, *, prompt_name: str | None = None, normalize: bool = True
) -> dict[str, str]:
    """An encoder stack's parts of the fingerprint: the stack, when it is more than one pooling
    and a Normalize (or the job turns its Normalize off), and the prompt it is given."""
    if not path.is_dir():
        return {}
    parts = {}
    stack = read_stack(path)
    if not stack.plain or (stack.normalize and not normalize):
        parts["stack"] = stack.describe()
    if prompt := stack.prompt(prompt_name):
        parts["prompt"] = prompt
    return parts


def read_sparse(path: Path, modules_file: Path, kinds: list[str], folders: list[Path]) -> Stack:
    """A SparseEncoder's stack: a masked-language model's Transformer, then SpladePooling."""
    if kinds[1:] != ["SpladePooling"] or kinds[0] not in ("Transformer", "MLMTransformer"):
        raise ModelError(
            f"{modules_file}: batchscore runs a sparse encoder as a Transformer (fill-mask), "
            f"then SpladePooling; this model chains {' -> '.join(kinds)}"
        )
    default = "fill-mask" if kinds[0] == "MLMTransformer" else "feature-extraction"
    lowercase = read_transformer(folders[0], "fill-mask", default)
    config = read_config(path, "SparseEncoder")
    prompts, default = read_prompts(path, config)
    return Stack(
        folders[0],
        include_prompt=True,  # SpladePooling pools every token, the prompt's too
        lowercase=lowercase,
        prompts=prompts,
        default_prompt=default,
        source=path,
        splade=read_splade(folders[1]),
        max_active_dims=positive(config, "max_active_dims", path),
    )


def module_kind(modules_file: Path, module: Any) -> str:
    """Transformer, Pooling, Dense, Normalize, SpladePooling or MLMTransformer (the older
    name of a fill-mask Transformer), from a module's class path (either layout)."""
    kind = str(module.get("type", "")) if isinstance(module, dict) else ""
    name = kind.rsplit(".", 1)[-1]
    if kind.startswith("sentence_transformers.") and name in KINDS + SPARSE_KINDS:
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


def read_config(path: Path, kind: str) -> dict[str, Any]:
    """``config_sentence_transformers.json`` (empty when there is none), which must describe
    a model of ``kind`` ("SentenceTransformer" or "SparseEncoder")."""
    file = path / "config_sentence_transformers.json"
    config = read_json(file) if file.is_file() else {}
    if not isinstance(config, dict):
        raise ModelError(f"{file}: expected a JSON object")
    found = config.get("model_type", kind)
    if found != kind:
        raise ModelError(
            f"{file}: a {found} model, and its modules.json chains a {kind}'s modules; "
            "batchscore embeds with SentenceTransformer and SparseEncoder stacks"
        )
    return config


def read_prompts(path: Path, config: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    """The model's prompts and the name of the one ``encode`` uses when none is asked for."""
    prompts = {str(k): str(v or "") for k, v in (config.get("prompts") or {}).items()}
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ModelError(
            f"{path / 'config_sentence_transformers.json'}: default_prompt_name "
            f'"{default}" is not one of its prompts'
        )
    return prompts, default


def positive(config: dict[str, Any], key: str, path: Path) -> int | None:
    """An optional positive whole number of the model's config (None when it is not set)."""
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelError(
            f"{path / 'config_sentence_transformers.json'}: {key} {value!r} is not a "
            "positive whole number"
        )
    return value
