"""What sentence-transformers' CrossEncoder reads from a classifier's folder besides its weights.

A cross-encoder reads two texts as one input and writes logits. A one-logit one is a reranker
(ms-marco-MiniLM, bge-reranker): ``CrossEncoder.predict`` puts its logit through the activation
the model's author saved with it, Sigmoid when none is saved. Where it is saved changed over the
years; every place is read here, in the order CrossEncoder reads them:

1. ``config_sentence_transformers.json``: ``activation_fn`` (sentence-transformers 6 folders,
   those with a ``modules.json``, whose default prompt and ``do_lower_case`` are read too);
2. ``config.json``: ``sentence_transformers.activation_fn`` (4.x and 5.x, the hub's classic
   layout, as ms-marco-MiniLM ships it);
3. ``config.json``: ``sbert_ce_default_activation_function`` (before 4.0);
4. none of them: Sigmoid (bge-reranker ships no activation).

Each names a class by its import path. CrossEncoder passes over a path outside ``torch`` unless
it may run remote code, and so does batchscore, which never imports one: with
``trust_remote_code`` on (where CrossEncoder would run it) such a model is refused. A torch.nn
activation is built here by its class name (`stack.ACTIVATIONS`), never imported from the path
a file names. `[classify].activation` overrides them all ("none" keeps the raw logit).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from batchscore.errors import ModelError
from batchscore.models.stack.stack import ACTIVATIONS, module_folder, read_json

log = logging.getLogger("batchscore")
CHOICES = {"sigmoid": "Sigmoid", "tanh": "Tanh", "none": "Identity"}  # [classify].activation
DEFAULT = "Sigmoid"  # CrossEncoder's for a one-logit model that names none
SETTINGS = "sentence_bert_config.json"  # the Transformer module's, beside its model files
PACKAGE = "sentence_transformers."


@dataclass(frozen=True)
class Named:
    """An activation a model file names: its import path, and which file and key say so."""

    path: str
    where: str


@dataclass(frozen=True)
class CrossEncoderFolder:
    """A classifier folder as CrossEncoder reads it: where its Transformer is (the folder, or
    the module folder of an ST 6 ``modules.json``), the prompt put before the first text, whether
    texts are lowercased first, and the activations its files name, first one first."""

    encoder: Path
    prompt: str = ""
    lowercase: bool = False
    named: tuple[Named, ...] = ()

    @property
    def plain(self) -> bool:
        """Texts read as they are: what batchscore did before it read these files."""
        return not self.prompt and not self.lowercase

    def activation(self, trust_remote_code: bool = False) -> tuple[str, str]:
        """The torch.nn class CrossEncoder puts a one-logit model's logit through, and where it
        was read: the first activation named in a trusted place, else Sigmoid."""
        for entry in self.named:
            if not entry.path.startswith("torch."):
                if trust_remote_code:  # CrossEncoder would import and run it
                    raise ModelError(
                        f"{entry.where} names the activation {entry.path}, code from outside "
                        "torch that batchscore never runs; set [classify].activation "
                        '("sigmoid", "tanh" or "none") to the one it computes'
                    )
                log.warning(
                    "%s names the activation %s, outside torch: passed over, as CrossEncoder "
                    "does without trust_remote_code",
                    entry.where,
                    entry.path,
                )
                continue
            name = entry.path.rsplit(".", 1)[-1]
            if name not in ACTIVATIONS:
                raise ModelError(
                    f"{entry.where}: activation {entry.path} is not one batchscore implements "
                    f"({', '.join(sorted(ACTIVATIONS))}); set [classify].activation to override it"
                )
            return name, entry.where
        return DEFAULT, "CrossEncoder's default for one logit"


def activation_name(folder: CrossEncoderFolder, choice: str, trust_remote_code: bool) -> str:
    """The torch.nn class a one-logit model's score goes through: the job's `[classify].
    activation`, or ("auto") the model's own."""
    if choice != "auto":
        return CHOICES[choice]
    return folder.activation(trust_remote_code)[0]


def activation_module(name: str) -> nn.Module:
    """A torch.nn activation by class name (one of `stack.ACTIVATIONS`, which take no argument)."""
    return getattr(nn, name)()


def read_cross_encoder(path: Path) -> CrossEncoderFolder:
    """How CrossEncoder reads the classifier folder ``path`` (no weights loaded); a `ModelError`
    names a module or setting batchscore does not implement."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():  # the classic layout: a Hugging Face folder
        return CrossEncoderFolder(path, named=config_activations(path))
    modules = read_json(modules_file)
    kinds = [str(m.get("type", "")) if isinstance(m, dict) else "" for m in modules or [None]]
    first = kinds[0]
    if len(kinds) != 1 or not (first.startswith(PACKAGE) and first.endswith(".Transformer")):
        names = [k.rsplit(".", 1)[-1] or "?" for k in kinds]
        embeds = "Pooling" in names
        pooled = ' (an embedding model: task "embed" writes its vectors)' if embeds else ""
        raise ModelError(
            f"{modules_file}: batchscore classifies with a Transformer module alone, as "
            f"CrossEncoder saves one; this model chains {' -> '.join(names)}{pooled}"
        )
    encoder = module_folder(path, modules_file, modules[0])
    settings = read_settings(encoder)
    file = path / "config_sentence_transformers.json"
    config = read_json(file) if file.is_file() else {}
    named = []
    if config.get("activation_fn"):
        named.append(Named(str(config["activation_fn"]), f"{file}: activation_fn"))
    return CrossEncoderFolder(
        encoder,
        prompt=default_prompt(file, config),
        lowercase=bool(settings.get("do_lower_case", False)),
        named=(*named, *config_activations(encoder)),
    )


def config_activations(folder: Path) -> tuple[Named, ...]:
    """The activations a Hugging Face ``config.json`` names for CrossEncoder (4.x+, then <4)."""
    file = folder / "config.json"
    config = read_json(file) if file.is_file() else {}
    named = []
    st = config.get("sentence_transformers")
    if isinstance(st, dict) and st.get("activation_fn"):
        where = f"{file}: sentence_transformers.activation_fn"
        named.append(Named(str(st["activation_fn"]), where))
    elif config.get("sbert_ce_default_activation_function"):
        legacy = str(config["sbert_ce_default_activation_function"])
        named.append(Named(legacy, f"{file}: sbert_ce_default_activation_function"))
    return tuple(named)


def read_settings(encoder: Path) -> dict[str, Any]:
    """The Transformer module's settings; refuses one that reads texts in a way batchscore does
    not (a task other than sequence classification, extra tokenizer arguments)."""
    file = encoder / SETTINGS
    settings = read_json(file) if file.is_file() else {}
    task = settings.get("transformer_task", "sequence-classification")
    problem = None
    if task != "sequence-classification":
        problem = f'transformer_task "{task}" (a classifier is "sequence-classification")'
    elif settings.get("processing_kwargs"):
        problem = f"processing_kwargs {sorted(settings['processing_kwargs'])}"
    if problem:
        raise ModelError(f"{file}: its Transformer sets {problem}, which batchscore does not run")
    return settings


def default_prompt(file: Path, config: dict[str, Any]) -> str:
    """The prompt CrossEncoder puts before every first text: its default prompt's, if any."""
    prompts = config.get("prompts") or {}
    name = config.get("default_prompt_name")
    if name is None:
        return ""
    if name not in prompts:
        raise ModelError(f'{file}: default_prompt_name "{name}" is not one of its prompts')
    return str(prompts[name] or "")
