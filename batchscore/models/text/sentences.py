"""Split prose into sentences without a model, in more than English.

A sentence ends at a run of ``.``, ``!``, ``?`` or ``…`` (``?!`` and ``...`` are one end) that is
followed by space and then by anything but a lowercase letter, so scripts without case
(Devanagari, Arabic, ...) split too; the CJK full stop, exclamation and question marks end a
sentence with or without the space. A single full stop after an abbreviation (``e.g.``, ``Dr.``,
``z.B.``, Russian ones too) or an initial (``J. R.``) does not. `summary_sentences` reads a
document's prose first (`markup.py`) and keeps only fragments that read as sentences: never a
lead-in, the sentence that ends in a colon ("Then, you can install boto3 from PyPI with:").
"""

from __future__ import annotations

import re

from batchscore.models.text.markup import LEAD_IN, prose

ABBREVIATIONS = {
    # English
    "e.g", "i.e", "etc", "vs", "cf", "mr", "mrs", "ms", "dr", "prof", "st", "no", "fig", "al",
    "approx", "dept", "est", "inc", "ltd", "jr", "sr", "co", "corp", "vol", "eq", "sec", "ch",
    "incl", "resp", "ref", "nos", "pp", "ed", "eds", "ca", "viz",
    # German, French, Spanish, Italian, Portuguese
    "bzw", "usw", "vgl", "evtl", "ggf", "inkl", "nr", "str", "hr", "fr", "bspw", "zb",
    "mme", "mlle", "env", "sra", "sres", "pág", "núm", "sig", "ecc", "sig.ra", "dott",
    # Russian
    "т.е", "т.д", "т.п", "др", "гг", "см", "стр", "им", "ул", "проф", "напр",  # noqa: RUF001
}  # fmt: skip
WIDE_END = "\u3002\uff01\uff1f\uff61"  # CJK: a sentence ends here even without a space after it
CLOSERS = (
    "\"')]\u201d\u2019\u201c\u2018\u00bb\u300d\u300f\uff09"  # quotes and brackets after an end
)
OPENERS = "\"'([\u201c\u2018\u00ab\u00bf\u00a1\u300c\u300e\uff08"
END = re.compile(f"(?:[.!?\u2026]+|[{WIDE_END}\u0964\u0965\u061f\u06d4]+)[{re.escape(CLOSERS)}]*")
PARAGRAPH = re.compile(r"\n\s*\n")
UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u0e00-\u0e7f]")
MIN_WORDS = 3


def is_abbreviation(head: str) -> bool:
    """Whether the full stop ending ``head`` belongs to its last word, not to a sentence."""
    word = head.rsplit(None, 1)[-1].strip(OPENERS + ".").lower() if head.strip() else ""
    parts = word.split(".")
    return (
        word in ABBREVIATIONS
        or (len(word) == 1 and word.isalpha())  # an initial
        or (len(parts) > 1 and all(0 < len(p) <= 2 and p.isalpha() for p in parts))  # U.S.
    )


def ends_here(flat: str, match: re.Match) -> bool:
    """Whether the punctuation ``match`` found in ``flat`` ends a sentence."""
    mark, after = match.group(), flat[match.end() :]
    if mark[0] in WIDE_END:
        return True
    if after and not after[0].isspace():
        return False  # 3.14, file.py, "a?b"
    rest = after.lstrip().lstrip(OPENERS)
    if rest[:1].islower():
        return False
    return not (mark.rstrip(CLOSERS) == "." and is_abbreviation(flat[: match.start()]))


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text`` in order, whitespace collapsed, empty pieces dropped."""
    sentences: list[str] = []
    for paragraph in PARAGRAPH.split(text):
        flat = " ".join(paragraph.split())
        start = 0
        for match in END.finditer(flat):
            if match.end() > start and ends_here(flat, match):
                if piece := flat[start : match.end()].strip():
                    sentences.append(piece)
                start = match.end()
        if flat[start:].strip():
            sentences.append(flat[start:].strip())
    return sentences


def word_count(sentence: str) -> int:
    """Words, counting two characters of a script written without spaces (CJK, Thai) as one."""
    return sum(max(1, len(UNSPACED.findall(w)) // 2) for w in sentence.split())


def is_lead_in(fragment: str) -> bool:
    """Whether a fragment ends in a colon. A colon never ends a sentence inside a block of
    prose (`split_sentences` ends none there), so such a fragment is the end of its block, and
    it introduces what follows: a list, a table, a code sample (``You can install it with:``).
    Alone in a summary it points at nothing."""
    return LEAD_IN.search(fragment) is not None


def is_sentence(fragment: str) -> bool:
    """Whether a fragment reads as a sentence: some letters, a few words, not a lead-in
    (``With pip:``, ``Then, you can install boto3 from PyPI with:``)."""
    if word_count(fragment) < MIN_WORDS or not any(ch.isalpha() for ch in fragment):
        return False
    return not is_lead_in(fragment)


def summary_sentences(text: str) -> list[str]:
    """The sentences of a document's prose a summary may pick, in order. A document with none
    (a title, a code listing) keeps what it has but its lead-ins, so every document gets a
    summary, drawn from it."""
    found = [s for block in prose(text) for s in split_sentences(block)]
    kept = [s for s in found if is_sentence(s)]
    if kept:
        return kept
    usable = [s for s in found if not is_lead_in(s)]
    # the raw text, where a lead-in may share a "sentence" with the table or code it introduces
    lines = [line for line in text.splitlines() if not is_lead_in(line)]
    whole = [s for s in split_sentences("\n".join(lines)) if not is_lead_in(s)]
    return usable or whole or [" ".join(text.split())]
