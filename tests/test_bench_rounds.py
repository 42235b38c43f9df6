"""The benchmarks' ratios as BENCHMARKS.md reports them (issue 52): the median of each round's own
ratio, with their range and the number of rounds, never a ratio of two medians; and every
benchmark refuses fewer than three rounds before it measures anything (argparse's exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import rounds  # noqa: E402


def test_a_ratio_is_the_median_of_each_rounds_own_ratio_with_their_range():
    # per round 1/1, 2/4, 9/3: ratios 1.0, 0.5, 3.0; the medians' ratio (2/3) would say 0.67
    assert rounds.ratio([1, 2, 9], [1, 4, 3]) == "median 1.00x (range 0.50-3.00, 3 rounds)"
    ratio = rounds.ratio([1062, 1070, 1050], [1000, 1000, 1000], digits=3)
    assert ratio == "median 1.062x (range 1.050-1.070, 3 rounds)"


def test_a_round_without_the_figure_says_so_instead_of_a_number():
    assert rounds.ratio([1, 2, 3], [1, 0, 3]).startswith("n/a")
    assert rounds.ratio([1, float("nan"), 3], [1, 1, 1]).startswith("n/a")


def test_a_spread_is_the_lowest_and_highest_figure():
    assert rounds.spread([10.26, 9.94, 11.0]) == "9.9-11.0"
    assert rounds.spread([1.234, 1.5], 2) == "1.23-1.50"


# script, its flag for rounds, the fewest it refuses
SCRIPTS = [
    ("scripts/bench.py", "--repeats", 2),
    ("scripts/bench_against.py", "--rounds", 2),
    ("scripts/bench_shards.py", "--repeats", 2),
    ("scripts/bench_startup.py", "--rounds", 2),
    ("scripts/generate_bench.py", "--rounds", 2),
    ("scripts/generate_bench.py", "--repeat", 2),  # the older name, kept
    ("scripts/bench_increments.py", "--rounds", 2),
    ("scripts/bench_peers.py", "--repeats", 2),
    ("scripts/bench_loglik.py", "--rounds", 2),
    ("docs/studies/runtime_study.py", "--rounds", 3),  # its first round is reported apart
]


@pytest.mark.parametrize(("script", "flag", "fewest"), SCRIPTS, ids=lambda x: str(x))
def test_every_benchmark_refuses_fewer_rounds_than_a_median_needs(
    script: str, flag: str, fewest: int
):
    command = [sys.executable, str(ROOT / script), flag, str(fewest)]
    if script.endswith("bench_against.py"):
        command += ["--baseline", str(ROOT)]  # required, and never reached
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "at least" in done.stderr and "interleaved rounds" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
