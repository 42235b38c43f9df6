"""A long text cut before the tokenizer: only the part that truncation keeps is tokenized.

The fast tokenizer reads a text whole and only then truncates it, so a 2 MB text costs seconds
(4.4 s for MiniLM's on one core) and the whole token list's memory, to keep 64 tokens; and a
run tokenizes its rows more than once (the quality gate's sample, the budget, calibration,
`plan`). A text longer than a `Cutter`'s ``span`` characters is first cut to about ``span``
characters at a space (its start when truncating right, its end when truncating left), where
that changes none of the tokens truncation keeps:

- the tokenizer splits its input at spaces before its model runs (its pre-tokenizer says so
  on a probe), so every word before the cut is tokenized as in the whole text;
- its normalizers change characters in place (no pattern that could reach across the cut);
- the cut text still overflows the model's window, so the tokens kept are the same ones.

The last is known only after tokenizing: a cut text that does not overflow (words the
tokenizer reads as many characters each) is tokenized again whole (`TextEncoder.encode`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# Normalizers that map each character (or a run of whitespace) on its own: what they make of
# the text before a cut is what they make of it in the whole text.
LOCAL = {
    "BertNormalizer",
    "Lowercase",
    "NFC",
    "NFD",
    "NFKC",
    "NFKD",
    "Nmt",
    "Precompiled",
    "StripAccents",
}
AT_START = {"Prepend", "Strip"}  # they change a text's ends: only a cut of its end is safe
WHITESPACE = {"\\s+", " "}  # Replace patterns that cannot reach across a space's cut
PROBE = "ab cd"  # a pre-tokenizer that splits at spaces splits here: "ab" | " cd" or "cd"


@dataclass(frozen=True)
class Cutter:
    """Where a tokenizer's texts may be cut: ``span`` characters are kept, from the start
    (``left`` False, truncating right) or from the end."""

    span: int
    left: bool = False

    @classmethod
    def of(cls, tokenizer: Any, *, max_length: int, left: bool) -> Cutter | None:
        """The cutter for ``tokenizer`` (a `tokenizers.Tokenizer`), or None where a cut could
        change the tokens kept. ``span`` gives each of the ``max_length`` tokens kept 16
        characters and more: every token of English text takes about 4."""
        config = json.loads(tokenizer.to_str())
        if not splits_at_spaces(tokenizer) or not local(config.get("normalizer"), left=left):
            return None
        return cls(max(4096, 16 * max_length), left)

    def cut(self, text: str) -> str:
        """``text``, or the part of it the tokens kept come from (a new string)."""
        if len(text) <= self.span:
            return text
        if self.left:  # keep the end, from a space that starts a word
            start = len(text) - self.span
            at = text.find(" ", start, len(text) - self.span // 2)
            while at != -1 and text[at - 1].isspace():
                at = text.find(" ", at + 1, len(text) - self.span // 2)
            return text if at == -1 else text[at:]
        at = text.rfind(" ", self.span // 2, self.span)  # keep the start, to a word's end
        while at != -1 and text[at - 1].isspace():
            at = text.rfind(" ", self.span // 2, at)
        return text if at == -1 else text[:at]


def splits_at_spaces(tokenizer: Any) -> bool:
    """Whether the tokenizer's pre-tokenizer puts a boundary at a space (where its model never
    makes a token across)."""
    pre = tokenizer.pre_tokenizer
    if pre is None:
        return False
    try:
        pieces = pre.pre_tokenize_str(PROBE)
    except Exception:  # a custom pre-tokenizer: no probe, no cut
        return False
    ends = {end for _, (_, end) in pieces}
    starts = {start for _, (start, _) in pieces}
    return 2 in ends and bool(starts & {2, 3})


def local(normalizer: dict[str, Any] | None, *, left: bool) -> bool:
    """Whether ``normalizer`` (its JSON) changes characters in place only."""
    if normalizer is None:
        return True
    kind = normalizer.get("type")
    if kind == "Sequence":
        return all(local(n, left=left) for n in normalizer.get("normalizers", []))
    if kind == "Replace":  # a pattern that holds a space could match across the cut
        pattern = normalizer.get("pattern", {})
        text = pattern.get("String")
        if text is not None:
            return (text.isspace() and len(text) == 1) or not any(c.isspace() for c in text)
        return pattern.get("Regex") in WHITESPACE
    return kind in LOCAL or (kind in AT_START and not left)
