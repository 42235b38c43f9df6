"""Summaries hold no lead-ins: no sentence that ends in ":" and introduces a list, a table or a
code block. A property over generated Markdown and reST documents, and the summaries of the
installed packages' own READMEs (their METADATA long descriptions), which no one here wrote."""

from __future__ import annotations

import functools
import re
import textwrap
from importlib.metadata import distributions

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscore.job.sections import InputConfig, ModelConfig, SummarizeConfig
from batchscore.models.summarize import SummarizeTask
from batchscore.models.text.markup import prose
from batchscore.models.text.sentences import split_sentences, summary_sentences
from batchscore.pipeline.sampler import form_batches, restore
from batchscore.runtime.executor import Executor

# Plain words: none an abbreviation or an initial, so each generated sentence splits as written.
WORDS = ["model", "batch", "score", "shard", "window", "token", "reader", "writer", "vector"]
COLONS = (":", "\uff1a")  # and the full-width colon of CJK text


def ends_in_colon(sentence: str) -> bool:
    """The test's own reading of a lead-in: a sentence whose last character, closing emphasis
    aside, is a colon (ASCII or full-width)."""
    return sentence.rstrip("*_` ").endswith(COLONS)


@st.composite
def sentences(draw: st.DrawFn) -> str:
    words = draw(st.lists(st.sampled_from(WORDS), min_size=3, max_size=9))
    return " ".join(words).capitalize() + draw(st.sampled_from([".", "!", "?"]))


@st.composite
def lead_ins(draw: st.DrawFn) -> str:
    """A colon line: plain, in emphasis, in Chinese (a full-width colon), or boto3's own."""
    words = " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=2, max_size=9)))
    return draw(
        st.sampled_from(
            [
                f"{words.capitalize()}:",
                f"**{words.capitalize()}:**",
                "使用以下命令安装这个软件包\uff1a",
                "Then, you can install boto3 from PyPI with:",
            ]
        )
    )


# What a lead-in introduces: (markup, whether it may follow the colon line with no blank line
# between, as Markdown allows a list, a pipe table or a fence to; reST wants the blank line).
CODE = "batchscore run model window\nbatchscore score vector column"
FOLLOWERS = {
    "pipe table": (
        "| name | value |\n|------|:-----:|\n| model | batch |\n| token | shard |",
        True,
    ),
    "bare pipe table": ("name | value\n--- | ---\nmodel | batch\ntoken | shard", True),
    "grid table": (
        "+-------+-------+\n| name  | value |\n+=======+=======+\n| model | batch |\n"
        "+-------+-------+",
        True,
    ),
    "simple table": ("=====  =====\nname   value\n=====  =====\nmodel  batch\n=====  =====", False),
    "fence": (f"```python\n{CODE}\n```", True),
    "tilde fence": (f"~~~\n{CODE}\n~~~", True),
    "indented code": (textwrap.indent(CODE, "    "), False),
    "code directive": (f".. code-block:: python\n\n{textwrap.indent(CODE, '   ')}", False),
    "doctest": (">>> batchscore score model\n'window token'", True),
}


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A Markdown or reST document of paragraphs, lists and headings, with lead-ins before
    lists, tables and code; and its prose sentences, in order (what a summary may pick)."""
    parts: list[str] = []
    expected: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["paragraph", "heading", "lead-in", "list", "literal"]))
        if kind == "paragraph":
            said = draw(st.lists(sentences(), min_size=1, max_size=3))
            parts.append(textwrap.fill(" ".join(said), draw(st.integers(30, 90))))
            expected += said
        elif kind == "heading":
            title = " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4)))
            parts.append(draw(st.sampled_from([f"## {title}", f"{title}\n{'=' * len(title)}"])))
        elif kind in ("lead-in", "list"):
            lead_in = draw(lead_ins())
            if kind == "list":
                items = draw(st.lists(sentences(), min_size=1, max_size=3))
                marker = draw(st.sampled_from(["- ", "* ", "1. "]))
                follower, tight = "\n".join(marker + item for item in items), True
                expected += items
            else:
                follower, tight = FOLLOWERS[draw(st.sampled_from(sorted(FOLLOWERS)))]
            between = "\n" if tight and draw(st.booleans()) else "\n\n"
            parts.append(lead_in + between + follower)
        else:  # reST: "text::" then an indented literal block
            words = " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=2, max_size=6)))
            marker = draw(st.sampled_from(["::", " ::"]))
            parts.append(f"{words.capitalize()}{marker}\n\n{textwrap.indent(CODE, '   ')}")
    return "\n\n".join(parts) + "\n", expected


def made_of(summary: str, parts: list[str]) -> bool:
    """Whether ``summary`` is some of ``parts`` (sentences) joined by spaces, in their order."""

    @functools.cache
    def fits(at: int, first: int) -> bool:
        if at == len(summary):
            return True
        for k in range(first, len(parts)):
            end = at + len(parts[k])
            if summary.startswith(parts[k], at) and (
                end == len(summary) or (summary[end] == " " and fits(end + 1, k + 1))
            ):
                return True
        return False

    return bool(summary) and fits(0, 0)


def chosen_lead_ins(document: str, summary: str) -> list[str]:
    """The colon-ended sentences of the document's prose that stand whole in its summary (read
    without `summary_sentences`, which leaves them out)."""
    found = {s for block in prose(document) for s in split_sentences(block) if ends_in_colon(s)}
    return sorted(s for s in found if f" {s} " in f" {summary} ")


@settings(max_examples=400, deadline=None)
@given(documents())
def test_no_candidate_sentence_is_a_lead_in(document):
    text, expected = document
    candidates = summary_sentences(text)
    assert not any(ends_in_colon(s) for s in candidates)
    if expected:  # drawn from the document's prose: every sentence of it, and nothing else
        assert candidates == expected


@pytest.fixture(scope="module")
def task(minilm_path):
    model = ModelConfig(task="summarize", precision="fp32")
    options = SummarizeConfig(sentences=3)
    inp, executor = InputConfig(path=()), Executor(model)
    return SummarizeTask(minilm_path, model=model, options=options, inp=inp, executor=executor)


def summarize(task: SummarizeTask, texts: list[str]) -> list[str]:
    encoded = task.encode(pa.table({"text": texts}))
    batches = form_batches(encoded.lengths, 8192, 256)
    results = restore(batches, [task.forward(encoded, b) for b in batches], np.empty(0))
    return task.finish(encoded, results)["summary"].to_pylist()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(documents(), min_size=1, max_size=4))
def test_no_chosen_sentence_is_a_lead_in(task, docs):
    texts = [text for text, _ in docs]
    for (text, expected), summary in zip(docs, summarize(task, texts), strict=True):
        assert not chosen_lead_ins(text, summary)
        if expected:  # generated prose holds no colon: one in the summary would be a lead-in's
            assert not any(colon in summary for colon in COLONS)
            assert made_of(summary, expected)


# What starts a list, a table or code on the line after a lead-in, read from the raw text
STARTS = re.compile(r"\s*([-*+]\s|\d+[.)]\s|\||\+[-=]|`{3}|~{3}|>>>|\$ |={2,}\s|\.\. \w*code)")
RAW_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)|`([^`<]*?)\s*<[^>]*>`_{1,2}")


def plain(text: str) -> str:
    """Text with links reduced to their words and emphasis and code marks dropped."""
    text = RAW_LINK.sub(lambda m: m.group(1) or m.group(2) or "", text)
    return " ".join(text.translate(str.maketrans("", "", "*_`")).split())


def raw_lead_ins(text: str) -> list[str]:
    """The lead-ins of a document read from its raw lines, not through `prose`: the last three
    words (colon included) of each line that ends in a colon and is followed, after blank lines,
    by a line that starts a list, a table or code, or is indented deeper (a code sample)."""
    lines = text.replace("\r\n", "\n").split("\n")
    found = []
    for i, line in enumerate(lines):
        following = next((n for n in lines[i + 1 :] if n.strip()), "")
        deeper = len(following) - len(following.lstrip()) > len(line) - len(line.lstrip())
        if ends_in_colon(line.strip()) and following and (STARTS.match(following) or deeper):
            words = plain(re.sub(r"^\s*([-*+]|\d+[.)])\s+", "", line)).split()
            if words:
                found.append(" ".join(words[-3:]))
    return found


def readmes(count: int) -> dict[str, str]:
    """The long descriptions of the first ``count`` installed packages (by name) that have one
    of some length; batchscore's and its bundled model's, written here, left out."""
    found: dict[str, str] = {}
    for dist in distributions():
        name = (dist.metadata["Name"] or "").lower()
        body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        if name and name != "batchscore" and not name.startswith("gt-") and len(body) >= 500:
            found.setdefault(name, body)
    assert len(found) >= count, f"only {len(found)} installed packages have a README"
    return {name: found[name] for name in sorted(found)[:count]}


def test_readme_summaries_hold_no_lead_ins(task):
    docs = readmes(100)
    summaries = summarize(task, list(docs.values()))
    offered = sum(
        any(ends_in_colon(s) for block in prose(text) for s in split_sentences(block))
        for text in docs.values()
    )
    holding = {
        name: found
        for (name, text), summary in zip(docs.items(), summaries, strict=True)
        if (found := chosen_lead_ins(text, summary))
    }
    raw = {name: raw_lead_ins(text) for name, text in docs.items()}
    held = {
        name: found
        for name, summary in zip(docs, summaries, strict=True)
        if (found := [key for key in raw[name] if f" {key} " in f" {plain(summary)} "])
    }
    print(
        f"\n{len(docs)} READMEs, {offered} with lead-ins ({sum(map(bool, raw.values()))} read "
        f"from their raw lines): {len(holding)} summaries hold one ({len(held)} by the raw lines)"
    )
    assert len(holding) <= 2, holding
    assert len(held) <= 2, held
    for text, summary in zip(docs.values(), summaries, strict=True):
        assert made_of(summary, summary_sentences(text))  # drawn from the document
