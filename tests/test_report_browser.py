"""The report page in a real browser: Debian's Chromium, headless, driven by Selenium.

The page must load with no console errors, draw every chart, and fetch nothing. A screenshot of
it is taken every run; with ``UPDATE_SCREENSHOT=1`` it replaces docs/report.png (the README shows
it), so a test run leaves the tracked picture alone. `make test` installs Chromium and its
driver (as root, or through sudo); without them the test is skipped, but under CI (``CI`` set)
their absence fails it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.commands import invoke
from tests.conftest import ROOT

pytestmark = pytest.mark.browser
CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# As root, with the network closed, Chromium hangs on connection attempts without these.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip
SCREENSHOT = ROOT / "docs" / "report.png"  # replaced only with UPDATE_SCREENSHOT=1


def missing(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{why}; `make test` installs it")
    pytest.skip(f"{why}; `make test` installs it")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not (CHROMIUM.exists() and DRIVER.exists()):
        missing("Chromium (Debian's chromium and chromium-driver) is not installed")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing("selenium (the dev extra) is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="batchscore-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(DRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_the_report_page_loads_cleanly_and_draws_every_chart(
    browser, embed_job: Path, tmp_path: Path, small_corpus: pa.Table
):
    from selenium.webdriver.common.by import By

    # A run with something in every chart: long-tailed lengths, a shard with bad rows (kept
    # with their error), and one shard that is not Parquet at all (failed).
    rows = small_corpus.slice(0, 30)
    texts = rows.column("text").to_pylist()
    texts[3] = texts[11] = None
    column = rows.schema.get_field_index("text")
    rows = rows.set_column(column, "text", pa.array(texts, pa.string()))
    pq.write_table(rows, tmp_path / "in/docs_$x$-003.parquet")  # not math: drawn as named
    (tmp_path / "in/docs-004.parquet").write_bytes(b"not parquet")
    ran = invoke("run", str(embed_job), "--progress", "off", "--set", 'output.on_error="skip"')
    assert ran.exit_code == 3, ran.output  # one shard failed; the others committed
    page = tmp_path / "report.html"
    made = invoke("report", str(embed_job), "-o", str(page))
    assert made.exit_code == 0, made.output
    text = page.read_text()
    assert "<script" not in text and not re.search(
        r"""(src|href)=["']?https?:|url\(\s*["']?http""", text
    )

    browser.set_window_size(1280, 900)
    browser.get(page.as_uri())
    problems = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert problems == []
    charts = browser.find_elements(By.CSS_SELECTOR, "figure.chart")
    ids = [c.get_attribute("id") for c in charts]
    assert ids == ["phases", "lengths", "throughput", "padding", "shards"]
    for chart in charts:
        drawing = chart.find_element(By.TAG_NAME, "svg")
        assert drawing.size["width"] > 300 and drawing.size["height"] > 150, chart.text
        marks = browser.execute_script(
            "return arguments[0].querySelectorAll('path, rect, use').length", drawing
        )
        assert marks > 10, f"{chart.get_attribute('id')} drew {marks} marks"
    assert "failed" in browser.find_element(By.ID, "shards").text
    assert "rows with an error" in browser.find_element(By.ID, "shards").text
    assert "docs_$x$-003.parquet" in browser.find_element(By.ID, "shards").text
    cards = browser.find_element(By.CLASS_NAME, "figures").text
    assert "390" in cards and "rows scored" in cards and "padding efficiency" in cards
    assert "docs-004.parquet" in browser.find_element(By.TAG_NAME, "table").text

    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, height + 120)  # the window, not only the page, is sized
    shot = SCREENSHOT if os.environ.get("UPDATE_SCREENSHOT") == "1" else tmp_path / "report.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 20_000
