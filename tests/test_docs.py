"""The documentation's links hold: every relative link in the README, BENCHMARKS.md and the pages
under docs/ names a file or folder of the repository, and an anchor (``page.md#heading``) names a
heading of that page as GitHub renders its id; every ``make`` target the README names is one the
Makefile defines, so the README's commands run as written on a fresh clone.

Read from the files as they are, with nothing imported: links are taken from the prose (not from
fenced code blocks or inline code, where brackets are TOML or Python), headings likewise.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target), text holding at most one level of nested brackets
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
MAKE = re.compile(r"(?:^|[\s(;&|])make\s+([A-Za-z0-9][\w.-]*)")


def split_code(text: str) -> tuple[list[tuple[int, str]], list[str]]:
    """The page's prose lines (numbered, inline code blanked out) and its code: the fenced
    blocks' lines and the inline code spans."""
    prose: list[tuple[int, str]] = []
    code: list[str] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            code.append(line)
            continue
        code += [span for _, span in CODE_SPAN.findall(line)]
        prose.append((number, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)))
    return prose, code


def slug(heading: str) -> str:
    """A heading's id as GitHub makes it: its rendered text, lowercased, every character but
    letters, digits, ``_``, ``-`` and spaces dropped, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = text.replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The ids of a page's headings (outside code blocks); a repeated one gets ``-1``, ``-2``,
    ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    """Every relative link of ``page`` whose file, folder or heading is not there."""
    prose, _ = split_code(page.read_text())
    problems = []
    for number, line in prose:
        for target in LINK.findall(line):
            if SCHEME.match(target):
                continue  # http(s), mailto: not this repository's to check
            path_part, _, anchor = target.partition("#")
            linked = (page.parent / path_part).resolve() if path_part else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            if ROOT not in (linked, *linked.parents):
                problems.append(f"{where}: points outside the repository")
            elif not linked.exists():
                problems.append(f"{where}: no such file")
            elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
                problems.append(f"{where}: no heading #{anchor} in {linked.name}")
    return problems


def makefile_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^([^\s:=#][^:=]*?)\s*:(?!=)", line)
        if match:
            targets.update(match.group(1).split())
    return targets


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    problems = broken_links(page)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_make_target_the_readme_names_exists():
    _, code = split_code((ROOT / "README.md").read_text())
    named = {target for line in code for target in MAKE.findall(line)}
    assert {"score", "test"} <= named, "the README no longer shows `make score` and `make test`"
    missing = named - makefile_targets()
    assert not missing, f"the README names make targets the Makefile lacks: {sorted(missing)}"


def test_the_docs_folder_is_linked_from_the_readme():
    """A page nobody links to is a page nobody finds: each is reachable from the README, or from
    docs/README.md, which the README links to."""
    linked = set()
    for page in (ROOT / "README.md", ROOT / "docs" / "README.md", ROOT / "BENCHMARKS.md"):
        prose, _ = split_code(page.read_text())
        for _, line in prose:
            for target in LINK.findall(line):
                if not SCHEME.match(target) and target.partition("#")[0]:
                    linked.add((page.parent / target.partition("#")[0]).resolve())
    pages = {p.resolve() for p in PAGES if p.parent != ROOT}
    assert not pages - linked, f"pages no index links to: {sorted(map(str, pages - linked))}"


def test_a_broken_link_or_anchor_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The check itself: a link to a missing file and one to a missing heading are both
    reported, with their line; a good link, one in code and an outside URL are not."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "other.md").write_text('# Other\n\n## The `max_tokens = "auto"` budget\n')
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n"
        "[fine](other.md#the-max_tokens--auto-budget) and [web](https://example.com/x)\n"
        "[gone](missing.md) and [bad anchor](other.md#nowhere)\n"
        "`[not a link](missing.md)`\n"
        "```\n[also code](missing.md)\n```\n"
        "[self](#page)\n"
    )
    assert broken_links(page) == [
        "page.md:3: missing.md: no such file",
        "page.md:3: other.md#nowhere: no heading #nowhere in other.md",
    ]


def modules() -> list[str]:
    """Every module and sub-package of the package's rooms, as ``room/name``."""
    package = ROOT / "batchscore"
    found = []
    for room in sorted(p for p in package.iterdir() if (p / "__init__.py").exists()):
        for path in sorted(room.rglob("*.py")):
            if path.name != "__init__.py":
                found.append(path.relative_to(package).with_suffix("").as_posix())
    return found


@pytest.mark.parametrize("module", modules())
def test_the_architecture_page_names_every_module(module: str):
    """docs/architecture.md walks the rooms module by module: a module it does not name (one
    added, or one renamed while the page kept the old name) is a room a newcomer cannot find."""
    page = (ROOT / "docs/architecture.md").read_text()
    name = module.rsplit("/", 1)[1]
    if module.count("/") == 1:  # a room's module: named in code type, `name` or `name.py`
        named = re.search(rf"`(?:{re.escape(module)}|{re.escape(name)})(?:\.py)?`", page)
    else:  # a sub-package's module: a word of its table row
        named = re.search(rf"\b{re.escape(name)}\b", page)
    assert named, f"docs/architecture.md never names {module}"
