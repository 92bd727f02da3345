"""``report.html``: one self-contained page (inline CSS, charts as base64 PNG, no external URL).

Works on plain Python rows (lists of dicts) already collected by the job, so
it knows nothing about Spark. Each chart is built by a ``*_figure`` function
that returns the matplotlib ``Figure`` (so tests can look at its axes and
labels) and is then embedded as PNG.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html import escape
from typing import Any

import matplotlib.dates as mdates
import numpy
from matplotlib.figure import Figure
from matplotlib.patches import Patch

Row = dict[str, Any]

#: Colour of each latency percentile, in the chart and in the page's legend.
PERCENTILE_COLOURS = (("p50", "#7fb77e"), ("p90", "#e0b04a"), ("p99", "#c95b4a"))
#: Bars of the top-topics chart.
BAR_COLOUR = "#4a7fc1"
#: Columns of the top-topics and internal-topics tables on the page.
TOP_COLUMNS = ("rank", "topic", "published", "published_bytes", "published_per_s", "delivered")
INTERNAL_COLUMNS = ("topic", "published", "delivered", "forwarded", "received")
#: Rows of the internal-topics table on the page (the Parquet table has them all).
INTERNAL_ROWS = 10

_CSS = """
body { font-family: sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; margin-top: 1.6em; }
.headline { font-size: 1.4em; background: #eef5ff; padding: 0.6em 1em; border-radius: 6px; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td.text { text-align: left; }
.bad { color: #a00; } img { max-width: 100%; }
figure { margin: 0.5em 0; } figcaption, .note { font-size: 0.9em; color: #555; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; margin: 0 0.3em 0 0.8em; vertical-align: middle; }
.hatched { background: repeating-linear-gradient(45deg, #fff 0 2px, #888 2px 3px); }
"""


@dataclass(frozen=True)
class PageData:
    """Everything the page shows, as collected rows (timestamps: aware, or naive UTC)."""

    metrics: str
    records: int
    window: tuple[float | None, float | None]
    bad: list[Row]
    tables: dict[str, list[Row]] = field(default_factory=dict)
    #: Dump files left unread, as (path, why): damaged Parquet files.
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isinf(value):
            return "above last bound"
        return f"{value:,.3f}".rstrip("0").rstrip(".") if value != int(value) else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, datetime):
        return _utc(value).strftime("%Y-%m-%d %H:%M")
    return str(value)


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _table(rows: Sequence[Row], columns: Sequence[str], limit: int = 50, ident: str = "") -> str:
    if not rows:
        return "<p>(none)</p>"
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = []
    for row in rows[:limit]:
        cells = []
        for c in columns:
            v = row.get(c)
            cls = ' class="text"' if isinstance(v, str) else ""
            cells.append(f"<td{cls}>{escape(_fmt(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f"<p>({len(rows) - limit:,} more rows in the Parquet table)</p>" if len(rows) > limit else ""
    id_attr = f' id="{ident}"' if ident else ""
    return f"<table{id_attr}><tr>{head}</tr>{''.join(body)}</table>{more}"


def _chart(fig: Figure | None, ident: str, alt: str, caption: str = "") -> str:
    """``fig`` as an inline PNG in a ``<figure>``; ``caption`` is HTML."""
    if fig is None:
        return ""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    below = f"<figcaption>{caption}</figcaption>" if caption else ""
    return f'<figure id="{ident}"><img alt="{escape(alt)}" src="data:image/png;base64,{data}">{below}</figure>'


def top_topics_figure(rows: list[Row]) -> Figure | None:
    """Horizontal bars of messages published per top topic, the first on top; None without rows."""
    if not rows:
        return None
    fig = Figure(figsize=(8, 0.4 * len(rows) + 1))
    ax = fig.subplots()
    names = [r["topic"] for r in rows][::-1]
    ax.barh(names, [r["published"] for r in rows][::-1], color=BAR_COLOUR)
    ax.set_xlabel("messages published")
    ax.set_title("Top topics")
    return fig


def load_span(rows: list[Row]) -> tuple[datetime, datetime] | None:
    """The first and last minute of the per-node series (over all nodes), or None without rows."""
    if not rows:
        return None
    minutes = [r["minute"] for r in rows]
    return min(minutes), max(minutes)


def load_figure(rows: list[Row]) -> Figure | None:
    """Messages published per node and minute; the x axis runs from the data's first minute to its last.

    Neither the ``--since``/``--until`` filter nor matplotlib's margins widen
    it, so a short run fills the chart. A single minute is shown half a
    minute either side.
    """
    span = load_span(rows)
    if span is None:
        return None
    fig = Figure(figsize=(9, 4))
    ax = fig.subplots()
    for node in sorted({r["node"] for r in rows}):
        points = sorted((r["minute"], r["published"]) for r in rows if r["node"] == node)
        ax.plot([p[0] for p in points], [p[1] for p in points], label=node, marker="." if len(points) < 30 else None)
    first, last = span
    if first == last:
        first, last = first - timedelta(seconds=30), last + timedelta(seconds=30)
    ax.set_xlim(mdates.date2num(first), mdates.date2num(last))
    locator = mdates.AutoDateLocator(tz=UTC)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))
    ax.set_ylabel("published per minute")
    ax.set_title("Published per node and minute (UTC)")
    ax.legend(fontsize="small")
    return fig


def _linear(channel: float) -> float:
    """An sRGB channel (0-1) in linear light."""
    return channel / 12.92 if channel <= 0.04045 else ((channel + 0.055) / 1.055) ** 2.4


def label_colour(rgba: Sequence[float]) -> str:
    """``"white"`` or ``"black"``: the text colour with the higher WCAG contrast on a cell of colour ``rgba`` (0-1)."""
    red, green, blue = (_linear(c) for c in rgba[:3])
    luminance = 0.2126 * red + 0.7152 * green + 0.0722 * blue
    on_white = 1.05 / (luminance + 0.05)  # contrast ratio of white text
    on_black = (luminance + 0.05) / 0.05  # contrast ratio of black text
    return "white" if on_white > on_black else "black"


def traffic_figure(rows: list[Row]) -> Figure | None:
    """Heatmap of messages forwarded node -> peer, cells labelled (up to 12 nodes) in a colour readable on them."""
    if not rows:
        return None
    nodes = sorted({r["node"] for r in rows} | {r["peer"] for r in rows if r["peer"] is not None})
    index = {n: i for i, n in enumerate(nodes)}
    grid = [[0] * len(nodes) for _ in nodes]
    for r in rows:
        if r["peer"] is not None:
            grid[index[r["node"]]][index[r["peer"]]] = r["count"]
    size = 1.0 + 0.6 * len(nodes)
    fig = Figure(figsize=(size + 2, size))
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="Blues")
    ax.set_xticks(range(len(nodes)), nodes, rotation=45, ha="right")
    ax.set_yticks(range(len(nodes)), nodes)
    ax.set_xlabel("to peer")
    ax.set_ylabel("from node")
    ax.set_title("Messages forwarded node -> peer")
    if len(nodes) <= 12:
        cells = image.to_rgba(numpy.array(grid))  # each cell's colour, to pick a readable label colour
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                colour = label_colour(tuple(cells[i][j]))
                ax.text(j, i, f"{v:,}", ha="center", va="center", fontsize=7, color=colour)
    fig.colorbar(image, ax=ax)
    return fig


def latency_figure(rows: list[Row]) -> Figure | None:
    """Grouped bars of p50, p90 and p99 per (origin, node) on a log scale; None without any latency.

    The y axis starts a decade below the smallest value, so that every bar,
    p50 included, has a visible height. Estimates above the last bucket bound
    are drawn hatched, above the highest finite value.
    """
    pairs = [r for r in rows if r.get("p50_ms") is not None]
    if not pairs:
        return None
    keys = [f"{name}_ms" for name, _colour in PERCENTILE_COLOURS]
    finite = [v for r in pairs for k in keys if (v := r[k]) is not None and math.isfinite(v) and v > 0]
    top = max(finite, default=1.0)
    bottom = 10.0 ** (math.floor(math.log10(min(finite, default=1.0))) - 1)
    fig = Figure(figsize=(max(6.0, 0.9 * len(pairs) + 2), 4))
    ax = fig.subplots()
    width = 0.25
    overflow = False
    for k, (name, colour) in enumerate(PERCENTILE_COLOURS):
        values = [r[f"{name}_ms"] for r in pairs]
        heights = [v if math.isfinite(v) else top * 2 for v in values]
        xs = [i + (k - 1) * width for i in range(len(pairs))]
        bars = ax.bar(xs, heights, width, label=name, color=colour)
        for bar, v in zip(bars, values, strict=True):
            if not math.isfinite(v):
                bar.set_hatch("//")
                bar.set_edgecolor("#555")
                overflow = True
    ax.set_yscale("log")
    ax.set_ylim(bottom, top * 4)
    ax.set_xticks(range(len(pairs)), [f"{r['origin']} -> {r['node']}" for r in pairs], rotation=30, ha="right")
    ax.set_ylabel("ms (bucket upper bound)")
    ax.set_title("Cross-node latency percentiles (origin -> receiving node)")
    handles, _labels = ax.get_legend_handles_labels()
    if overflow:
        handles.append(Patch(facecolor="white", edgecolor="#555", hatch="//", label="above last bound"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the plot: bars reach the top
    return fig


def _latency_legend() -> str:
    swatches = "".join(
        f'<span class="swatch" style="background: {colour}"></span>{name}' for name, colour in PERCENTILE_COLOURS
    )
    return f'<span id="latency-legend">{swatches}<span class="swatch hatched"></span>above the last bucket bound</span>'


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def filter_words(since: float | None, until: float | None) -> str:
    """The ``--since``/``--until`` window in words, an open side named after the data's first or last record."""
    start = "from the first record" if since is None else f"from {_when(since)}"
    end = "to the last record" if until is None else f"until {_when(until)} (exclusive)"
    return f"{start} {end}"


def render(data: PageData) -> str:
    """The whole page as one HTML string."""
    t = data.tables
    top = t.get("top_topics", [])
    internal = t.get("internal_topics", [])
    totals = {r["topic"]: r for r in t.get("topic_totals", [])}
    window = (t.get("window") or [{}])[0]
    if top:
        first = top[0]
        rate = _fmt(first["published_per_s"]) if first["published_per_s"] is not None else "-"
        headline = (
            f'<p class="headline">Top topic: <strong id="top-topic">{escape(first["topic"])}</strong> '
            f"({first['published']:,} published, {rate}/s)</p>"
        )
    else:
        headline = '<p class="headline">No topic was published in this window.</p>'
    bad_total = sum(r["lines"] for r in data.bad)
    bad_html = (
        f'<p class="bad">{bad_total:,} bad lines were skipped:</p>' + _table(data.bad, ["reason", "lines", "example"])
        if data.bad
        else "<p>No bad lines.</p>"
    )
    if data.skipped:
        items = "".join(f"<li><code>{escape(path)}</code>: {escape(why)}</li>" for path, why in data.skipped)
        count = f"{len(data.skipped):,} damaged dump files were skipped"
        bad_html += f'<p class="bad" id="skipped-files">{count}:</p><ul>{items}</ul>'
    internal_html = (
        '<h3>Internal topics</h3><p class="note">Topics starting with <code>$</code> are reserved for the cluster '
        "(NSD replication, gap notices, further WAMP realms) and left out of the top topics above.</p>"
        + _table(internal, INTERNAL_COLUMNS, INTERNAL_ROWS, "internal-topics")
        if internal
        else ""
    )
    fanout_rows = sorted(t.get("fanout", []), key=lambda r: (-(r["published"] or 0), r["topic"]))
    node_minute = t.get("node_minute", [])
    span = load_span(node_minute)
    load_caption = (
        f'<span id="load-span">{_fmt(span[0])} to {_fmt(span[1])} UTC</span>: the first and last minute with records.'
        if span
        else ""
    )
    topics = f"{len(totals):,} topics" + (f" ({len(internal):,} internal)" if internal else "")
    sections = [
        "<h2>Summary</h2>",
        f'<p id="summary">{data.records:,} records from <code>{escape(data.metrics)}</code>; '
        f'time filter <span id="time-filter">{escape(filter_words(*data.window))}</span>; '
        f"observed {escape(_when(window.get('first_start')))} to {escape(_when(window.get('last_ts')))} "
        f"({_fmt(window.get('seconds'))} s); {topics}.</p>",
        bad_html,
        "<h2>Top topics</h2>",
        _chart(top_topics_figure(top), "top-topics-chart", "Messages published per top topic"),
        _table(top, TOP_COLUMNS, ident="top-topics"),
        internal_html,
        "<h2>Fan-out (deliveries per publish)</h2>",
        _table(fanout_rows, ["topic", "published", "delivered", "fanout"], limit=20),
        "<h2>Load per node</h2>",
        _chart(load_figure(node_minute), "load-chart", "Messages published per node and minute", load_caption),
        "<h2>Node-to-node traffic</h2>",
        _chart(traffic_figure(t.get("traffic_matrix", [])), "traffic-chart", "Messages forwarded node to peer"),
        _table(t.get("traffic_matrix", []), ["node", "peer", "count", "bytes"]),
        "<h2>Drops by reason</h2>",
        _table(t.get("drops", []), ["node", "frontend", "reason", "count", "bytes"]),
        "<h2>Cross-node latency</h2>",
        "<p>Percentiles are estimated from the histograms: the upper bound of the bucket where the "
        "cumulative count reaches the percentile's rank, so the true value is at most the one shown.</p>",
        _chart(
            latency_figure(t.get("latency", [])),
            "latency-chart",
            "Latency percentiles p50, p90 and p99 per origin and receiving node",
            _latency_legend(),
        ),
        _table(t.get("latency", []), ["origin", "node", "count", "mean_ms", "p50_ms", "p90_ms", "p99_ms"]),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>pubsubclub report</title><style>{_CSS}</style></head><body>"
        f"<h1>pubsubclub cluster report</h1>{headline}{''.join(sections)}</body></html>\n"
    )
