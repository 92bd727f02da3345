"""``report.html``: one self-contained page (inline CSS, charts as base64 PNG, no external URL).

Works on plain Python rows (lists of dicts) already collected by the job, so
it knows nothing about Spark.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

Row = dict[str, Any]

_CSS = """
body { font-family: sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; margin-top: 1.6em; }
.headline { font-size: 1.4em; background: #eef5ff; padding: 0.6em 1em; border-radius: 6px; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td.text { text-align: left; }
.bad { color: #a00; } img { max-width: 100%; }
"""


@dataclass(frozen=True)
class PageData:
    """Everything the page shows, as collected rows."""

    metrics: str
    records: int
    window: tuple[float | None, float | None]
    bad: list[Row]
    tables: dict[str, list[Row]] = field(default_factory=dict)


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
        return value.strftime("%Y-%m-%d %H:%M")
    return str(value)


def _table(rows: Sequence[Row], columns: Sequence[str], limit: int = 50) -> str:
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
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="chart" src="data:image/png;base64,{data}">'


def _top_topics_chart(rows: list[Row]) -> str:
    if not rows:
        return ""
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1))
    names = [r["topic"] for r in rows][::-1]
    ax.barh(names, [r["published"] for r in rows][::-1], color="#4a7fc1")
    ax.set_xlabel("messages published")
    ax.set_title("Top topics")
    return _png(fig)


def _series_chart(rows: list[Row]) -> str:
    if not rows:
        return ""
    fig, ax = plt.subplots(figsize=(9, 4))
    for node in sorted({r["node"] for r in rows}):
        points = sorted((r["minute"], r["published"]) for r in rows if r["node"] == node)
        ax.plot([p[0] for p in points], [p[1] for p in points], label=node, marker="." if len(points) < 30 else None)
    ax.set_ylabel("published per minute")
    ax.set_title("Published per node and minute (UTC)")
    ax.legend(fontsize="small")
    fig.autofmt_xdate()
    return _png(fig)


def _matrix_chart(rows: list[Row]) -> str:
    if not rows:
        return ""
    nodes = sorted({r["node"] for r in rows} | {r["peer"] for r in rows if r["peer"] is not None})
    index = {n: i for i, n in enumerate(nodes)}
    grid = [[0] * len(nodes) for _ in nodes]
    for r in rows:
        if r["peer"] is not None:
            grid[index[r["node"]]][index[r["peer"]]] = r["count"]
    size = 1.0 + 0.6 * len(nodes)
    fig, ax = plt.subplots(figsize=(size + 2, size))
    image = ax.imshow(grid, cmap="Blues")
    ax.set_xticks(range(len(nodes)), nodes, rotation=45, ha="right")
    ax.set_yticks(range(len(nodes)), nodes)
    ax.set_xlabel("to peer")
    ax.set_ylabel("from node")
    ax.set_title("Messages forwarded node -> peer")
    if len(nodes) <= 12:
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:,}", ha="center", va="center", fontsize=7)
    fig.colorbar(image, ax=ax)
    return _png(fig)


def _latency_chart(rows: list[Row]) -> str:
    finite = [r for r in rows if r.get("p50_ms") is not None]
    if not finite:
        return ""
    labels = [f"{r['origin']} -> {r['node']}" for r in finite]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(finite) + 2), 4))
    width = 0.25
    top = max((v for r in finite for k in ("p50_ms", "p90_ms", "p99_ms") if math.isfinite(v := r[k])), default=1.0)
    for k, (key, colour) in enumerate((("p50_ms", "#7fb77e"), ("p90_ms", "#e0b04a"), ("p99_ms", "#c95b4a"))):
        values = [r[key] if math.isfinite(r[key]) else top * 2 for r in finite]
        xs = [i + (k - 1) * width for i in range(len(finite))]
        ax.bar(xs, values, width, label=key.removesuffix("_ms"), color=colour)
    ax.set_xticks(range(len(finite)), labels, rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("ms (bucket upper bound)")
    ax.set_title("Cross-node latency percentiles (origin -> receiving node)")
    ax.legend()
    return _png(fig)


def _when(t: float | None) -> str:
    if t is None:
        return "open"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render(data: PageData) -> str:
    """The whole page as one HTML string."""
    t = data.tables
    top = t.get("top_topics", [])
    totals = {r["topic"]: r for r in t.get("topic_totals", [])}
    window = t.get("window", [{}])[0]
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
    fanout_rows = sorted(t.get("fanout", []), key=lambda r: (-(r["published"] or 0), r["topic"]))
    sections = [
        "<h2>Summary</h2>",
        f"<p>{data.records:,} records from <code>{escape(data.metrics)}</code>; "
        f"filter since {escape(_when(data.window[0]))} until {escape(_when(data.window[1]))}; "
        f"observed {escape(_when(window.get('first_start')))} to {escape(_when(window.get('last_ts')))} "
        f"({_fmt(window.get('seconds'))} s); {len(totals):,} topics.</p>",
        bad_html,
        "<h2>Top topics</h2>",
        _top_topics_chart(top),
        _table(top, ["rank", "topic", "published", "published_bytes", "published_per_s", "delivered"]),
        "<h2>Fan-out (deliveries per publish)</h2>",
        _table(fanout_rows, ["topic", "published", "delivered", "fanout"], limit=20),
        "<h2>Load per node</h2>",
        _series_chart(t.get("node_minute", [])),
        "<h2>Node-to-node traffic</h2>",
        _matrix_chart(t.get("traffic_matrix", [])),
        _table(t.get("traffic_matrix", []), ["node", "peer", "count", "bytes"]),
        "<h2>Drops by reason</h2>",
        _table(t.get("drops", []), ["node", "frontend", "reason", "count", "bytes"]),
        "<h2>Cross-node latency</h2>",
        "<p>Percentiles are estimated from the histograms: the upper bound of the bucket where the "
        "cumulative count reaches the percentile's rank, so the true value is at most the one shown.</p>",
        _latency_chart(t.get("latency", [])),
        _table(t.get("latency", []), ["origin", "node", "count", "mean_ms", "p50_ms", "p90_ms", "p99_ms"]),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>pubsubclub report</title><style>{_CSS}</style></head><body>"
        f"<h1>pubsubclub cluster report</h1>{headline}{''.join(sections)}</body></html>\n"
    )
