"""This tree against another (an older commit's checkout): one job, fresh processes, interleaved.

A change's before and after meet the same machine load only side by side, so each round runs
the job once from each tree, each time into a new output folder (so a new folder's quality
gate runs, as a user's first run of a job does). Both trees share the bench's user cache
folder, filled by a warm-up run from each. Prints the medians of the whole process (with its
range), the scoring phase (the run's wall time less model load and the gate), the model's
padded tokens per second, and the ratio of the whole process: the median of each round's own
ratio, with their range (scripts/rounds.py).

    git worktree add /tmp/before HEAD~1
    python scripts/bench_against.py --baseline /tmp/before --rows 3640 --rounds 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench  # noqa: E402
import rounds  # noqa: E402
import sample_corpus  # noqa: E402
from bench_startup import source  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the other source tree")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--rounds", type=rounds.count(), default=5)
    parser.add_argument("--precision", help="[model].precision; left out: the default job")
    parser.add_argument("--work", type=Path, default=ROOT / ".bench" / "against")
    args = parser.parse_args()
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    sample_corpus.write_shards(bench.sample(args.rows), work / "data", shards=1)
    trees = {"this tree": ROOT, "baseline": args.baseline.resolve()}
    keys = {"precision": args.precision} if args.precision else {}
    jobs = {}
    for name, tree in trees.items():
        folder = work / name.replace(" ", "-")
        folder.mkdir()
        jobs[name] = bench.job_file(folder, work / "data", max_length=256, **keys)
        with source(tree):
            bench.batchscore_run(jobs[name])  # a warm-up: fills the cache as a machine's first run
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.rounds):  # interleaved: a drift in machine load hits both alike
        for name, tree in trees.items():
            with source(tree):
                runs[name].append(bench.batchscore_run(jobs[name]))
    print(f"{args.rows} texts, precision {args.precision or 'left out (the default job)'}, "
          f"{bench.THREADS} threads; medians of {args.rounds} interleaved rounds")  # fmt: skip
    print(f"{'tree':<10} {'process s':>9} {'range s':>9} {'scoring s':>9} {'model tok/s':>11} "
          f"{'batches':>7} {'from gate':>9}  ran")  # fmt: skip
    process = {}
    for name, reports in runs.items():
        process[name] = median(reports, lambda r: r["process_s"])
        scoring = median(reports, lambda r: r["wall_s"] - r["load_s"] - r["tuning_s"])
        model = median(reports, lambda r: r["padded_tokens"] / (r["model_busy_s"] or NAN))
        last = reports[-1]
        ran = last["precision"] + (" on OpenVINO" if last.get("runtime") == "openvino" else "")
        spread = rounds.spread([r["process_s"] for r in reports], 2)
        print(f"{name:<10} {process[name]:9.2f} {spread:>9} {scoring:9.2f} {model:11,.0f} "
              f"{last['batches']:7} {last.get('from_gate', 0):9}  {ran}")  # fmt: skip
    walls = {name: [r["process_s"] for r in reports] for name, reports in runs.items()}
    ratio = rounds.ratio(walls["baseline"], walls["this tree"])
    print(f"whole process, this tree vs baseline (baseline's time / this tree's): {ratio}")


NAN = float("nan")  # no model call: every row came from the gate (a job of sample_rows or less)


def median(reports: list[dict], figure) -> float:
    return statistics.median(figure(r) for r in reports)


if __name__ == "__main__":
    main()
