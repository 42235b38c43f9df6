"""What a run says of its precision: one plain line by default, its reasoning with -v."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from batchscore.output.settled import Chosen
from tests.commands import invoke
from tests.reliability import make_job

NO_ROWS = "no input row to measure on (every shard empty, or none passes [input].where)"
AUTO_WHY = (
    "for 60 rows, the fastest that passes the quality gate of fp32 and what could pay for "
    "itself: fp32 on OpenVINO: 32.8 rows/s; bf16: not tried (...)"
)


@pytest.mark.parametrize(
    "chosen, asked, said",
    [
        (
            Chosen("bf16", AUTO_WHY, speeds={"fp32": 1000.0, "bf16": 2600.0},
                   measured={"sample_rows": 256, "agreement": {"cosine_min": 0.99991}}),
            "auto",
            "2.60x fp32, cosine min 0.9999 on 256 rows",
        ),
        (
            Chosen("fp32", AUTO_WHY, speeds={"fp32": 1000.0}, measured={"sample_rows": 60}),
            "auto",
            "the reference: no faster precision passes the quality gate and pays for itself on "
            "60 rows",
        ),
        (
            Chosen("bf16", "bf16 passes the quality gate: ...", speeds={"fp32": 10, "bf16": 8},
                   measured={"sample_rows": 30, "agreement": {"cosine_min": 0.99, "mean": 1}}),
            "bf16",
            "the job's: 0.80x fp32, cosine min 0.9900 on 30 rows",
        ),
        (
            Chosen("int8", "int8 FAILS ...", accepted=True,
                   measured={"sample_rows": 30, "agreement": {"label_agreement": 0.9}}),
            "int8",
            "the job's: label agreement 0.9000 on 30 rows: FAILS the quality gate, accepted",
        ),
        (Chosen("fp32", "fp32 is the reference"), "fp32",
         "the job's: the reference, nothing to gate"),
        (Chosen("fp32", NO_ROWS), "auto", NO_ROWS),
    ],
)  # fmt: skip
def test_the_precision_line_is_plain(chosen: Chosen, asked: str, said: str):
    assert chosen.plainly(asked) == said


def run_lines(job: Path, *args: str) -> list[str]:
    ran = invoke("run", str(job), "--progress", "off", *args)
    assert ran.exit_code == 0, ran.output
    return ran.stderr.splitlines()


def test_a_first_run_says_its_precision_in_one_line_and_why_with_v(tmp_path: Path, small_corpus):
    """Issue 51: the first run's log explained its precision in 5-6 lines of jargon. Now one
    plain line, the gate's trials and the reasoning only with -v."""
    job = make_job(tmp_path, small_corpus.slice(0, 30))
    fixed = ["--set", "model.precision=bf16", "--set", "quality.min_cosine=0.9"]
    lines = run_lines(job, *fixed)
    said = [line for line in lines if "precision" in line]
    pattern = (
        r"batchscore: precision bf16: the job's: \d+\.\d\dx fp32, cosine min [01]\.\d{4} on 30 rows"
    )
    assert len(said) == 1 and re.fullmatch(pattern, said[0]), lines
    assert not any(line.startswith("batchscore: quality gate: bf16") for line in lines), lines
    verbose = run_lines(job, *fixed, "--set", 'output.path="again"', "-v")
    assert any(line.startswith("batchscore: precision bf16, why: bf16 passes") for line in verbose)
    assert any(line.startswith("batchscore: quality gate: bf16") for line in verbose)
