"""Names from the input are drawn as plain text on the report page: a shard named
``export_$$.parquet`` used to crash `report` (matplotlib read ``$`` as math), and ``a_$x$_b`` was
drawn as a subscript. The charts keep text as SVG text, so the page's SVG must hold each name
exactly as given."""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscore.cli import main
from batchscore.observe.figures import page_numbers
from batchscore.observe.html import render, write_page
from tests.conftest import write_job

SVG = "{http://www.w3.org/2000/svg}"
# Printable text, heavy on what matplotlib's math and TeX read: $ \ _ ^ { } %.
SPECIAL = st.sampled_from(list("$\\_^{}% ."))
PRINTABLE = st.characters(exclude_categories=("C", "Zl", "Zp", "Zs"), include_characters=" ")
NAME = st.text(st.one_of(SPECIAL, PRINTABLE), min_size=1, max_size=30)


def numbers_for(job: str, shards: list[str], failed: str | None = None) -> dict:
    """The report page's numbers for a run over ``shards`` (10 rows each)."""
    report = {
        "job": job,
        "rows": 10 * len(shards),
        "wall_s": 1.0,
        "outcome": "ok" if failed is None else "failed",
        "failed_shards": [] if failed is None else [{"shard": failed, "error": "bad $x$"}],
        "shards": {s: {"rows": 10, "bad_rows": 0, "filtered": 0} for s in shards},
    }
    status = {
        "shards": [
            {"shard": s, "state": "done", "rows": 10, "rows_written": 10, "bad_rows": 0}
            for s in shards
        ]
    }
    return page_numbers(report, status)


def chart_texts(page: str, chart: str) -> list[str]:
    """Every text element of one chart's SVG on the page, in document order."""
    start = page.index(f'id="{chart}"')
    svg = page[page.index("<svg", start) : page.index("</svg>", start) + len("</svg>")]
    return [t.text or "" for t in ET.fromstring(svg).iter(f"{SVG}text")]


def in_order(wanted: list[str], texts: list[str]) -> bool:
    """Whether every ``wanted`` text is among ``texts``, in this order (one bar per shard)."""
    rest = iter(texts)
    return all(any(text == want for text in rest) for want in wanted)


@settings(max_examples=60, deadline=None)
@given(job=NAME, names=st.lists(NAME.filter(lambda n: "/" not in n), min_size=1, max_size=4))
def test_every_name_is_drawn_as_given(job: str, names: list[str]):
    shards = [f"in/{i}/{name}" for i, name in enumerate(names)]  # file names may repeat
    page = render(numbers_for(job, shards, failed=shards[0]))
    unique = len(set(names)) == len(names)
    labels = names if unique else shards  # a repeated file name is told apart by its path
    assert in_order(labels, chart_texts(page, "shards"))
    title = re.search(r"<h1>(.*?)</h1>", page, re.S).group(1)
    assert html.unescape(title) == f"batchscore report: {job}"
    assert html.escape(shards[0]) in page  # the failed shard's row in the table


def test_what_cannot_be_printed_is_shown_as_its_escape(tmp_path: Path):
    """A newline or a byte that is not UTF-8 (a surrogate, as the OS hands it over) is never
    drawn as itself, and the page is still written."""
    shards = ["in/two\nlines.parquet", "in/bad\udcff.parquet"]
    numbers = numbers_for("job", shards, failed=shards[1])
    write_page(numbers, tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    texts = chart_texts(page, "shards")
    assert "two\\nlines.parquet" in texts and "bad\\udcff.parquet" in texts


def test_report_draws_shards_named_like_math(tmp_path: Path, small_corpus: pa.Table):
    """The command itself, after a real run, on shards whose names matplotlib would read as
    math: it exits 0 and the page holds each name."""
    names = ["export_$$.parquet", "a_$x$_b.parquet", "c_{1}^2\\alpha.parquet"]
    (tmp_path / "in").mkdir()
    for i, name in enumerate(names):
        pq.write_table(small_corpus.slice(4 * i, 4), tmp_path / "in" / name)
    job = write_job(
        tmp_path / "job.toml",
        input={"path": "in", "text": "text"},
        model={"task": "embed", "max_length": 32, "threads": 1},
        output={"path": "out"},
    )
    job.write_text('name = "cost $5 $x$"\n' + job.read_text())
    runner = CliRunner()
    assert runner.invoke(main, ["run", str(job), "--progress", "off"]).exit_code == 0
    made = runner.invoke(main, ["report", str(job), "-o", str(tmp_path / "r.html")])
    assert made.exit_code == 0, made.output
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert sorted(set(chart_texts(page, "shards")) & set(names)) == sorted(names)
    assert "batchscore report: cost $5 $x$" in html.unescape(page)
