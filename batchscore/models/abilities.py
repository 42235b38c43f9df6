"""What a model on disk can be run as, for `batchscore models` and `batchscore fetch`.

Read from the model's files, never its name: a file's bytes (the tensor task's formats), a
CLIP or SigLIP folder's two towers, a sentence-transformers ``modules.json`` (an encoder, a
sparse encoder, or a CrossEncoder's lone Transformer), else ``config.json``'s architectures
(a sequence classifier, a decoder-only or sequence-to-sequence language model, a plain
encoder). Each task the files suggest is then held to that task's own checks of the files
(`validate`'s, weights not loaded, a task's default keys), and one they refuse is dropped
with the reason, so a task listed here is one a job can run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from batchscore.errors import JobError, ModelError
from batchscore.job.sections import TASK_SECTIONS, ModelConfig
from batchscore.models.generation.architecture import generative_kind, read_config
from batchscore.models.generation.chat import has_chat_template
from batchscore.models.numeric.formats import detect
from batchscore.models.stack.crossencoder import read_cross_encoder
from batchscore.models.stack.stack import read_stack
from batchscore.models.tasks import adapter
from batchscore.models.vision.family import find_towers

TENSOR_KINDS = {
    "safetensors": "tensor model (safetensors weights; the job names its [tensor].factory)",
    "torchscript": "tensor model (TorchScript)",
    "export": "tensor model (torch.export)",
}


@dataclass(frozen=True)
class Abilities:
    """A model's kind in words, the tasks it runs as, and why a task its kind suggests is not
    among them (or why it has none)."""

    kind: str
    tasks: tuple[str, ...]
    notes: tuple[str, ...] = ()


def abilities(path: Path, allow_pickle: bool = False) -> Abilities | None:
    """What the model at ``path`` (a folder or a file) can be run as, its pickle weights run
    only with ``allow_pickle`` (as `[model].allow_pickle`); None when ``path`` holds no model
    (a folder without ``config.json`` or ``modules.json``, a file of no model format)."""
    if path.is_file():
        return file_abilities(path)
    marks = [path / name for name in ("config.json", "modules.json")]
    if not path.is_dir() or not any(m.is_file() or m.is_symlink() for m in marks):
        return None  # (a link to a blob a cache cleaned up still marks a model, one that fails)
    try:
        kind, candidates = folder_kind(path)
    except (ModelError, OSError) as exc:  # a config that is no JSON, a link into a pruned cache
        return Abilities("a model folder batchscore cannot read", (), (str(exc),))
    tasks, notes = [], []
    for task in candidates:
        try:
            check(path, task, allow_pickle)
        except (ModelError, JobError, OSError) as exc:
            notes.append(f"{task}: {exc}")
            continue
        tasks.append(task)
    return Abilities(kind, tuple(tasks), tuple(notes))


def file_abilities(path: Path) -> Abilities | None:
    """A model file: the tensor task's, by its bytes; a pickle is listed with why it is not run."""
    try:
        fmt = detect(path)
    except (ModelError, OSError):
        return None
    if fmt == "pickle":
        why = "a torch.save pickle, which can run code when loaded: batchscore does not load it"
        return Abilities("torch.save pickle", (), (why,))
    return Abilities(TENSOR_KINDS[fmt], ("tensor",))


def folder_kind(path: Path) -> tuple[str, tuple[str, ...]]:
    """A model folder's kind in words, and the tasks that kind runs as."""
    towers = find_towers(path)
    if towers is not None:
        return f"two towers ({towers.kind}): images and texts", ("embed",)
    if (path / "modules.json").is_file():
        return stack_kind(path)
    config = read_config(path, trust_remote_code=False)
    generative = generative_kind(config)
    if generative is not None:
        words = {"decoder": "decoder-only", "seq2seq": "sequence-to-sequence"}[generative]
        scores = ("loglik",) if generative == "decoder" else ()  # a causal LM's own tokens
        return f"{words} language model", ("generate", "summarize", *scores)
    architectures = list(getattr(config, "architectures", None) or [])
    if any(name.endswith("ForSequenceClassification") for name in architectures):
        labels = getattr(config, "num_labels", 2)
        scored = "one score: a reranker" if labels == 1 else f"{labels} labels"
        rewards = ("reward",) if has_chat_template(path) else ()  # it reads conversations
        return f"sequence classifier ({scored})", ("classify", *rewards)
    if not architectures or any(name.endswith("Model") for name in architectures):
        return "encoder", ("embed", "summarize")
    return f"{', '.join(architectures)}: no task of batchscore runs it", ()


def stack_kind(path: Path) -> tuple[str, tuple[str, ...]]:
    """A sentence-transformers folder: a CrossEncoder (its Transformer alone), a sparse
    encoder, or an embedding model (which extractive summaries rank sentences with)."""
    try:
        read_cross_encoder(path)
    except ModelError:
        pass
    else:
        return "sentence-transformers CrossEncoder", ("classify",)
    stack = read_stack(path)
    if stack.sparse:
        return "sentence-transformers sparse encoder (SPLADE)", ("embed",)
    return "sentence-transformers encoder", ("embed", "summarize")


def check(path: Path, task: str, allow_pickle: bool) -> None:
    """The task's own checks of the files (`validate`'s, no weights loaded), at its defaults."""
    model = ModelConfig(task=task, path=str(path), allow_pickle=allow_pickle)  # type: ignore[arg-type]
    options = TASK_SECTIONS[task]()
    chosen = adapter(path, model=model, options=options)
    chosen.check_files(path, options, allow_pickle=allow_pickle)
