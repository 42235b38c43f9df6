"""Generation throughput: static length bucketing vs continuous batching, and what the shared
prompt prefix's cache saves, side by side in one run.

The decoder is a toy GPT-2 trained here (scripts/generate_example.py with a prompt template's
head) to answer "<template head><name>\\n" with a docstring's first sentence and stop, so greedy
answers range from a few tokens to ``--new-tokens``. The same encoded prompts (sample-corpus
object names, spread over the corpus) run three ways, in interleaved rounds so a busy machine
slows each alike:

    static      the sampler's batches (sorted by prompt length) through `generate`
    continuous  the same order through the scheduler, the template's start computed once
    no prefix   the scheduler with every prompt computed whole

Times are model time only (no loading, no Parquet). Each round prints its ratios; the summary
gives each mode's median seconds with their range, and each ratio as the median of its rounds'
own ratios with their range (scripts/rounds.py). Outputs must be identical in all three modes.

    python scripts/generate_bench.py                       # the run in BENCHMARKS.md
    python scripts/generate_bench.py --rows 256 --rounds 3   # a quick look
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from batchscore.models.generate import GenerateTask
    from batchscore.work.units import Encoded

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "scripts"))
import rounds  # noqa: E402

HEAD = "Write the first sentence of the docstring of the Python object named below.\nName: "
MODES = ("static", "continuous", "no prefix")


def load(model: Path, args: argparse.Namespace) -> GenerateTask:
    from batchscore.job.sections import GenerateConfig, InputConfig, ModelConfig
    from batchscore.models.generate import GenerateTask
    from batchscore.runtime.executor import Executor

    config = ModelConfig(
        task="generate", precision="fp32", max_length=args.max_length, threads=args.threads
    )
    options = GenerateConfig(prompt=HEAD + "{doc_id}\n", max_new_tokens=args.new_tokens)
    executor = Executor(config)
    return GenerateTask(
        model, model=config, options=options, inp=InputConfig(()), executor=executor
    )


def run(
    task: GenerateTask,
    encoded: Encoded,
    order: list[np.ndarray],
    mode: str,
    args: argparse.Namespace,
) -> tuple[float, list, int]:
    """One mode over every prompt: seconds, each prompt's tokens, prompt tokens read from the
    shared prefix's cache."""
    import torch

    out: list = [None] * len(encoded.lengths)
    reused = 0
    start = time.perf_counter()
    with torch.inference_mode():
        if mode == "static":
            for batch in order:
                for unit, tokens in zip(batch, task.forward(encoded, batch), strict=True):
                    out[unit] = tokens
        else:
            task.generator.prefixes.last = None  # each round computes the prefix once, afresh
            units = np.concatenate(order)
            schedule = task.stream(
                encoded,
                units,
                max_tokens=args.max_tokens,
                max_rows=args.max_rows,
                reuse_prefix=mode == "continuous",
            )
            for index, tokens in schedule:
                out[units[index]] = tokens
            reused = schedule.reused
    return time.perf_counter() - start, out, reused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "docs")
    parser.add_argument("--model", type=Path, help="a toy built before (default: train one)")
    parser.add_argument("--steps", type=int, default=120, help="training steps of the toy")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--max-rows", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--rounds", "--repeat", dest="rounds", type=rounds.count(), default=3, help="interleaved"
    )
    args = parser.parse_args()
    if not args.corpus.is_dir():
        sys.exit(f"needs {args.corpus}: run `make setup` first")
    from generate_example import build

    from batchscore.pipeline.batching import Batching

    table = pq.read_table(args.corpus, columns=["doc_id", "text"])
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or Path(tmp) / "toy-sentences"
        if args.model is None:
            loss = build(table, model, steps=args.steps, head=HEAD)
            print(f"trained the toy decoder: {args.steps} steps, loss {loss:.2f}")
        task = load(model, args)
        step = max(table.num_rows // args.rows, 1)  # spread over the corpus: mixed names
        names = table["doc_id"].to_pylist()[::step][: args.rows]
        encoded = task.encode(pa.table({"doc_id": names}))
        units = np.arange(len(encoded.lengths))
        order = Batching(args.max_tokens, args.max_rows, sort=True).batches(encoded, units)
        run(task, encoded, order[:1], "static", args)  # warm-up: first calls pay set-up costs
        seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
        outputs: dict[str, list] = {}
        reused = 0
        for round_ in range(args.rounds):  # interleaved: every mode once a round
            for mode in MODES:
                took, outputs[mode], used = run(task, encoded, order, mode, args)
                seconds[mode].append(took)
                reused = max(reused, used)
            speedup = seconds["static"][-1] / seconds["continuous"][-1]
            saving = seconds["no prefix"][-1] / seconds["continuous"][-1]
            print(
                f"round {round_ + 1}: continuous/static {speedup:.2f}x, prefix saving {saving:.2f}x"
            )
    lengths = [len(t) for t in outputs["static"]]
    generated, prompt_tokens = sum(lengths), int(encoded.lengths.sum())
    print(
        f"{len(names)} prompts ({prompt_tokens:,} tokens, {encoded.lengths.min()}-"
        f"{encoded.lengths.max()} each), greedy, answers {min(lengths)}-{max(lengths)} tokens "
        f"(median {statistics.median(lengths):.0f}, max_new_tokens {args.new_tokens}), "
        f"max_tokens {args.max_tokens}, max_rows {args.max_rows}, {args.threads} thread(s), "
        f"medians of {args.rounds} interleaved rounds"
    )
    header = f"{'mode':>10} {'gen tokens':>11} {'seconds':>8} {'range s':>11} {'gen tok/s':>10}"
    print(f"{header}  vs static")
    for mode in MODES:
        median = statistics.median(seconds[mode])
        rate, spread = generated / median, rounds.spread(seconds[mode], 2)
        ratio = rounds.ratio(seconds["static"], seconds[mode])
        print(f"{mode:>10} {generated:>11,} {median:>8.2f} {spread:>11} {rate:>10,.0f}  {ratio}")
    static, whole = seconds["static"], seconds["no prefix"]
    print(f"continuous batching vs static, without prefix reuse: {rounds.ratio(static, whole)}")
    print(f"continuous batching vs static, with it: {rounds.ratio(static, seconds['continuous'])}")
    print(
        f"prefix reuse alone: {reused:,} of {prompt_tokens:,} prompt tokens "
        f"({reused / prompt_tokens:.0%}) read from the cache; the speed with it vs without: "
        f"{rounds.ratio(seconds['no prefix'], seconds['continuous'])}"
    )
    same = all(
        [t.tolist() for t in outputs[m]] == [t.tolist() for t in outputs["static"]] for m in MODES
    )
    print(f"outputs identical in all three modes: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
