"""batchscore installs like a library and runs like a tool: `pip install batchscore` brings what
a job needs at run time and nothing a test needs, each optional feature sits behind an extra
that names itself when it is missing, and `make score` installs exactly the extras the shipped
jobs use.

Read from pyproject.toml, the Makefile and the source (with `ast`); the installed
distributions' metadata says which import names each distribution provides and what it
requires, so these checks run in the environment `make test` makes, where every extra is
installed. The shipped jobs themselves run as real subprocesses, and every module they import
is traced back to the distribution that provides it.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pytest
import sample_corpus
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from batchscore.errors import JobError
from batchscore.job.parse import load_job
from batchscore.models.source.locate import BUILTIN
from tests.commands import environment

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
RUNTIME = PROJECT["dependencies"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]
TOOLS = ("dev", "bench")  # the tests' and the benchmarks' sets: for this repository, not users
OPTIONAL = sorted(set(EXTRAS) - set(TOOLS))
JOBS = sorted((ROOT / "jobs").glob("*.toml"))
# The test tools the issue found in every `make score`: none of them, nor what only tests use,
# may reach a job's environment, not even as a dependency of a dependency
NEVER_AT_RUN_TIME = {
    "pytest", "hypothesis", "ruff", "ray", "moto", "boto3", "selenium", "openai", "duckdb",
    "deltalake", "pandas", "matplotlib", "jsonschema",
}  # fmt: skip
# Schemes pyarrow.fs serves itself; any other input URL is read through fsspec
PYARROW_SCHEMES = {"", "file", "s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs"}


def names(requirements: Iterable[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def providers() -> dict[str, set[str]]:
    """Import name -> the distributions (canonical names) installed here that provide it."""
    return {
        module: {canonicalize_name(d) for d in dists}
        for module, dists in metadata.packages_distributions().items()
    }


def closure(requirements: Iterable[str]) -> tuple[set[str], set[str]]:
    """Every distribution ``requirements`` bring on this platform, theirs included, as pip
    resolves them (a requirement's extras followed); and those not installed here to read."""
    found: dict[str, set[str]] = {}
    missing: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in found and set(req.extras) <= found[name]:
            continue
        extras = found.setdefault(name, set())
        extras |= set(req.extras)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            missing.add(name)
            continue
        for text in requires:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in {"", *extras}):
                dep.marker = None
                todo.append(dep)
    return set(found), missing


def third_party_imports() -> dict[str, set[str]]:
    """Top-level module name -> where batchscore imports it (``module.py`` for its top level,
    ``module.py:function`` inside a function), outside the standard library."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "batchscore").rglob("*.py")):
        tree = ast.parse(path.read_text())
        where = path.relative_to(ROOT).as_posix()
        inner = {
            id(n): f"{where}:{f.name}"
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            for n in ast.walk(f)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top != "batchscore" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(inner.get(id(node), where))
    return found


def makefile_job_extras() -> set[str]:
    match = re.search(r"^JOB_EXTRAS\s*:?=\s*(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert match, "the Makefile no longer says which extras `make score` installs (JOB_EXTRAS)"
    return {extra.strip() for extra in match.group(1).split(",") if extra.strip()}


def make_score_requirements() -> list[str]:
    """What `make score` installs: the runtime dependencies and those of its extras."""
    return [*RUNTIME, *(p for extra in sorted(makefile_job_extras()) for p in EXTRAS[extra])]


# -- the runtime: what the package imports, and nothing a test needs ---------------------------


def test_every_import_is_a_runtime_dependency_or_an_extra():
    """Each third-party module batchscore imports comes from a runtime dependency or from an
    optional extra, and one imported at a module's top (so by every command) from a runtime
    dependency: a plain install can import every module."""
    runtime = names(RUNTIME)
    optional = names(p for extra in OPTIONAL for p in EXTRAS[extra])
    provided = providers()
    problems = []
    for module, places in sorted(third_party_imports().items()):
        dists = provided.get(module)
        if not dists:
            problems.append(f"{module} ({sorted(places)}): installed by no distribution here")
        elif not dists & (runtime | optional):
            problems.append(f"{module} ({sorted(places)}): {sorted(dists)} is not declared")
        elif not dists & runtime and any(":" not in place for place in places):
            top = sorted(p for p in places if ":" not in p)
            problems.append(f"{module}: an extra's module imported at the top of {top}")
    assert not problems, "\n".join(problems)


def test_every_runtime_dependency_is_used():
    """The runtime list holds only what the package imports (the built-in model's weights
    package by its table, `BUILTIN`): nothing is installed for a job that no job reads."""
    provided = providers()
    imported = {d for module in third_party_imports() for d in provided.get(module, ())}
    imported |= {canonicalize_name(dist) for _, dist in BUILTIN.values()}
    unused = names(RUNTIME) - imported
    assert not unused, f"runtime dependencies batchscore never imports: {sorted(unused)}"


def test_no_test_tool_is_a_runtime_dependency():
    """No package of the dev or bench set is a runtime dependency, and none of the tools the
    tests use reaches the runtime through a dependency either."""
    tools = names(p for extra in TOOLS for p in EXTRAS[extra]) - names(
        p for extra in OPTIONAL for p in EXTRAS[extra]
    )
    assert not names(RUNTIME) & tools
    brought, missing = closure(make_score_requirements())
    assert not missing, f"not installed here, so not checked: {sorted(missing)} (make test)"
    assert not brought & NEVER_AT_RUN_TIME, sorted(brought & NEVER_AT_RUN_TIME)


def test_torch_is_a_range_users_can_install():
    """torch is a lower bound (any CPU or CUDA build of a release since), never a local
    version such as ``+cpu``: pip finds those only on PyTorch's own indexes."""
    (torch,) = [
        Requirement(r) for r in RUNTIME if canonicalize_name(Requirement(r).name) == "torch"
    ]
    assert torch.specifier and all(s.operator in (">=", "<", "!=") for s in torch.specifier)
    assert "+" not in str(torch.specifier)


# -- the extras: each names itself where it is missing --------------------------------------


def guard_ray() -> None:
    from batchscore.engines.ray import import_ray

    import_ray()


def guard_fsspec() -> None:
    from batchscore.storage.fs import filesystem

    filesystem("batchscore-test-scheme://bucket/shard.parquet")  # a scheme pyarrow lacks


def guard_delta() -> None:
    from batchscore.output.delta import Table

    Table(None, lineage={})  # type: ignore[arg-type]  (refused before the store is read)


def guard_iceberg() -> None:
    from batchscore.output.iceberg import Table

    Table(None, lineage={})  # type: ignore[arg-type]  (refused before the store is read)


def guard_images() -> None:
    from batchscore.models.vision.pictures import pillow

    pillow()


def guard_report() -> None:
    from batchscore.observe.html import matplotlib_figure

    matplotlib_figure()


def guard_structured() -> None:
    from batchscore.models.generation.structure import engine

    engine()


# extra -> the package's own check, called where the job or command first needs the extra
GUARDS: dict[str, Callable[[], None]] = {
    "ray": guard_ray,
    "fsspec": guard_fsspec,
    "delta": guard_delta,
    "iceberg": guard_iceberg,
    "images": guard_images,
    "report": guard_report,
    "structured": guard_structured,
}


def test_every_extra_has_a_guard():
    assert set(GUARDS) == set(OPTIONAL), "an extra without a check that names it, or vice versa"


@pytest.mark.parametrize("extra", OPTIONAL)
def test_a_missing_extra_names_itself(extra: str, monkeypatch: pytest.MonkeyPatch):
    """With the extra's modules unimportable (as in an environment without them: a None in
    sys.modules makes `import` raise ImportError), the code's own check refuses with a
    `JobError` that names the extra to install."""
    provided = providers()
    packages = names(EXTRAS[extra])
    modules = sorted(m for m, dists in provided.items() if dists & packages)
    assert modules, f"{extra}: {sorted(packages)} not installed here (make test installs it)"
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(JobError, match=re.escape(f"batchscore[{extra}]")):
        GUARDS[extra]()


# -- the shipped jobs: what `make score` installs runs every one of them ----------------------

# extra -> whether a job needs it at run time (`batchscore report` alone needs `report`)
NEEDS: dict[str, Callable[[Any], bool]] = {
    "images": lambda job: job.input.image is not None,
    "structured": lambda job: any(
        getattr(job.options, key, None) is not None for key in ("json_schema", "choices", "regex")
    ),
    "delta": lambda job: job.output.format == "delta",
    "iceberg": lambda job: job.output.format == "iceberg",
    "ray": lambda job: job.engine == "ray",
    "fsspec": lambda job: any(urlsplit(p).scheme not in PYARROW_SCHEMES for p in job.input.path),
    "report": lambda job: False,
}


def test_make_score_installs_the_extras_the_shipped_jobs_need():
    """`make score` installs (JOB_EXTRAS) each extra a job in jobs/ needs, and no other."""
    assert set(NEEDS) == set(OPTIONAL), "a new extra: say which jobs need it (NEEDS)"
    needed = {
        extra: sorted(path.name for path in JOBS if need(load_job(path)))
        for extra, need in NEEDS.items()
    }
    assert makefile_job_extras() == {extra for extra, jobs in needed.items() if jobs}, needed


def test_make_score_builds_what_each_shipped_job_reads():
    """`make score JOB=jobs/X.toml` builds the example data and model the job reads (the
    Makefile's EXAMPLE_ entries; the sample corpus always): each path a shipped job reads under
    data/ or models/ is one its example's rule writes."""
    text = (ROOT / "Makefile").read_text()
    example = dict(re.findall(r"^EXAMPLE_(\S+)\s*:=\s*\$\((\w+)\)$", text, re.M))
    assert set(example) <= {f"jobs/{job.name}" for job in JOBS}, "an example for no shipped job"
    for job in JOBS:
        table = tomllib.loads(job.read_text())
        paths = table["input"]["path"]
        reads = [*([paths] if isinstance(paths, str) else paths), table["model"].get("path")]
        local = [os.path.normpath(f"jobs/{p}") for p in reads if p and not urlsplit(p).scheme]
        built = [p for p in local if p.startswith(("data/", "models/"))]
        built = [p for p in built if not p.startswith("data/docs")]  # the corpus: always built
        if not built:
            continue
        variable = example.get(f"jobs/{job.name}")
        assert variable, f"make score JOB=jobs/{job.name} builds nothing it reads: {built}"
        stamp = re.search(rf"^{variable}\s*:=\s*(\S+)$", text, re.M).group(1)
        recipe = text.split(f"\n$({variable}):", 1)[1].split("\n\n", 1)[0]
        for path in built:
            assert any(path.startswith(w) for w in recipe.split() if "/" in w), (job.name, path)
        assert stamp.rsplit("/", 1)[0] in recipe, (variable, stamp)


def site_of(dists: Iterable[str], folder: Path) -> Path:
    """``folder`` made a site-packages holding ``dists`` alone: a link to each top-level file
    or folder of theirs (their modules, shared libraries and metadata), as their install wrote
    them."""
    folder.mkdir()
    for name in dists:
        dist = metadata.distribution(name)
        for top in {f.parts[0] for f in dist.files or () if f.parts[0] != ".."}:
            real = Path(dist.locate_file(top))
            if real.exists() and not (folder / top).exists():
                (folder / top).symlink_to(real)
    return folder


# Each job named runs through the CLI, in this process: any exit status but 0 is printed
RUN_JOBS = """
import sys

from batchscore.cli import main

for job in sys.argv[1:]:
    try:
        main(["run", job, "--progress", "off", "-q", "--set", 'model.precision="fp32"'])
    except SystemExit as done:
        print(job, done.code, flush=True)
"""


@pytest.mark.slow
def test_the_shipped_jobs_run_with_only_what_make_score_installs(
    tmp_path: Path, small_corpus: pa.Table, examples: Path
):
    """Every job in jobs/ runs to exit 0 (fp32, on a sliver of the sample data laid out as the
    repository lays it out) in a Python that sees only the standard library and the
    distributions `make score` installs (the runtime dependencies, its extras, and theirs):
    `-S` leaves this environment's site-packages out, and a folder of links to those
    distributions alone stands in for it, so a package only the dev set installs is absent
    there, to `import` and to `importlib` alike."""
    shutil.copytree(ROOT / "jobs", tmp_path / "jobs")
    shutil.copytree(examples, tmp_path, dirs_exist_ok=True)
    sample_corpus.write_shards(small_corpus.slice(0, 40), tmp_path / "data" / "docs", shards=1)
    allowed, missing = closure(make_score_requirements())
    assert not missing, f"not installed here: {sorted(missing)} (make test installs them)"
    site = site_of(allowed, tmp_path / "site-packages")
    assert not (site / "pytest").exists() and not (site / "pandas").exists()
    jobs = [str(tmp_path / "jobs" / job.name) for job in JOBS]
    done = subprocess.run(
        [sys.executable, "-S", "-c", RUN_JOBS, *jobs],
        env=environment(PYTHONPATH=f"{ROOT}{os.pathsep}{site}"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [f"{job} 0" for job in jobs], done.stderr[-3000:]
