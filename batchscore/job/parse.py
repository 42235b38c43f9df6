"""Loading a job file: TOML, ``--set`` overrides, then every section validated in one pass.

All of a file's problems are reported at once, each naming the file and the ``[section].key``;
checks across sections (a budget below the model's window, prompt columns, a task that needs a
local model) run after each section is valid on its own.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from batchscore.errors import JobError
from batchscore.job.column_names import case_twins
from batchscore.job.paths import overlap_problem
from batchscore.job.prompt import template_problem
from batchscore.job.revision import revision_problem
from batchscore.job.runtimes import runtime_problem
from batchscore.job.schema import build, choices, coerce, describe, did_you_mean, show
from batchscore.job.sections import (
    DEFAULT_MODEL,
    ROW_HASH,
    SECTIONS,
    TASK_SECTIONS,
    BatchingConfig,
    Engine,
    GenerateConfig,
    InputConfig,
    Job,
    ModelConfig,
    OutputConfig,
    SummarizeConfig,
    TensorConfig,
)
from batchscore.job.structured import read_schema
from batchscore.job.where import where_problem

RAY_MAX_TOKENS = 16384  # a Ray job's budget when it names none (see job_from_dict)
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
# what [batching].max_tokens is, said where a message names it: vLLM and transformers use the
# name for the tokens generated per row, which is [generate].max_new_tokens here
BUDGET = "the token budget of one batch, rows x padded length, not the tokens to generate"


def parse_override(text: str, origin: str = "--set") -> tuple[list[str], Any]:
    """Split ``section.key=value``; the value is read as TOML, else taken as a bare string.
    ``origin`` names where it came from in a message (``--set``, or the API's ``overrides``)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise JobError(f"{origin} {text}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str], origin: str = "--set") -> None:
    """Apply ``--set`` overrides to the raw TOML tables in place."""
    for text in overrides:
        keys, value = parse_override(text, origin)
        set_key(raw, keys, value, f"{origin} {text}")


def apply_values(raw: dict[str, Any], overrides: Mapping[str, Any], origin: str) -> None:
    """Apply ``{"section.key": value}`` overrides (values as they are) to raw tables in place."""
    for key, value in overrides.items():
        if not isinstance(key, str) or not key.strip():
            raise JobError(f"{origin}: {key!r}: expected a key such as 'model.max_length'")
        set_key(raw, key.strip().split("."), value, f"{origin}: {key}")


def set_key(raw: dict[str, Any], keys: list[str], value: Any, where: str) -> None:
    """Set ``section.key`` (or a top-level key) in the raw tables."""
    table = raw
    for part in keys[:-1]:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            raise JobError(f"{where}: {part} is not a section")
    table[keys[-1]] = value


def resolve(base: Path, path: str) -> str:
    """Resolve a job-relative path; URLs (``s3://...``) pass through untouched."""
    if "://" in path:
        return path
    return str((base / Path(path).expanduser()).resolve())


def load_job(path: str | Path, overrides: list[str] = ()) -> Job:
    """Read, override and validate a job file; raise `JobError` listing every problem at once."""
    raw = read_job_file(Path(path))
    apply_overrides(raw, list(overrides))
    return job_from_dict(raw, Path(path))


def read_job_file(source: Path) -> dict[str, Any]:
    """A job file's raw TOML tables; a missing, unreadable or malformed file is a `JobError`."""
    try:
        return tomllib.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise JobError(f"{source}: job file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JobError(f"{source}: cannot read job file: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise JobError(f"{source}: not valid TOML: {exc}") from None


def job_from_dict(raw: dict[str, Any], source: Path) -> Job:
    """Validate parsed TOML into a `Job`; `source` names the file in messages and anchors paths."""
    problems: list[str] = []
    base = source.resolve().parent
    name = raw.pop("name", source.stem)
    if not isinstance(name, str) or not name:
        problems.append(f"{source}: name: expected a non-empty string, got {show(name)}")
    engine = raw.pop("engine", "local")
    if not coerce(engine, Engine)[0]:
        hint = did_you_mean(engine, choices(Engine)) if isinstance(engine, str) else ""
        problems.append(f"{source}: engine: expected {describe(Engine)}, got {show(engine)}{hint}")
    for key, value in raw.items():
        if key not in SECTIONS:
            problems.append(f"{source}: [{key}]: unknown section{did_you_mean(key, SECTIONS)}")
        elif not isinstance(value, dict):
            problems.append(f"{source}: {key}: expected a [{key}] table, got {show(value)}")
    tables = {k: v for k, v in raw.items() if isinstance(v, dict)}

    def section(key: str, **extra: Any) -> Any:
        if key in raw and key not in tables:  # not a table: said above, once
            return None
        return build(SECTIONS[key], tables.get(key, {}), f"{source}: [{key}]", problems, **extra)

    inp = section("input")
    model = section("model")
    batching = section("batching")
    output = section("output")
    quality = section("quality")
    # the task's own section is checked even when another [model] key is wrong: all at once
    task_name = model.task if model else tables.get("model", {}).get("task")
    known_task = isinstance(task_name, str) and task_name in TASK_SECTIONS
    task = section(task_name) if known_task else None
    if isinstance(task, GenerateConfig) and isinstance(task.json_schema, str):
        where = f"{source}: [{task_name}].json_schema"
        task = replace(task, json_schema=read_schema(base, task.json_schema, where, problems))
    ray = section("ray")

    if inp:
        inp = replace(inp, path=tuple(resolve(base, p) for p in inp.path))
        if not inp.path:
            problems.append(f"{source}: [input].path: names no input")
        for a, b in case_twins(inp.carried):
            problems.append(
                f"{source}: [input].id/keep: columns {a!r} and {b!r} differ only in case, and "
                "DuckDB, Spark and Hive read them as one column; carry one of them"
            )
        problems += [f"{source}: {problem}" for problem in increments_problems(inp)]
        if inp.where is not None and (problem := where_problem(inp.where)):
            problems.append(f"{source}: [input].where: {problem}")
    if quality and quality.cache_dir is not None:
        quality = replace(quality, cache_dir=resolve(base, quality.cache_dir))
    if output:
        output = replace(output, path=resolve(base, output.path))
        if inp and (problem := overlap_problem(inp.path, output.path)):
            problems.append(f"{source}: {problem}")
    if model:
        model = check_model(model, base, source, problems)
    fixed_budget = batching and batching.max_tokens != "auto"
    if model and fixed_budget and model.max_length and batching.max_tokens < model.max_length:
        problems.append(
            f"{source}: [batching].max_tokens: {batching.max_tokens} is below "
            f"[model].max_length {model.max_length}, so one long row could never fit (it is "
            f"{BUDGET})"
        )
    if model and inp and batching and task:
        found = task_problems(task, inp=inp, model=model, batching=batching)
        problems += [f"{source}: {p}" for p in found]
    if output:
        problems += [f"{source}: {p}" for p in output_problems(output)]
    if output and output.usage and isinstance(task, TensorConfig):
        problems.append(
            f"{source}: [output].usage: task tensor reads numbers, not tokens; there is no "
            "usage to count"
        )
    if engine == "ray" and model and batching:
        # "auto" is measured on this machine, not on the actors' hardware: a Ray job that does
        # not say runs at fp32 with a fixed budget, and one that asks for "auto" is refused
        given = {**tables.get("model", {}), **tables.get("batching", {})}
        model = model if "precision" in given else replace(model, precision="fp32")
        if "max_tokens" not in given:
            batching = replace(batching, max_tokens=RAY_MAX_TOKENS)
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


def output_problems(output: OutputConfig) -> list[str]:
    """What is wrong with [output]'s keys together (each message starts with its key)."""
    found = []
    if output.format != "iceberg":
        if output.catalog:
            found.append('[output].catalog: only for format = "iceberg"')
        if output.table_name != "batchscore.scores":
            found.append('[output].table_name: only for format = "iceberg"')
    bad = sorted(k for k, v in output.catalog.items() if not isinstance(v, str))
    if bad:
        found.append(f"[output].catalog: expected strings, not for {', '.join(bad)}")
    if "." not in output.table_name.strip("."):
        found.append(
            f"[output].table_name: expected a namespace and a name "
            f'("batchscore.scores"), got {output.table_name!r}'
        )
    return found


def increments_problems(inp: InputConfig) -> list[str]:
    """Row increments know a row by its id, and write its hash in a column of their own."""
    found = []
    if inp.by_rows and not inp.id:
        found.append(
            '[input].increments: "rows" knows each row by its id; set [input].id to the column '
            'that names a row, or use increments = "shards"'
        )
    if ROW_HASH in inp.copied:
        found.append(
            f"[input].id/keep: {ROW_HASH!r} is the name of the column batchscore writes each "
            "row's hash in; rename the input column"
        )
    return found


def task_problems(
    options: Any, *, inp: InputConfig, model: ModelConfig, batching: BatchingConfig
) -> list[str]:
    """Checks between a task's own section and the others (prompt columns, features, budget)."""
    problems = []
    where = f"[{model.task}]"
    section = type(options)
    if section.model_needed == "file" and not model.path:
        problems.append(f"[model].path: task {model.task} needs a local model file")
    elif section.model_needed == "own" and not model.path and model.name == DEFAULT_MODEL:
        problems.append(
            f"[model].path: task {model.task} needs its own model (a local path, or a Hugging "
            f"Face id in [model].name); the built-in {DEFAULT_MODEL} is an encoder"
        )
    if inp.text_pair is not None and not section.reads_pairs:
        pairs = ", ".join(t for t, s in TASK_SECTIONS.items() if s.reads_pairs)
        problems.append(f"[input].text_pair: task {model.task} reads one text; {pairs} read pairs")
    problems += conversation_problems(inp, model.task)
    if inp.image is not None and model.task != "embed":
        problems.append(
            f"[input].image: task embed reads images (with a CLIP or SigLIP model); task "
            f"{model.task} reads text"
        )
    elif inp.image is not None and model.long_text == "chunk":
        problems.append('[model].long_text: "chunk" windows texts; [input].image reads images')
    if model.long_text == "chunk" and not section.windows:
        windowed = ", ".join(t for t, s in TASK_SECTIONS.items() if s.windows)
        problems.append(
            f'[model].long_text: "chunk" reads long texts in windows for {windowed}; task '
            f"{model.task} has no windows to pool"
        )
    if isinstance(options, GenerateConfig | SummarizeConfig):
        problem = template_problem(options.prompt)
        if problem:
            problems.append(f"{where}.prompt: {problem}")
    if isinstance(options, GenerateConfig):
        problems += [f"{where}.{problem}" for problem in options.problems()]
        if options.do_sample and options.num_beams > 1:
            problems.append(f"{where}.do_sample: sampling with num_beams > 1 is not supported")
        budget, longest = batching.max_tokens, (model.max_length or 0) + options.max_new_tokens
        if model.max_length and budget != "auto" and budget < longest:
            problems.append(
                f"[batching].max_tokens: {batching.max_tokens} is below [model]."
                f"max_length + [generate].max_new_tokens ({model.max_length} + "
                f"{options.max_new_tokens}), so one long row could never fit (it is {BUDGET})"
            )
    if isinstance(options, TensorConfig):
        count = len(inp.features)
        if not inp.features:
            problems.append("[input].features: task tensor needs its feature columns")
        elif options.num_features and count > 1 and options.num_features != count:
            problems.append(
                f"{where}.num_features: {options.num_features}, but [input].features names "
                f"{count} columns"
            )
        if options.factory_args and not options.factory:
            problems.append(f"{where}.factory_args: given without a factory")
        if options.factory and options.format in ("torchscript", "export"):
            problems.append(f"{where}.factory: a {options.format} file holds its own model")
    return problems


def conversation_problems(inp: InputConfig, task: str) -> list[str]:
    """A reward model reads one conversation per row: a `messages` column, or a prompt and a
    response (`text` and `text_pair`); no other task reads a `messages` column."""
    if inp.messages is not None and task != "reward":
        return [f"[input].messages: task reward reads conversations; task {task} reads text"]
    if task != "reward":
        return []
    if inp.messages is not None and inp.text_pair is not None:
        return [
            "[input].messages: a row's conversation is its messages, or its text and "
            "text_pair (a prompt and a response), not both; remove one"
        ]
    if inp.messages is None and inp.text_pair is None:
        return [
            "[input].messages: task reward scores a conversation: set [input].messages to a "
            "column of {role, content} lists, or [input].text_pair to the response column "
            "(read after [input].text, the prompt)"
        ]
    return []


def check_model(model: ModelConfig, base: Path, source: Path, problems: list[str]) -> ModelConfig:
    """Checks across [model] keys; fills in the default model and resolves a local path."""
    if not DEVICE.fullmatch(model.device):
        problems.append(
            f'{source}: [model].device: expected auto, cpu, cuda or cuda:N, got "{model.device}"'
        )
    if model.name and model.path:
        problems.append(f"{source}: [model]: set name or path, not both")
    if model.revision is not None and not model.name:
        problems.append(
            f"{source}: [model].revision: a revision of a Hugging Face id in [model].name; "
            + ("a local [model].path has none" if model.path else "[model].name is not set")
        )
    if model.revision is not None and (problem := revision_problem(model.revision)):
        problems.append(
            f"{source}: [model].revision: {model.revision!r} {problem}; expected a branch, "
            "a tag or a commit hash"
        )
    if problem := runtime_problem(model):
        problems.append(f"{source}: [model].runtime: {problem}")
    name, path = model.name, model.path
    if path:
        path = resolve(base, path)
    elif not name:
        name = DEFAULT_MODEL
    return replace(model, name=name, path=path)
