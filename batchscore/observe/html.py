"""The report page: one self-contained HTML file, its charts drawn by matplotlib as inline SVG.

Why matplotlib's SVG: the page has no script at all, so it fetches nothing, runs in any browser
(or mail client, or a CI artifact viewer behind a strict CSP) and cannot fail to load; it is
small (tens of kB, where Plotly's embedded JavaScript alone is ~4 MB per page) and sharp at any
zoom or in print. matplotlib is imported on first use only, from the `report` extra.
"""

from __future__ import annotations

import html
import io
import warnings
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

from batchscore.errors import JobError, write_error

BLUE, ORANGE, GREY, RED, GREEN = "#2b6cb0", "#dd6b20", "#a0aec0", "#c53030", "#2f855a"
CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 1100px; padding: 0 1rem; color: #1a202c; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } .sub { color: #4a5568; margin-top: 0; }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr));
           gap: .6rem; margin: 1.2rem 0; }
.figure { background: #f7fafc; border: 1px solid #e2e8f0; border-radius: 6px;
          padding: .5rem .7rem; }
.figure b { display: block; font-size: 1.15rem; }
.figure span { color: #4a5568; font-size: .85rem; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr)); gap: 1rem; }
figure.chart { margin: 0; border: 1px solid #e2e8f0; border-radius: 6px; padding: .5rem; }
figure.chart svg { width: 100%; height: auto; display: block; }
figure.chart h2 { font-size: 1.02rem; margin: .2rem .4rem .4rem; }
figcaption { color: #4a5568; font-size: .85rem; padding: .3rem .4rem 0; }
.ok { color: #2f855a; } .bad { color: #c53030; }
table { border-collapse: collapse; margin-top: .5rem; font-size: .9rem; }
td, th { border-bottom: 1px solid #e2e8f0; padding: .25rem .6rem; text-align: left; }
"""


def matplotlib_figure() -> Any:
    """matplotlib and its Figure class (no pyplot: no global figure state, no GUI backend)."""
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise JobError(
            'batchscore report draws its charts with matplotlib: pip install "batchscore[report]"'
        ) from None
    return matplotlib, Figure


def svg(draw: Callable[[Any], None], salt: str) -> str:
    """One chart as an inline ``<svg>`` element: text kept as text, ids unique on the page.

    Every text is drawn as given: shard names come from the input, and matplotlib would read
    ``export_$$.parquet`` as math (and fail) or ``a_$x$_b`` as a subscript. A glyph the font
    lacks is no matter either: the text stays text, drawn by the browser's own fonts.
    """
    matplotlib, figure_class = matplotlib_figure()
    settings = {
        "svg.fonttype": "none",
        "svg.hashsalt": salt,
        "font.size": 9,
        "text.parse_math": False,
        "text.usetex": False,
    }
    with matplotlib.rc_context(settings), warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="Glyph .* missing from font", category=UserWarning
        )
        fig = figure_class(figsize=(6.4, 3.3), layout="constrained")
        draw(fig)
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # no XML prolog or doctype inside HTML


def draw_lengths(numbers: dict[str, Any]) -> Callable[[Any], None]:
    hist, cuts = numbers["histogram"], numbers["cuts"]

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        edges = hist["edges"]
        widths = [b - a for a, b in pairwise(edges)]
        ax.bar(edges[:-1], hist["counts"], width=widths, align="edge", color=BLUE, label="rows")
        most = max((c["batches"] for c in cuts), default=1)
        for i, cut in enumerate(cuts):
            alpha = 0.25 + 0.75 * cut["batches"] / most
            ax.axvline(
                cut["width"],
                color=ORANGE,
                lw=1,
                alpha=alpha,
                label="batch cut (padded length)" if i == 0 else None,
            )
        ax.set_xlabel("tokens per row (unit)")
        ax.set_ylabel("rows")
        ax.legend(loc="upper right", frameon=False)

    return draw


PHASE_COLOURS = {
    "start-up": GREY,
    "preparing": "#718096",
    "measuring": ORANGE,
    "loading": "#805ad5",
    "scoring": BLUE,
    "finishing": GREEN,
}


def draw_phases(numbers: dict[str, Any]) -> Callable[[Any], None]:
    spent = numbers["phases"]

    def draw(fig: Any) -> None:
        fig.set_figheight(1.9)
        ax = fig.add_subplot()
        total = sum(p["seconds"] for p in spent) or 1.0
        left = 0.0
        for p in spent:
            seconds = p["seconds"]
            label = f"{p['phase']} {seconds:,.1f} s"
            ax.barh(0, seconds, left=left, color=PHASE_COLOURS.get(p["phase"], GREY), label=label)
            if seconds / total > 0.08:  # wide enough to say its seconds inside
                middle = (left + seconds / 2, 0)
                ax.annotate(f"{seconds:,.1f} s", middle, ha="center", va="center", color="white")
            left += seconds
        ax.set_yticks([])
        ax.set_xlim(0, total)
        ax.set_xlabel("seconds, from the process's start to the run's end")
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)

    return draw


def draw_timeline(numbers: dict[str, Any]) -> Callable[[Any], None]:
    points = numbers["timeline"]

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        t = [p["t"] for p in points]
        ax.plot(t, [p["tokens_per_s"] for p in points], color=BLUE, lw=1.5, label="tokens/s")
        ax.set_xlabel("seconds since scoring began")
        ax.set_ylabel("tokens/s", color=BLUE)
        ax.set_ylim(bottom=0)
        busy = ax.twinx()
        busy.fill_between(
            t,
            [100 * p["model_busy"] for p in points],
            color=ORANGE,
            alpha=0.25,
            step="pre",
            label="model busy",
        )
        busy.set_ylim(0, 105)
        busy.set_ylabel("model busy, % of wall time", color=ORANGE)
        ax.set_zorder(busy.get_zorder() + 1)  # the throughput line over the busy area
        ax.patch.set_visible(False)

    return draw


def draw_buckets(numbers: dict[str, Any]) -> Callable[[Any], None]:
    buckets = numbers["buckets"]

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        labels = [f"{b['from']}-{b['to']}" for b in buckets]
        values = [b["padding_efficiency"] for b in buckets]
        bars = ax.bar(labels, values, color=GREEN)
        for bar, b in zip(bars, buckets, strict=True):
            ax.annotate(
                f"{b['batches']}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
                color="#4a5568",
            )
        ax.set_ylim(0, 1.08)
        ax.set_xlabel("batch width, tokens (bar labels: batches)")
        ax.set_ylabel("real / padded tokens")
        ax.tick_params(axis="x", labelrotation=45)

    return draw


def draw_shards(numbers: dict[str, Any]) -> Callable[[Any], None]:
    shards = numbers["shards"]

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        rows = range(len(shards))  # one bar each, by position: two shards may share a name
        now = [s["this_run"] for s in shards]
        earlier = [s["earlier"] for s in shards]
        ax.barh(rows, earlier, color=GREY, label="committed earlier")
        ax.barh(rows, now, left=earlier, color=BLUE, label="committed by this run")
        bad = [s["bad_rows"] for s in shards]
        if any(bad):
            ax.barh(rows, bad, height=0.3, color=ORANGE, label="rows with an error")
        ax.set_yticks(rows, labels=shard_labels([s["shard"] for s in shards]))
        for i, s in enumerate(shards):
            if s["error"]:
                ax.annotate(
                    "failed",
                    (0, i),
                    xytext=(4, 0),
                    textcoords="offset points",
                    va="center",
                    color=RED,
                    fontweight="bold",
                )
        ax.invert_yaxis()
        ax.set_xlabel("output rows")
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)

    return draw


def shard_labels(shards: list[str]) -> list[str]:
    """Each shard's file name, or its whole path where file names repeat (``a/x.parquet`` and
    ``b/x.parquet``); a character that is not printable (a newline, an undecodable byte) is
    shown as its escape, never drawn."""
    names = [shard.rsplit("/", 1)[-1] for shard in shards]
    if len(set(names)) < len(names):
        names = list(shards)
    return [printable(name) for name in names]


def printable(text: str) -> str:
    """``text`` with every character that is not printable written as its Python escape."""
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


CHARTS = (
    ("phases", "Where the time went", "phases", draw_phases,
     "The whole run's wall time by phase: start-up, preparing, measuring (what the job left to "
     "measurement cost beyond its own work: the gate, precisions tried, int8's calibration), "
     "loading the model, scoring (reading, scoring and committing side by side) and finishing."),
    ("lengths", "Token lengths, and where the sampler cut batches", "histogram", draw_lengths,
     "Rows by token length; each orange line is a batch width the sampler chose (darker: more "
     "batches). Rows are padded up to the next line, so lines close to the bars mean little "
     "padding."),
    ("throughput", "Throughput and model busy over the run", "timeline", draw_timeline,
     "Tokens scored per second, and the share of wall time the model was computing; dips in "
     "the orange area are the model waiting on reading or writing."),
    ("padding", "Padding efficiency per bucket", "buckets", draw_buckets,
     "Real tokens / padded tokens of the batches in each range of widths."),
    ("shards", "Rows per shard", "shards", draw_shards,
     "Output rows per input shard, by this run and earlier ones; failed shards are marked."),
)  # fmt: skip


# each chart's numbers: the run report's key they come from, and why they can be empty
SOURCES = {"phases": "phases", "histogram": "shape", "timeline": "timeline", "buckets": "shape"}
EMPTY = {
    "phases": "This run recorded no time by phase.",
    "histogram": "This run scored no rows.",
    "timeline": "This run scored for too short a time to draw over time.",
    "buckets": "This run ran no batches.",
    "shards": "No shard to show.",
}


def chart(key: str, title: str, data: str, draw: Any, caption: str, numbers: dict) -> str:
    recorded = numbers[data].get("counts") if isinstance(numbers[data], dict) else numbers[data]
    body = svg(draw(numbers), salt=f"batchscore-{key}") if recorded else unrecorded(data, numbers)
    return (
        f'<figure class="chart" id="{key}"><h2>{html.escape(title)}</h2>{body}'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def unrecorded(data: str, numbers: dict[str, Any]) -> str:
    """Why a chart has nothing to draw, as the run's report tells it: a report written before
    it recorded these numbers (by its batchscore version), or a run that had none of them."""
    if SOURCES.get(data) in numbers.get("unrecorded", ()):
        version = numbers["figures"].get("version", "an earlier version")
        said = f"Not recorded by this run: its report, by batchscore {version}, has no "
        return f"<p>{html.escape(said + SOURCES[data])} numbers.</p>"
    return f"<p>{html.escape(EMPTY[data])}</p>"


def spent(numbers: dict[str, Any], phase: str, older: str) -> float:
    """Seconds the run spent in ``phase``, or, for a run from before phases were recorded, the
    report's ``older`` figure for it."""
    phases = {p["phase"]: p["seconds"] for p in numbers.get("phases", [])}
    return float(phases.get(phase, numbers["figures"].get(older, 0.0)))


def figure_cards(numbers: dict[str, Any]) -> str:
    f = numbers["figures"]
    cards = [
        (f"{f.get('rows', 0):,}", "rows scored"),
        (f"{f.get('wall_s', 0):,.1f} s", "wall time"),
        (f"{f.get('rows_per_s', 0):,.1f}", "rows/s"),
        *(
            [(f"{f.get('generated_tokens_per_s', 0):,.0f}", "generated tokens/s")]
            if f.get("generated_tokens")
            else []
        ),
        (
            f"{f.get('tokens_per_s', 0):,.0f}",
            "prompt tokens/s" if f.get("generated_tokens") else "tokens/s",
        ),
        (f"{f.get('tokens', 0):,}", "real tokens"),
        (f"{f.get('padding_efficiency', 1):.3f}", "padding efficiency"),
        (f"{100 * f.get('model_busy_share', 0):.1f}%", "model busy"),
        (f"{spent(numbers, 'loading', 'load_s'):.1f} s", "model load"),
        (f"{spent(numbers, 'measuring', 'tuning_s'):.1f} s", "measuring (gate, calibration)"),
        (f"{f.get('precision', '?')} on {f.get('device', '?')}", "precision, device"),
        (f"{f.get('bad_rows', 0):,}", "rows with an error"),
        (f"{len(numbers['failures'])}", "failed shards"),
        (
            f"{f.get('chunks_committed', 0)} + {f.get('chunks_already_done', 0)}",
            "chunks committed now + before",
        ),
    ]
    return "".join(
        f'<div class="figure"><b>{html.escape(v)}</b><span>{html.escape(k)}</span></div>'
        for v, k in cards
    )


def render(numbers: dict[str, Any]) -> str:
    """The whole page, from `figures.page_numbers`."""
    f, esc = numbers["figures"], html.escape
    outcome = str(f.get("outcome", "?"))
    tone = "ok" if outcome == "ok" else "bad"
    notes = [numbers.get("int8") and f"int8: {numbers['int8']}"]
    why = (numbers.get("settled") or {}).get("precision", {}).get("why")
    notes.append(why and f"precision: {why}")
    gated = f.get("from_gate")
    notes.append(gated and f"quality gate: {gated:,} inputs scored by its pass, not again")
    title = f"batchscore report: {numbers['job']}"
    page = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="sub">run {esc(str(f.get("run_id", "?")))}, started '
        f'{esc(str(numbers["started"]))}: <b class="{tone}">{esc(outcome)}</b>; output '
        f"{esc(str(numbers['output']))}; batchscore {esc(str(f.get('version', '?')))}</p>",
        f'<div class="figures">{figure_cards(numbers)}</div>',
        *(f"<p>{esc(note)}</p>" for note in notes if note),
        f'<div class="charts">{"".join(chart(*spec, numbers) for spec in CHARTS)}</div>',
    ]
    if numbers["failures"]:
        page.append("<h2>Failed shards</h2><table><tr><th>shard</th><th>error</th></tr>")
        page += [
            f"<tr><td>{esc(x['shard'])}</td><td>{esc(x['error'])}</td></tr>"
            for x in numbers["failures"]
        ]
        page.append("</table>")
    page.append("</body></html>\n")
    return "\n".join(page)


def write_page(numbers: dict[str, Any], path: str | Path) -> None:
    """Render the page and write it to ``path``; a failure is a `WriteError` naming it."""
    page = render(numbers)
    try:  # a shard name that is not UTF-8 (an undecodable byte) is written as its escape
        Path(path).write_text(page, encoding="utf-8", errors="backslashreplace")
    except OSError as exc:
        raise write_error(path, exc) from exc
