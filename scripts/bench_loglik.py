"""loglik against a plain transformers loop over the same rows: whole process, interleaved.

Each round runs, in fresh processes, `batchscore run` of a loglik job (every text's
log-likelihood after its BOS token, long texts in strided windows) and the loop a user would
write with transformers alone: the same texts, the same BOS and the same strided windows, in
input order, `batch_size` windows a batch padded by the tokenizer, a forward, the log-softmax
of the logits and the targets' log-probabilities summed per text. Both in fp32 on the CPU with
the same threads. Prints each side's rows/s and scored tokens/s of the whole process (start-up
and model load included), their range, the ratio of rows/s as the median of each round's own
ratio (scripts/rounds.py), and how far the two sides' log-probabilities are apart.

    python scripts/bench_loglik.py --rows 400 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench  # noqa: E402
import rounds  # noqa: E402
import sample_corpus  # noqa: E402


def job_file(folder: Path, data: Path, model: Path, max_length: int) -> Path:
    lines = [
        "[input]",
        f'path = "{data}"',
        'id = "doc_id"',
        "[model]",
        'task = "loglik"',
        f'path = "{model}"',
        'precision = "fp32"',
        f"max_length = {max_length}",
        f"threads = {bench.THREADS}",
        "[output]",
        f'path = "{folder / "out"}"',
    ]
    path = folder / "job.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def windows(ids: list[int], window: int, stride: int) -> list[tuple[list[int], int]]:
    """transformers' strided-perplexity windows (ids with BOS first): (window, tokens scored)."""
    out, scored = [], 1
    for start in range(0, len(ids), stride):
        end = min(start + window, len(ids))
        out.append((ids[start:end], end - scored))
        scored = end
        if end == len(ids):
            break
    return out


def plain_worker(data: Path, model_path: Path, max_length: int, batch_size: int) -> None:
    """The plain transformers side, as a user would write it; prints its figures as JSON."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(bench.THREADS)
    texts = pq.read_table(data, columns=["text"])["text"].to_pylist()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    tokenizer.padding_side = "right"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    units, owners = [], []
    for row, ids in enumerate(tokenizer(texts, add_special_tokens=False).input_ids):
        for unit in windows([tokenizer.bos_token_id, *ids], max_length, max_length // 2):
            units.append(unit)
            owners.append(row)
    sums = [0.0] * len(texts)
    counts = [0] * len(texts)
    with torch.inference_mode():
        for start in range(0, len(units), batch_size):
            batch = units[start : start + batch_size]
            padded = tokenizer.pad({"input_ids": [ids for ids, _ in batch]}, return_tensors="pt")
            logits = model(**padded).logits.float().log_softmax(-1)
            lengths = padded["attention_mask"].sum(1).tolist()
            for i, (ids, scored) in enumerate(batch):
                positions = torch.arange(lengths[i] - 1 - scored, lengths[i] - 1)
                tokens = torch.tensor(ids[len(ids) - scored :])
                picked = logits[i, positions].gather(1, tokens[:, None]).sum()
                sums[owners[start + i]] += float(picked)
                counts[owners[start + i]] += scored
    print(json.dumps({"logprob": sums, "tokens": counts}))


def plain_run(data: Path, model: Path, max_length: int, batch_size: int) -> dict:
    command = [sys.executable, __file__, "--plain-worker", str(data), str(model)]
    command += [str(max_length), str(batch_size)]
    wall, rss, out = bench.run_process(command)
    return {**json.loads(out.splitlines()[-1]), "process_s": wall, "rss_mib": rss}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--plain-worker":
        data, model, max_length, batch_size = sys.argv[2:6]
        plain_worker(Path(data), Path(model), int(max_length), int(batch_size))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--rounds", type=rounds.count(), default=3)
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "toy-gpt2")
    parser.add_argument("--max-length", type=int, default=128, help="the window, in tokens")
    parser.add_argument("--batch-size", type=int, default=16, help="the plain loop's windows")
    parser.add_argument("--work", type=Path, default=ROOT / ".bench" / "loglik")
    args = parser.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    data = work / "data"
    sample_corpus.write_shards(bench.sample(args.rows), data, shards=1)
    (work / "batchscore").mkdir()
    job = job_file(work / "batchscore", data, args.model.resolve(), args.max_length)
    bench.batchscore_run(job)  # a warm-up: fills the cache as a machine's first run
    runs: dict[str, list[dict]] = {"batchscore": [], "transformers": []}
    for _ in range(args.rounds):  # interleaved: a drift in machine load hits both alike
        runs["batchscore"].append(bench.batchscore_run(job))
        runs["transformers"].append(
            plain_run(data, args.model.resolve(), args.max_length, args.batch_size)
        )
    texts = pq.read_table(data, columns=["doc_id"])["doc_id"].to_pylist()
    out = pq.read_table(job.parent / "out", columns=["doc_id", "logprob", "tokens"]).to_pylist()
    ours = {r["doc_id"]: r for r in out}
    plain = runs["transformers"][-1]
    apart = max(abs(ours[t]["logprob"] - v) for t, v in zip(texts, plain["logprob"], strict=True))
    if [ours[t]["tokens"] for t in texts] != plain["tokens"]:
        raise SystemExit("the two sides scored other tokens")
    rows, scored = len(texts), sum(plain["tokens"])
    print(f"{rows} texts, window {args.max_length} (stride {args.max_length // 2}), "
          f"{scored:,} tokens scored, fp32, {bench.THREADS} threads, {args.model.name}; "
          f"medians of {args.rounds} interleaved rounds, whole process")  # fmt: skip
    print(f"{'side':<13} {'process s':>9} {'range s':>11} {'rows/s':>8} {'tokens/s':>9}")
    speed = {}
    for name, done in runs.items():
        seconds = [r["process_s"] for r in done]
        speed[name] = [rows / s for s in seconds]
        middle = statistics.median(seconds)
        print(f"{name:<13} {middle:>9.2f} {rounds.spread(seconds, 2):>11} "
              f"{rows / middle:>8.1f} {scored / middle:>9,.0f}")  # fmt: skip
    ratio = rounds.ratio(speed["batchscore"], speed["transformers"])
    print(f"rows/s, batchscore / transformers: {ratio}")
    print(f"log-probabilities apart: at most {apart:.2e} nats a text")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
