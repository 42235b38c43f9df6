"""The job file: one small frozen dataclass per TOML section, loaded and validated in one pass.

Each pipeline stage receives only its own section (the reader `InputConfig`, the sampler
`BatchingConfig`, ...), so a stage can be read, tested and changed without knowing the rest.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from batchscore.errors import JobError
from batchscore.prompt import template_problem
from batchscore.rowfilter import where_problem
from batchscore.schema import build, coerce, describe, did_you_mean, show

Task = Literal["embed", "classify", "generate", "summarize", "tensor"]
Precision = Literal["fp32", "fp16", "bf16", "int8", "auto"]
DEFAULT_MODEL = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class InputConfig:
    """Which shards to read and which of their columns matter."""

    path: tuple[str, ...]
    text: str = "text"
    features: tuple[str, ...] = ()
    id: str | None = None
    keep: tuple[str, ...] = ()
    where: str | None = None  # a SQL predicate over input columns; rows it rejects are skipped

    @property
    def carried(self) -> tuple[str, ...]:
        """Input columns copied unchanged to the output: the id, then `keep`."""
        return tuple(dict.fromkeys(([self.id] if self.id else []) + list(self.keep)))


@dataclass(frozen=True)
class ModelConfig:
    """What to run and how: the model, its precision, device and truncation."""

    task: Task
    name: str | None = None
    path: str | None = None
    precision: Precision = "fp32"
    device: str = "auto"
    max_length: int | None = field(default=None, metadata={"min": 1})
    threads: int | None = field(default=None, metadata={"min": 1})
    trust_remote_code: bool = False
    allow_pickle: bool = False


@dataclass(frozen=True)
class BatchingConfig:
    """How rows become batches: the token budget and the window the sampler sorts."""

    max_tokens: int | Literal["auto"] = field(default=16384, metadata={"min": 1})
    max_rows: int = field(default=512, metadata={"min": 1})
    sort: bool = True
    window_rows: int = field(default=8192, metadata={"min": 1})


@dataclass(frozen=True)
class OutputConfig:
    """Where results go and how large a unit of commit is."""

    path: str
    on_error: Literal["fail", "skip"] = "fail"
    max_bad_share: float = field(default=0.1, metadata={"min": 0.0, "max": 1.0})
    chunk_rows: int = field(default=50_000, metadata={"min": 1})


@dataclass(frozen=True)
class QualityConfig:
    """[quality]: how closely a precision other than fp32 must agree with fp32 on the job's rows.

    Measured on the first ``sample_rows`` rows before the first chunk is scored (and recorded, so
    a resumed run does not measure again); `batchscore check` measures it on demand.
    """

    sample_rows: int = field(default=256, metadata={"min": 1})
    min_cosine: float = field(default=0.99, metadata={"min": -1.0, "max": 1.0})
    min_agreement: float = field(default=0.99, metadata={"min": 0.0, "max": 1.0})
    min_exact_match: float = field(default=0.9, metadata={"min": 0.0, "max": 1.0})
    max_relative_error: float = field(default=0.01, metadata={"min": 0.0})


@dataclass(frozen=True)
class EmbedConfig:
    """[embed]: the embedding task's options."""

    normalize: bool = True


@dataclass(frozen=True)
class ClassifyConfig:
    """[classify]: a sequence-classification model's label, and optionally every probability."""

    all_scores: bool = False


@dataclass(frozen=True)
class GenerateConfig:
    """[generate]: a prompt template over input columns and how to decode.

    Greedy unless ``num_beams > 1`` (beam search) or ``do_sample`` (seeded sampling, where
    ``temperature``, ``top_k`` (0: off) and ``top_p`` (1: off) shape the distribution).
    """

    prompt: str | None = None
    max_new_tokens: int = field(default=64, metadata={"min": 1})
    num_beams: int = field(default=1, metadata={"min": 1})
    do_sample: bool = False
    temperature: float = field(default=1.0, metadata={"min": 0.01})
    top_k: int = field(default=0, metadata={"min": 0})
    top_p: float = field(default=1.0, metadata={"min": 0.01, "max": 1.0})
    seed: int = field(default=0, metadata={"min": 0})


@dataclass(frozen=True)
class SummarizeConfig:
    """[summarize]: extractive summaries built from sentence embeddings, or abstractive ones.

    The first three keys drive the extractive default (an encoder such as MiniLM); ``prompt``,
    ``max_new_tokens`` and ``num_beams`` apply when `[model].path` is a generative model.
    """

    sentences: int = field(default=3, metadata={"min": 1})
    diversity: float = field(default=0.3, metadata={"min": 0.0, "max": 1.0})
    max_sentences: int = field(default=256, metadata={"min": 1})
    prompt: str | None = None
    max_new_tokens: int = field(default=128, metadata={"min": 1})
    num_beams: int = field(default=1, metadata={"min": 1})


@dataclass(frozen=True)
class TensorConfig:
    """[tensor]: a numeric model over feature columns; `output` says how to read its rows."""

    output: Literal["class", "value"]
    format: Literal["auto", "torchscript", "export", "safetensors"] = "auto"
    factory: str | None = None
    factory_args: dict[str, Any] = field(default_factory=dict)
    num_features: int | None = field(default=None, metadata={"min": 1})


@dataclass(frozen=True)
class RayConfig:
    """[ray]: the cluster the Ray engine joins and the model actors it starts there.

    ``address`` None starts a local Ray instance; "auto" or ``ray://host:10001`` joins one.
    ``actors`` defaults to one per GPU (``num_gpus`` each), or one per ``num_cpus`` CPU slots.
    """

    address: str | None = None
    actors: int | None = field(default=None, metadata={"min": 1})
    num_cpus: float = field(default=1.0, metadata={"min": 0.0})
    num_gpus: float | None = field(default=None, metadata={"min": 0.0})


TASK_SECTIONS: dict[str, type] = {
    "embed": EmbedConfig,
    "classify": ClassifyConfig,
    "generate": GenerateConfig,
    "summarize": SummarizeConfig,
    "tensor": TensorConfig,
}
SECTIONS: dict[str, type] = {
    "input": InputConfig,
    "model": ModelConfig,
    "batching": BatchingConfig,
    "output": OutputConfig,
    "quality": QualityConfig,
    "ray": RayConfig,
    **TASK_SECTIONS,
}
Engine = Literal["local", "ray"]
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


@dataclass(frozen=True)
class Job:
    """A whole validated job; `task` holds the section of the job's own task."""

    name: str
    source: Path
    input: InputConfig
    model: ModelConfig
    batching: BatchingConfig
    output: OutputConfig
    task: Any
    quality: QualityConfig = field(default_factory=QualityConfig)
    engine: Engine = "local"  # where chunks are scored: this process, or actors on a Ray cluster
    ray: RayConfig = field(default_factory=RayConfig)

    @property
    def output_dir(self) -> Path:
        """The output folder (absolute)."""
        return Path(self.output.path)


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``section.key=value``; the value is read as TOML, else taken as a bare string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise JobError(f"--set {text}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> None:
    """Apply ``--set`` overrides to the raw TOML tables in place."""
    for text in overrides:
        keys, value = parse_override(text)
        table = raw
        for part in keys[:-1]:
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise JobError(f"--set {text}: {part} is not a section")
        table[keys[-1]] = value


def resolve(base: Path, path: str) -> str:
    """Resolve a job-relative path; URLs (``s3://...``) pass through untouched."""
    if "://" in path:
        return path
    return str((base / Path(path).expanduser()).resolve())


def load_job(path: str | Path, overrides: list[str] = ()) -> Job:
    """Read, override and validate a job file; raise `JobError` listing every problem at once."""
    source = Path(path)
    try:
        raw = tomllib.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise JobError(f"{source}: job file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JobError(f"{source}: cannot read job file: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise JobError(f"{source}: not valid TOML: {exc}") from None
    apply_overrides(raw, list(overrides))
    return job_from_dict(raw, source)


def job_from_dict(raw: dict[str, Any], source: Path) -> Job:
    """Validate parsed TOML into a `Job`; `source` names the file in messages and anchors paths."""
    problems: list[str] = []
    base = source.resolve().parent
    name = raw.pop("name", source.stem)
    if not isinstance(name, str) or not name:
        problems.append(f"{source}: name: expected a non-empty string, got {show(name)}")
    engine = raw.pop("engine", "local")
    if not coerce(engine, Engine)[0]:
        problems.append(f"{source}: engine: expected {describe(Engine)}, got {show(engine)}")
    for key, value in raw.items():
        if key not in SECTIONS:
            problems.append(f"{source}: [{key}]: unknown section{did_you_mean(key, SECTIONS)}")
        elif not isinstance(value, dict):
            problems.append(f"{source}: {key}: expected a [{key}] table, got {show(value)}")
    tables = {k: v for k, v in raw.items() if isinstance(v, dict)}

    def section(key: str, **extra: Any) -> Any:
        return build(SECTIONS[key], tables.get(key, {}), f"{source}: [{key}]", problems, **extra)

    inp = section("input")
    model = section("model")
    batching = section("batching")
    output = section("output")
    quality = section("quality")
    task = section(model.task) if model else None
    ray = section("ray")

    if inp:
        inp = replace(inp, path=tuple(resolve(base, p) for p in inp.path))
        if not inp.path:
            problems.append(f"{source}: [input].path: names no input")
        if inp.where is not None and (problem := where_problem(inp.where)):
            problems.append(f"{source}: [input].where: {problem}")
    if output:
        output = replace(output, path=resolve(base, output.path))
    if model:
        model = check_model(model, base, source, problems)
    fixed_budget = batching and batching.max_tokens != "auto"
    if model and fixed_budget and model.max_length and batching.max_tokens < model.max_length:
        problems.append(
            f"{source}: [batching].max_tokens: {batching.max_tokens} is below "
            f"[model].max_length {model.max_length}, so one long row could never fit"
        )
    if model and inp and batching and task:
        check_task(model.task, task, inp, model, batching, source, problems)
    if engine == "ray" and model and batching:
        for key, value in (
            ("[model].precision", model.precision),
            ("[batching].max_tokens", batching.max_tokens),
        ):
            if value == "auto":
                problems.append(
                    f'{source}: {key}: "auto" is measured on this machine, not on the Ray '
                    'actors\' hardware; set it explicitly with engine = "ray"'
                )
    if problems:
        raise JobError(problems)
    return Job(name, source, inp, model, batching, output, task, quality, engine, ray)


def check_task(
    name: str,
    task: Any,
    inp: InputConfig,
    model: ModelConfig,
    batching: BatchingConfig,
    source: Path,
    problems: list[str],
) -> None:
    """Checks between a task's own section and the others (prompt columns, features, budget)."""
    where = f"{source}: [{name}]"
    if name in ("classify", "generate", "tensor") and not model.path:
        problems.append(
            f"{source}: [model].path: task {name} needs a local model; no built-in does"
        )
    if isinstance(task, GenerateConfig | SummarizeConfig):
        problem = template_problem(task.prompt)
        if problem:
            problems.append(f"{where}.prompt: {problem}")
    if isinstance(task, GenerateConfig):
        if task.do_sample and task.num_beams > 1:
            problems.append(f"{where}.do_sample: sampling with num_beams > 1 is not supported")
        budget, longest = batching.max_tokens, (model.max_length or 0) + task.max_new_tokens
        if model.max_length and budget != "auto" and budget < longest:
            problems.append(
                f"{source}: [batching].max_tokens: {batching.max_tokens} is below [model]."
                f"max_length + [generate].max_new_tokens ({model.max_length} + "
                f"{task.max_new_tokens}), so one long row could never fit"
            )
    if isinstance(task, TensorConfig):
        if not inp.features:
            problems.append(f"{source}: [input].features: task tensor needs its feature columns")
        elif task.num_features and len(inp.features) > 1 and task.num_features != len(inp.features):
            problems.append(
                f"{where}.num_features: {task.num_features}, but [input].features names "
                f"{len(inp.features)} columns"
            )
        if task.factory_args and not task.factory:
            problems.append(f"{where}.factory_args: given without a factory")
        if task.factory and task.format in ("torchscript", "export"):
            problems.append(f"{where}.factory: a {task.format} file holds its own model")


def check_model(model: ModelConfig, base: Path, source: Path, problems: list[str]) -> ModelConfig:
    """Checks across [model] keys; fills in the default model and resolves a local path."""
    if not DEVICE.fullmatch(model.device):
        problems.append(
            f'{source}: [model].device: expected auto, cpu, cuda or cuda:N, got "{model.device}"'
        )
    if model.name and model.path:
        problems.append(f"{source}: [model]: set name or path, not both")
    name, path = model.name, model.path
    if path:
        path = resolve(base, path)
    elif not name:
        name = DEFAULT_MODEL
    return replace(model, name=name, path=path)
