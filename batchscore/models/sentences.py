"""Split prose into sentences without a model: paragraphs on blank lines, then end punctuation.

Good enough for extractive summaries of English prose and documentation; abbreviations and
initials ("e.g.", "J. Smith") are not taken as sentence ends.
"""

from __future__ import annotations

import re

ABBREVIATIONS = {
    "e.g", "i.e", "etc", "vs", "cf", "mr", "mrs", "ms", "dr", "prof", "st", "no", "fig", "al",
    "approx", "dept", "est", "inc", "ltd", "jr", "sr", "co", "corp", "vol", "eq", "sec", "ch",
}  # fmt: skip
PARAGRAPH = re.compile(r"\n\s*\n")
END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]*[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text`` in order, whitespace collapsed, empty pieces dropped."""
    sentences: list[str] = []
    for paragraph in PARAGRAPH.split(text):
        flat = " ".join(paragraph.split())
        start = 0
        for match in END.finditer(flat):
            head = flat[start : match.start()]
            last_word = head.rsplit(" ", 1)[-1].rstrip(".!?").lower()
            if head.endswith(".") and (last_word in ABBREVIATIONS or len(last_word) == 1):
                continue  # "e.g. Foo" or an initial: not a sentence end
            sentences.append(flat[start : match.end()].strip())
            start = match.end()
        if flat[start:].strip():
            sentences.append(flat[start:].strip())
    return sentences
