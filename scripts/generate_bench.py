"""Generation throughput with and without length bucketing, side by side in one run.

Both runs score the same prompts (sample-corpus texts cut to ``--max-length`` tokens, so their
lengths vary from a few tokens to the cut) with the same model and greedy decoding, through the
whole pipeline (`run_job`), differing only in `[batching].sort`. Each setting runs ``--repeat``
times, alternating, and the fastest run counts; times exclude model loading. It prints generated
tokens per second of scoring time and of model time, and checks the outputs are identical.

    python scripts/generate_bench.py --rows 1024
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing


def write_job(folder: Path, model: Path, args: argparse.Namespace) -> Path:
    job = folder / "bench.toml"
    job.write_text(
        f"""
[input]
path = "in"
id = "doc_id"

[model]
task = "generate"
path = "{model}"
max_length = {args.max_length}
threads = {args.threads}

[batching]
max_tokens = {args.max_tokens}
max_rows = {args.max_rows}

[generate]
max_new_tokens = {args.new_tokens}

[output]
path = "out"
"""
    )
    return job


def run(job: Path, sort: bool, attempt: int) -> tuple[dict, pa.Table]:
    from batchscore.job.load import load_job
    from batchscore.pipeline.driver import run_job

    out = f"out-{'sorted' if sort else 'unsorted'}-{attempt}"
    loaded = load_job(job, [f"batching.sort={str(sort).lower()}", f'output.path="{out}"'])
    report = run_job(loaded)
    files = sorted((job.parent / out).glob("*.parquet"))
    return report, pa.concat_tables(pq.read_table(f) for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "toy-gpt2")
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "docs")
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--max-length", type=int, default=96)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--max-rows", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    if not args.model.is_dir() or not args.corpus.is_dir():
        sys.exit(f"needs {args.model} and {args.corpus}: run `make setup` first")
    table = pq.read_table(args.corpus, columns=["doc_id", "text"])
    step = max(table.num_rows // args.rows, 1)  # spread over the corpus: mixed lengths
    sample = table.take(list(range(0, step * args.rows, step))[: table.num_rows])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "in").mkdir()
        pq.write_table(sample, folder / "in" / "prompts.parquet")
        job = write_job(folder, args.model.resolve(), args)
        results: dict[bool, tuple[dict, pa.Table]] = {}
        for attempt in range(args.repeat):
            for sort in (False, True):
                report, out = run(job, sort, attempt)
                report["scoring_s"] = report["wall_s"] - report["load_s"]
                if sort not in results or report["scoring_s"] < results[sort][0]["scoring_s"]:
                    results[sort] = (report, out)
    print(
        f"{sample.num_rows} prompts, {args.new_tokens} new tokens at most, greedy, "
        f"max_tokens {args.max_tokens}, max_rows {args.max_rows}, {args.threads} thread(s), "
        f"model {args.model.name}"
    )
    heads = [
        ("sort", 6), ("batches", 8), ("prompt pad eff", 15), ("gen tokens", 11),
        ("scoring s", 10), ("gen tok/s", 10), ("model s", 8), ("gen tok/s (model)", 18),
    ]  # fmt: skip
    print(" ".join(f"{name:>{width}}" for name, width in heads))
    for sort, (report, out) in results.items():
        generated = sum(out["generated_tokens"].to_pylist())
        print(
            f"{str(sort).lower():>6} {report['batches']:>8} {report['padding_efficiency']:>15.3f} "
            f"{generated:>11,} {report['scoring_s']:>10.2f} "
            f"{generated / report['scoring_s']:>10,.0f} "
            f"{report['model_busy_s']:>8.2f} {generated / report['model_busy_s']:>18,.0f}"
        )
    same = results[False][1]["generated"].equals(results[True][1]["generated"])
    print(f"outputs identical with and without bucketing: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
