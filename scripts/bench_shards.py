"""Many small shards against one large one: the same rows, side by side in fresh processes.

Windows and batches span shard boundaries (commits stay one per chunk), so a job over thousands
of one-row shards should run nearly as fast as the same rows in one shard, and many small shards
should pad as well as one large one. Prints, for each layout, rows/s over the run (medians of
interleaved rounds), the whole process time and its range, padding efficiency and batches, and
the ratios: each the median of its rounds' own ratios, with their range (scripts/rounds.py).

    python scripts/bench_shards.py                    # the run recorded in BENCHMARKS.md
    python scripts/bench_shards.py --rows 400 --repeats 3   # a quick look
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench  # noqa: E402  (its corpus sample and its fresh-process run)
import rounds  # noqa: E402

THREADS = bench.THREADS


def write_layout(table: pa.Table, folder: Path, shards: int) -> Path:
    """``table`` as ``shards`` Parquet files of equal size (in order) under ``folder/data``.

    An earlier benchmark's files are written over, not removed first: files removed just before
    the runs would slow their file creation (see `bench.set_aside`).
    """
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    per = -(-table.num_rows // shards)
    names = [data / f"part-{i:05d}.parquet" for i in range(shards)]
    for i, name in enumerate(names):
        pq.write_table(table.slice(i * per, per), name)
    for stale in set(data.iterdir()) - set(names):  # a larger --rows run's
        stale.unlink()
    return data


def job_file(folder: Path, data: Path, max_length: int) -> Path:
    """A fixed precision and budget, so only the shard layout differs between the runs."""
    text = f"""[input]
path = "{data}"
text = "text"
id = "doc_id"
[model]
task = "embed"
precision = "fp32"
threads = {THREADS}
max_length = {max_length}
[batching]
max_tokens = 16384
[output]
path = "{folder / "out"}"
"""
    path = folder / "job.toml"
    path.write_text(text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000, help="rows of the one-row-shard case")
    parser.add_argument("--repeats", type=rounds.count(), default=3)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--work", type=Path, default=ROOT / ".bench" / "shards")
    args = parser.parse_args()

    work, table = args.work, bench.sample(args.rows)
    small = table.slice(0, min(1000, args.rows))
    layouts = {  # name: (rows, shards)
        f"1 shard x {table.num_rows} rows": (table, 1),
        f"{table.num_rows} shards x 1 row": (table, table.num_rows),
        f"1 shard x {small.num_rows} rows (pad)": (small, 1),
        f"50 shards x {small.num_rows // 50} rows (pad)": (small, 50),
    }
    jobs = {}
    for i, (name, (rows, shards)) in enumerate(layouts.items()):
        folder = work / f"layout-{i}"
        jobs[name] = job_file(folder, write_layout(rows, folder, shards), args.max_length)
    runs: dict[str, list[dict]] = {name: [] for name in layouts}
    for repeat in range(args.repeats):  # interleaved: drifts in machine load hit all alike
        for name, job in jobs.items():
            runs[name].append(bench.batchscore_run(job))
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)

    def each(name: str, key: str) -> list[float]:
        return [r[key] for r in runs[name]]

    def med(name: str, key: str) -> float:
        return statistics.median(each(name, key))

    print(f"{os.cpu_count()} cores, {THREADS} threads, fp32, max_tokens 16384, max_length "
          f"{args.max_length}; medians of {args.repeats} interleaved runs")  # fmt: skip
    print(f"{'layout':<30} {'rows':>6} {'rows/s':>7} {'process s':>9} {'range s':>9} "
          f"{'pad eff':>7} {'batches':>7} {'chunks':>6}")  # fmt: skip
    for name in layouts:
        last = runs[name][-1]
        print(f"{name:<30} {last['rows']:>6} {med(name, 'rows_per_s'):>7.1f} "
              f"{med(name, 'process_s'):>9.1f} {rounds.spread(each(name, 'process_s')):>9} "
              f"{med(name, 'padding_efficiency'):>7.3f} "
              f"{last['batches']:>7} {last['chunks_committed']:>6}")  # fmt: skip
    one, many, big, fifty = list(layouts)
    print("\nratios:")
    rate = rounds.ratio(each(many, "rows_per_s"), each(one, "rows_per_s"))
    print(f"  {many} vs {one}, rows/s: {rate}")
    print(f"  {many} vs {one}, whole process: "
          f"{rounds.ratio(each(one, 'process_s'), each(many, 'process_s'))}")  # fmt: skip
    pads = med(fifty, "padding_efficiency"), med(big, "padding_efficiency")
    print(f"  {fifty} vs {big}, padding efficiency: {pads[0]:.3f} vs {pads[1]:.3f}")


if __name__ == "__main__":
    main()
