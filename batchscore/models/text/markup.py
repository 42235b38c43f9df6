"""The prose of a document written in Markdown or reStructuredText (docstrings, READMEs, docs).

Extractive summaries are made of a document's sentences, and markup is not sentences: headings
(``## License``, a title over ``=====``), rule lines, tables (pipe tables with or without outer
pipes, grid tables, reST simple tables), code (fenced, after ``::``, doctests, a ``.. code::
python`` directive's body, indented lines after a line that ends in ":"), link targets and badge
lines. This keeps the paragraphs a reader would read as text, one block each, with inline links
reduced to their words and list markers dropped. A block that ends in ":" introduces what comes
next, and what comes next is often one of those; `sentences` leaves such a lead-in out.
Line-based and forgiving: text that is not markup passes as is.
"""

from __future__ import annotations

import re

FENCE = re.compile(r"\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"\s{0,3}#{1,6}(\s|$)")
RULE = re.compile(r"\s*([-=~_*#+^\"'`:.])(\s*\1){2,}\s*")  # ----, ====, * * *, ~~~ ...
TABLE = re.compile(r"\s*(\|.*\||\+[-=+:]+\+)\s*")
DELIMITER = re.compile(r"\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)+\|?\s*")  # a pipe table's |---|:--|
SIMPLE_TABLE = re.compile(r"\s*={2,}( +={2,})+\s*")  # reST: a simple table's border, "===  ==="
# A lead-in's end: a colon (or the full-width one of CJK text), inside closing emphasis if any
LEAD_IN = re.compile(r"[:\uff1a][\s*_`]*\Z")
EXPLICIT = re.compile(r"(\s*)\.\.(\s|$)")  # reST: directive, comment, target, footnote
DIRECTIVE = re.compile(r"\s*\.\.\s+([\w:-]+)::")
LINK_TARGET = re.compile(r"\s{0,3}\[[^\]]+\]:\s*\S+")  # [name]: https://...
DOCTEST = re.compile(r"\s*(>>>|\.\.\.)(\s|$)")
BULLET = re.compile(r"\s*(?:[-*+•]|\d+[.)]|#\.|>)\s+")
IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
REST_LINK = re.compile(r"`([^`<]*?)\s*<[^>]*>`_{1,2}")
TAG = re.compile(r"<[^>\n]+>")
URL = re.compile(r"\b\w+://\S+")
SECTION = re.compile(r"\s*[^\W\d_][\w ()-]{0,24}:\s*")  # Args:, Returns:, With pip:
# Directives whose body is prose (notes, warnings); the others hold code, math, tables, files.
PROSE_DIRECTIVES = {
    "note", "warning", "tip", "hint", "important", "caution", "attention", "danger", "error",
    "admonition", "seealso", "deprecated", "versionadded", "versionchanged", "topic", "sidebar",
}  # fmt: skip


def indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def words_only(line: str) -> str:
    """A line with inline markup reduced to its words: links to their text, no images or tags."""
    line = IMAGE.sub("", line)
    line = LINK.sub(r"\1", line)
    line = REST_LINK.sub(r"\1", line)
    return URL.sub("", TAG.sub("", line))


def is_markup(line: str, following: str, opens_block: bool) -> bool:
    """A line that is markup alone: a heading (or a title over its underline), a rule, a table
    row, border or header, a link target, or a short header opening a block (``Args:``)."""
    return bool(
        HEADING.match(line)
        or RULE.fullmatch(line)
        or TABLE.fullmatch(line)
        or LINK_TARGET.match(line)
        or (opens_block and SECTION.fullmatch(line))
        or (RULE.fullmatch(following) and not RULE.fullmatch(line))
        or ("|" in line and DELIMITER.fullmatch(following))
    )


def prose(text: str) -> list[str]:
    """The prose blocks (paragraphs, list items) of ``text``, in order."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    blocks: list[list[str]] = [[]]
    fence, example, deeper = "", False, -1  # what is being skipped
    table = simple = False
    intro = -1  # where the text of a prose line ending in ":" starts: it may introduce code
    for i, line in enumerate(lines):
        stripped, fenced = line.strip(), FENCE.match(line)
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if intro >= 0 and stripped and deeper < 0 and not fence:
            # "... as follows:" (or "Usage:"), a blank line, then deeper lines (not a list): a
            # code sample. Deeper lines right under it are its definition (reST, ``Args:``) or
            # its continuation.
            if not lines[i - 1].strip() and indent(line) > intro and not BULLET.match(line):
                deeper = intro
            intro = -1
        if fence:  # a fenced code block, to its closing fence
            fence = "" if stripped.startswith(fence) else fence
            continue
        if example:  # a doctest's output, to the next blank line
            example = bool(stripped)
            continue
        if deeper >= 0:  # the indented body of a directive or of a "::" paragraph
            if not stripped or indent(line) > deeper:
                continue
            deeper = -1
        if table:  # a pipe table's rows, to the first line without a pipe
            if "|" in stripped:
                continue
            table = False
        if simple:  # a simple table's rows, to a border with a blank line (or nothing) after it
            simple = not (SIMPLE_TABLE.fullmatch(line) and not following.strip())
            continue
        if not stripped:
            pass
        elif fenced:
            fence = fenced.group(1)
        elif SIMPLE_TABLE.fullmatch(line):
            simple = True
        elif DELIMITER.fullmatch(line):
            table = True
        elif EXPLICIT.match(line):  # reST explicit markup: a prose directive keeps its text
            directive = DIRECTIVE.match(line)
            if directive and directive.group(1).lower() in PROSE_DIRECTIVES:
                blocks.append([words_only(line.split("::", 1)[1])])
            else:
                deeper = indent(line)
        elif DOCTEST.match(line):
            example = True
        elif not is_markup(line, following, not blocks[-1]):
            at = indent(line)  # where the line's text starts
            if bullet := BULLET.match(line):  # each list item is a block of its own
                blocks.append([])
                at, line = len(bullet.group()), line[len(bullet.group()) :]
            literal = line.rstrip().endswith("::")  # reST: an indented literal block follows
            blocks[-1].append(words_only(line.rstrip()[:-1] if literal else line))
            intro = at if LEAD_IN.search(line) and not literal else -1
            if not literal:
                continue
            deeper = at
        elif LEAD_IN.search(line):  # a header that ends in ":" may introduce code as well
            intro = indent(line)
        blocks.append([])
    return [" ".join(" ".join(block).split()) for block in blocks if any(b.strip() for b in block)]
