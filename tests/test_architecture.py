"""The house rules the tree keeps: the rooms form a stack, data flows one way, no hidden
imports, small modules.

Read from the source with `ast`, so the check covers imports inside functions too (the usual
way a cycle is hidden) and needs nothing imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "batchscore"
# Only the two front doors import batchscore modules lazily, so that they cost nothing until
# used: the command line (`--help` and `validate` stay free of torch) and the package root,
# whose module `__getattr__` imports the Python API (torch, transformers) on first use so that
# `import batchscore` stays cheap. Anywhere else an import inside a function would be a cycle
# dodged, not a cost saved.
LAZY_ALLOWED = {"batchscore.cli", "batchscore.cli_models", "batchscore"}
MAX_LINES = 400  # a module past this is a question (docs/style.md), not a number to squeeze under
# The modules that are past it, each reviewed, and why splitting it would make it worse: a
# module is never squeezed to fit (no line-saving `fmt: skip`: that is for tables only)
LONG = {
    "batchscore.output.delta": "the Delta entry of the format table: one class whose every "
    "hook is a transaction of one log, and the note that explains their versions together",
    "batchscore.output.iceberg": "the Iceberg entry, as Delta's: one class over one log, its "
    "catalog, columns, rows and history already in modules of their own",
}
# The stack, top to bottom (README's "How it is built" draws it): a module imports modules of its
# own room or of rooms ranked below it, never above, lazy imports included. A room is a
# sub-package, or a module at the top of batchscore/ ("batchscore" is the package root); a
# sub-package of a room is a room of its own, ranked within its parent (`INNER_RANKS`).
RANKS = {
    "__main__": 15,  # `python -m batchscore`
    "batchscore": 15,  # the package root: the Python API, imported on first use
    "cli": 14,  # the command line: the commands over a job file, and the group
    "cli_models": 13,  # the command line's commands over a model: run-batch, models, fetch
    "api": 13,  # the Python API: run, score
    "exits": 12,  # errors, Ctrl-C and SIGTERM as messages and exit statuses
    "frames": 12,  # Arrow, polars and pandas frames in and out of score
    "recipes": 11,  # one per command: driver + run, plan + estimate, preflight, status, history
    "engines": 10,  # where the model runs: this process, or Ray actors
    "measure": 9,  # what a job leaves to measurement: gate, auto, budget, load, cache, decide
    "pipeline": 8,  # the stages: reader, windows and batches, scoring, assembled rows
    "models": 7,  # the task table, its adapters and the fingerprint
    "runtime": 6,  # device, executor, packed weights, the native BERT and its OpenVINO build
    "precision": 5,  # the precision table and int8's transform
    "output": 4,  # the output folder contract: pending work, commits, claim, the committer
    "work": 3,  # the units of work every room shares, and the input shards
    "storage": 2,  # where an output folder lives, and every name in it
    "job": 1,  # the job file
    "observe": 1,  # counters, progress, logs, metrics, the report page
    # what every room may use: the error root, fault hooks, the version, threads, files in
    # shared places (read safely, temp files made new), the heap kept from the collector
    "errors": 0,
    "files": 0,
    "faults": 0,
    "version": 0,
    "threads": 0,
    "heap": 0,
}

# Rooms inside a room, top to bottom: each ranks within its parent's place in the stack, so it
# imports its parent's lower rooms and the rooms below its parent, never its parent's top.
INNER_RANKS = {
    "models": 5,  # the task table, the adapters, the fingerprint, and what the adapters share
    "models.generation": 3,  # decoding, stop strings, chat templates, continuous batching
    "models.numeric": 3,  # the tensor task's feature columns, model files and factories
    "models.stack": 3,  # the sentence-transformers stack: read, one module, its text and weights
    "models.vision": 3,  # two towers (CLIP, SigLIP): which folder, images as pixels, weights
    "models.text": 1,  # the tokenizer, its template, windows, sentences, a task's text inputs
    "models.source": 1,  # where a model is (locate, hub), its folder checked and loaded
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str) -> list[tuple[str, bool]]:
    """The batchscore modules ``name`` imports, and whether each import is inside a function."""
    tree = ast.parse(MODULES[name].read_text())
    nested: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            nested.update(id(n) for n in ast.walk(node) if n is not node)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import module` imports the module; `from module import name` the module
            targets = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                for a in node.names
            ]
        else:
            continue
        for target in targets:
            if target.startswith("batchscore") and target != name:
                found.append((target, id(node) in nested))
    return found


GRAPH = {name: sorted({t for t, _ in imports(name) if t in MODULES}) for name in MODULES}


def find_cycle() -> list[str] | None:
    """One import cycle among batchscore's modules, or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in GRAPH[node]:
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in GRAPH:
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def room(name: str) -> str:
    """The room a module belongs to: the package that holds it below batchscore/ (a
    sub-package's as "models.generation"), or the module itself at the top."""
    folder = MODULES[name].parent.relative_to(PACKAGE).parts
    return ".".join(folder) or name.split(".")[-1]


def rank(here: str) -> tuple[int, int]:
    """A room's place in the stack: its top room's rank, then its rank inside that room."""
    return RANKS[here.split(".")[0]], INNER_RANKS.get(here, 0)


def inner_rooms() -> set[str]:
    """The sub-packages of the rooms, at any depth, as "models.generation"."""
    folders = [p.parent.relative_to(PACKAGE).parts for p in PACKAGE.rglob("__init__.py")]
    return {".".join(parts) for parts in folders if len(parts) > 1}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_import_points_down_the_stack(name: str):
    """Lazy imports included: the front doors' are for cost, never to reach up."""
    here = room(name)
    assert here.split(".")[0] in RANKS, f"{here} has no place in the stack (RANKS)"
    up = [
        target
        for target, _ in imports(name)
        if target in MODULES and room(target) != here and rank(room(target)) >= rank(here)
    ]
    assert not up, f"{name} ({here}, rank {rank(here)}) imports {up}, which are not below it"


def test_data_flows_one_way():
    """No module imports one that (directly or not) imports it back."""
    cycle = find_cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("name", sorted(set(MODULES) - LAZY_ALLOWED))
def test_no_import_hidden_in_a_function(name: str):
    hidden = [target for target, inside in imports(name) if inside]
    assert not hidden, f"{name} imports {hidden} inside a function"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small(name: str):
    """Past `MAX_LINES` only as a reviewed exception (`LONG`), which goes once it is not."""
    lines = len(MODULES[name].read_text().splitlines())
    if name in LONG:
        assert lines > MAX_LINES, f"{name} has {lines} lines: take it off LONG"
    else:
        assert lines <= MAX_LINES, (
            f"{name} has {lines} lines; split it by idea, or review it into LONG"
        )


def test_fmt_skip_holds_tables_only():
    """`# fmt: skip` keeps a table's columns aligned; on a statement it only saves lines."""
    for name, path in MODULES.items():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.rstrip().endswith("# fmt: skip"):
                assert line.lstrip().startswith(("}", "]", ")")), f"{name}:{number}: {line.strip()}"


def test_the_tree_names_the_rooms():
    """Every room the README's "How it is built" describes is a package here, and vice versa,
    and the README draws them in the stack's order, top to bottom."""
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == {name for name in RANKS if (PACKAGE / name).is_dir()}
    readme = (PACKAGE.parent / "README.md").read_text()
    section = readme.split("## How it is built", 1)[1].split("\n## ", 1)[0]
    for name in rooms:
        assert f"\n  {name}/" in section, f"README's 'How it is built' does not describe {name}/"
    drawn = sorted(rooms, key=lambda name: section.index(f"\n  {name}/"))
    ranks = [RANKS[name] for name in drawn]
    assert ranks == sorted(ranks, reverse=True), f"README draws another stack: {drawn}"


def test_rooms_inside_rooms_are_ranked():
    """Every sub-package of a room has its rank inside that room, below its parent's own
    modules, and the README names it in its parent's entry."""
    assert inner_rooms() == set(INNER_RANKS) - set(RANKS)
    readme = (PACKAGE.parent / "README.md").read_text()
    section = readme.split("## How it is built", 1)[1].split("\n## ", 1)[0]
    for inner in inner_rooms():
        parent, name = inner.rsplit(".", 1)
        assert INNER_RANKS[inner] < INNER_RANKS[parent], f"{inner} is not below {parent}'s top"
        top = inner.split(".")[0]
        entry = re.split(r"\n  (?=\S)", section.split(f"\n  {top}/", 1)[1], maxsplit=1)[0]
        assert f"{name}/" in entry, f"README's {top}/ entry does not name {name}/"


def test_every_module_name_is_unique():
    """One name per idea: no two modules share a name anywhere in the package (a room may
    share its main module's name, as models/stack/stack.py does), so a name in an import, a
    traceback or a conversation points at one file."""
    seen: dict[str, list[str]] = {}
    for name in MODULES:
        if MODULES[name].name != "__init__.py":
            seen.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    twice = {short: names for short, names in seen.items() if len(names) > 1}
    assert not twice, f"module names used twice: {twice}"


# The front doors translate (arguments, frames, output, exit codes) and call one recipe per verb:
# what they may import besides the recipes is the job file, the errors and their exit codes, the
# frames `score` takes, messages (observe), and the process's own hooks (version, faults, the
# garbage collector paused while the command line imports: heap).
FRONT_DOORS = ("batchscore.cli", "batchscore.cli_models", "batchscore.api")
DOORS_MAY_IMPORT = {
    "cli_models",  # the command line's commands over a model, which join its group
    "recipes",
    "job",
    "errors",
    "exits",
    "frames",
    "observe",
    "version",
    "faults",
    "heap",
}


@pytest.mark.parametrize("name", FRONT_DOORS)
def test_the_front_doors_call_recipes_not_stages(name: str):
    """Lazy imports included: a stage the command line or the API reached past its recipe
    would be recipe work done at the door (and a second route to it)."""
    past = sorted({target for target, _ in imports(name) if room(target) not in DOORS_MAY_IMPORT})
    assert not past, f"{name} imports {past}: call a recipe (batchscore/recipes/) instead"
    assert any(room(target) == "recipes" for target, _ in imports(name))


def calls(name: str, callee: str) -> int:
    """How often module ``name`` calls ``callee`` by name (``callee(...)``, ``x.callee(...)``)."""
    count = 0
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            count += called == callee
    return count


@pytest.mark.parametrize(
    ("callee", "home"),
    [
        ("DecisionCache", "batchscore.measure.cache"),  # recipes open theirs: `open_cache`
        ("cache_folder", "batchscore.measure.cache"),
        ("RowFilter", "batchscore.job.sections"),  # `InputConfig.row_filter`
        ("Batching", "batchscore.pipeline.batching"),  # `Batching.of`: [batching] and the task
    ],
)
def test_one_route_to_each_thing(callee: str, home: str):
    """Each of these is made in one place, and everyone else asks for it there."""
    elsewhere = [name for name in MODULES if name != home and calls(name, callee)]
    assert not elsewhere, f"{callee}(...) is built in {elsewhere}; ask {home} for it"


def reads(name: str, attribute: str) -> int:
    """How often module ``name`` reads ``attribute`` of anything (``x.attribute``)."""
    tree = ast.parse(MODULES[name].read_text())
    return sum(
        isinstance(node, ast.Attribute)
        and node.attr == attribute
        and isinstance(node.ctx, ast.Load)
        for node in ast.walk(tree)
    )


# How rows become batches has one owner, the batching policy; the sampler under it is pure.
BATCHING_POLICY = "batchscore.pipeline.batching"
SAMPLER = "batchscore.pipeline.sampler"


@pytest.mark.parametrize("name", sorted(set(MODULES) - {BATCHING_POLICY, SAMPLER}))
def test_batches_are_cut_by_the_one_policy(name: str):
    """Whether rows are sorted, under what budget and where batches are cut is the policy's
    answer (`Batching.of`, then its `batches` or `cut`), so the reader, the model thread, its
    out-of-memory halving, the gate, calibration, the budget's probe and `plan` cannot drift
    apart: no other module cuts with the sampler itself, or decides sorting from a task's
    `bucketing` (the tasks, in models/, declare it; the policy alone reads it)."""
    assert not calls(name, "form_batches"), f"{name} calls form_batches: ask the Batching policy"
    if room(name).split(".")[0] != "models":
        assert not reads(name, "bucketing"), f"{name} reads .bucketing: ask the Batching policy"


def takes_the_job(name: str) -> list[str]:
    """The functions of module ``name`` with a parameter annotated as the whole `Job`."""
    found = []
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            if any(ast.unparse(a.annotation) == "Job" for a in arguments if a.annotation):
                found.append(node.name)
    return found


@pytest.mark.parametrize("name", sorted(n for n in MODULES if room(n) == "pipeline"))
def test_stages_receive_what_they_use_not_the_job(name: str):
    """A stage takes its sections (`[input]`, `[batching]`), the shards, the rows: as
    datatrove's steps get their data, not the config, so one stage changes alone."""
    assert not takes_the_job(name), f"{name}: {takes_the_job(name)} take the whole job"


# The output formats' own modules (`batchscore.output.format_table` lists the entries): a
# format's modules share its name as a prefix ("delta", "delta_log", "delta_columns").
FORMAT_ENTRIES = ("delta", "iceberg")


def format_family(name: str) -> str | None:
    """The format whose own module ``name`` is, or None."""
    short = name.removeprefix("batchscore.output.")
    if short == name:
        return None
    return next((f for f in FORMAT_ENTRIES if short == f or short.startswith(f"{f}_")), None)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_only_the_format_table_imports_a_format(name: str):
    """The output room holds to the protocol (`batchscore.output.format`): a format's modules
    are imported by the format table and by one another, never by the modules that call it."""
    if name == "batchscore.output.format_table":
        return
    own = format_family(name)
    foreign = [t for t, _ in imports(name) if (f := format_family(t)) and f != own]
    assert not foreign, f"{name} imports {foreign}: ask `ckpt.format` (the protocol) instead"


def test_the_format_table_lists_every_entry():
    """Each format entry is in `FORMATS`, and `[output].format` names exactly those."""
    source = MODULES["batchscore.output.format_table"].read_text()
    keys = re.findall(r'^    "(\w+)":', source, flags=re.M)
    sections = MODULES["batchscore.job.sections"].read_text()
    literal = re.search(r"format: Literal\[(.*?)\] = \"parquet\"", sections).group(1)
    assert sorted(keys) == sorted(re.findall(r'"(\w+)"', literal))
    entries = {f for n in MODULES if (f := format_family(n))}
    assert entries <= set(keys), f"format modules with no entry: {entries - set(keys)}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_nobody_asks_which_format_it_holds(name: str):
    """No `is None` test of a format (the plain folder is an entry, `ParquetFolder`), and no
    comparison of its name outside the format table and the job's own checks."""
    source = MODULES[name].read_text()
    asked = re.findall(r"ckpt\.(?:format|table) is (?:not )?None", source)
    assert not asked, f"{name} tests a format against None: {asked}"
    if name.startswith(("batchscore.output", "batchscore.recipes", "batchscore.engines")):
        named = re.findall(r"output\.format [!=]= |\.format\.name [!=]= ", source)
        assert not named, f"{name} asks which format it holds: {named}"
