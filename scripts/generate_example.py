"""Build the toy model for jobs/generate.toml: a 2-layer GPT-2 that has read the sample corpus.

It is a toy, not a language model: about 200k parameters with a byte-level BPE tokenizer trained
here, then a few seconds of training on "<name>\\n<docstring>" texts. Its output is
docstring-flavoured word salad. It exists so that the generate job runs out of the box, and as a
fixed model for scripts/generate_bench.py; point the job's [model].path at a real model for real
text.

    python scripts/generate_example.py data/docs models/toy-gpt2
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

END = "<|endoftext|>"


def train_bpe(texts: list[str], specials: list[str], template: str | None = None, vocab: int = 400):
    """A byte-level BPE tokenizer trained on ``texts``; ``template`` adds special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    if template:
        used = [(s, tok.token_to_id(s)) for s in specials if s in template]
        tok.post_processor = processors.TemplateProcessing(single=template, special_tokens=used)
    return tok


def first_sentence(text: str) -> str:
    """A text up to its first sentence end (or blank line): answers from a few words to many."""
    match = re.search(r"[.!?](\s|$)|\n\s*\n", text)
    return text[: match.start() + 1] if match else text


def build(table: pa.Table, out: Path, steps: int = 60, seed: int = 0, *, head: str = "") -> float:
    """Train and save the toy into ``out``; return its final training loss (nats per token).

    With ``head`` (a prompt template's start, for scripts/generate_bench.py) the toy learns
    "<head><name>\n<first sentence><EOS>" instead, so it stops at a sentence end.
    """
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()  # no notes about training-only config keys
    docs = [f"{n}\n{t[:600]}" for n, t in zip(table["doc_id"].to_pylist(),
                                               table["text"].to_pylist(), strict=True)]  # fmt: skip
    if head:
        docs = [f"{head}{d.split(chr(10), 1)[0]}\n{first_sentence(d.split(chr(10), 1)[1])}"
                for d in docs]  # fmt: skip
    tok = train_bpe(docs[::3], [END], vocab=1000)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=END, eos_token=END).save_pretrained(out)
    stream = np.concatenate([np.array([*e.ids, 0]) for e in tok.encode_batch(docs)])
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=128, n_embd=64, n_layer=2,
                        n_head=2, bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(seed)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):  # random 64-token windows of the corpus, 32 per step
        starts = rng.integers(0, len(stream) - 65, 32)
        x = torch.from_numpy(np.stack([stream[s : s + 64] for s in starts]))
        loss = model(input_ids=x, labels=x).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(out)
    (out / "README.md").write_text(
        f"Toy GPT-2 built by scripts/generate_example.py: {steps} training steps on the sample "
        f"corpus (final loss {loss.item():.2f}). It writes word salad: not a language model.\n"
    )
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path, help="the sample corpus shards (data/docs)")
    parser.add_argument("out", type=Path, help="the model folder to write")
    parser.add_argument("--steps", type=int, default=60, help="training steps (0: untrained)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # a model this small trains fastest on one thread
    start = time.perf_counter()
    loss = build(pq.read_table(args.corpus, columns=["doc_id", "text"]), args.out, args.steps)
    took = time.perf_counter() - start
    print(f"wrote a toy GPT-2 to {args.out} ({args.steps} steps in {took:.0f} s, loss {loss:.2f})")


if __name__ == "__main__":
    main()
