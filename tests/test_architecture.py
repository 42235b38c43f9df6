"""The house rules the tree keeps: data flows one way, no hidden imports, small modules.

Read from the source with `ast`, so the check covers imports inside functions too (the usual
way a cycle is hidden) and needs nothing imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "batchscore"
# Only the two front doors import batchscore modules lazily, so that they cost nothing until
# used: the command line (`--help` and `validate` stay free of torch) and the package root,
# whose module `__getattr__` imports the Python API (torch, transformers) on first use so that
# `import batchscore` stays cheap. Anywhere else an import inside a function would be a cycle
# dodged, not a cost saved.
LAZY_ALLOWED = {"batchscore.cli", "batchscore"}
MAX_LINES = 400  # a module past this is a question to ask (STYLE.md), not a number to squeeze under


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
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines; split it by idea"


def test_the_tree_names_the_rooms():
    """Every room the README's "How it is built" describes is a package here, and vice versa."""
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == {"job", "pipeline", "output", "precision", "models", "engines", "storage",
                     "observe", "work", "runtime", "measure", "recipes"}  # fmt: skip
    readme = (PACKAGE.parent / "README.md").read_text()
    section = readme.split("## How it is built", 1)[1].split("\n## ", 1)[0]
    for room in rooms:
        assert f"{room}/" in section, f"README's 'How it is built' does not describe {room}/"
