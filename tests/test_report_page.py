"""report.html: each chart and section on hand-made rows, then on a Spark run, then as headless Chromium shows it."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import matplotlib.dates as mdates
import matplotlib.image
import numpy
import orjson
import pytest
from helpers.spark import T0, counter, write_dump
from pyspark.sql import SparkSession
from pyspark.sql.types import TimestampType

from pubsubclub.reports import page
from pubsubclub.reports.generate import generate
from pubsubclub.reports.job import ReportResult, as_utc, run_report

#: Chromium's own bound for loading the page; the process gets a margin on top.
BROWSER_SECONDS = 60
INF = float("inf")
#: Elements that have no end tag.
VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class PageDom(HTMLParser):
    """The text of every element that has an id, and the cell texts of every table that has one."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.text: dict[str, str] = {}
        self.tables: dict[str, list[list[str]]] = {}
        self.images: list[dict[str, str]] = []
        self._open: list[tuple[str, str | None]] = []
        self._table: str | None = None
        self._row: list[str] | None = None
        self._in_cell = False
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        """Track ids, tables, rows and cells."""
        a = {k: v or "" for k, v in attrs}
        if tag == "img":
            self.images.append(a)
        if tag in VOID_TAGS:
            return
        ident = a.get("id")
        self._open.append((tag, ident))
        if ident:
            self.text[ident] = ""
        if tag == "table":
            self._table = ident
            if ident:
                self.tables[ident] = []
        elif tag == "tr" and self._table:
            self._row = []
            self.tables[self._table].append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._row.append("")
            self._in_cell = True

    def handle_endtag(self, tag: str) -> None:
        """Close the innermost element named ``tag``."""
        if tag in VOID_TAGS:
            return
        while self._open:
            if self._open.pop()[0] == tag:
                break
        if tag == "table":
            self._table, self._row = None, None
        elif tag in ("td", "th"):
            self._in_cell = False

    def handle_data(self, data: str) -> None:
        """Add text to every open element with an id, and to the current cell."""
        for _tag, ident in self._open:
            if ident:
                self.text[ident] += data
        if self._in_cell and self._row is not None:
            self._row[-1] += data

    def column(self, table: str, name: str) -> list[str]:
        """The cells of column ``name`` (by its header) of table ``table``, header excluded."""
        head, *rows = self.tables[table]
        i = head.index(name)
        return [row[i] for row in rows]


def minute(m: int) -> datetime:
    """2026-01-01 00:mm UTC."""
    return datetime(2026, 1, 1, 0, m, tzinfo=UTC)


def page_data(tables: dict[str, list[dict[str, Any]]], window: tuple[float | None, float | None] = (None, None)) -> str:
    """The page of these rows."""
    return page.render(page.PageData("metrics/", 10, window, [], tables))


# --- hand-made rows, no Spark -------------------------------------------------------------------------------------


def test_load_chart_spans_the_data_from_first_to_last_minute() -> None:
    """The x axis runs exactly from the first minute any node has to the last, with no margin."""
    rows = [
        {"node": "a", "minute": minute(3), "published": 5},
        {"node": "a", "minute": minute(4), "published": 6},
        {"node": "b", "minute": minute(2), "published": 1},
        {"node": "b", "minute": minute(9), "published": 2},
    ]
    fig = page.load_figure(rows)
    assert fig is not None
    assert fig.axes[0].get_xlim() == (mdates.date2num(minute(2)), mdates.date2num(minute(9)))
    dom = PageDom(page_data({"node_minute": rows}))
    assert dom.text["load-span"] == "2026-01-01 00:02 to 2026-01-01 00:09 UTC"


def test_load_chart_of_one_minute_shows_half_a_minute_either_side() -> None:
    """A single minute gives a minute-wide axis centred on it, not matplotlib's default days."""
    fig = page.load_figure([{"node": "a", "minute": minute(5), "published": 5}])
    assert fig is not None
    low, high = fig.axes[0].get_xlim()
    assert (low + high) / 2 == pytest.approx(mdates.date2num(minute(5)))
    assert (high - low) * 86400 == pytest.approx(60)


def test_label_colour_is_the_one_readable_on_the_cell() -> None:
    """White text on dark cells, black on light ones, by WCAG relative luminance."""
    assert page.label_colour((0.0, 0.0, 0.0, 1.0)) == "white"
    assert page.label_colour((1.0, 1.0, 1.0, 1.0)) == "black"
    assert page.label_colour((0.03, 0.19, 0.42, 1.0)) == "white"  # the darkest "Blues"
    assert page.label_colour((0.97, 0.98, 1.0, 1.0)) == "black"  # the lightest "Blues"
    assert page.label_colour((1.0, 1.0, 0.0, 1.0)) == "black"  # yellow is light though saturated


def test_heatmap_labels_are_white_on_dark_cells_and_black_on_light_ones() -> None:
    """The busiest link's label is white on its dark cell; the empty diagonal's labels are black."""
    rows = [
        {"node": "a", "peer": "b", "count": 1000, "bytes": 1},
        {"node": "b", "peer": "a", "count": 10, "bytes": 1},
    ]
    fig = page.traffic_figure(rows)
    assert fig is not None
    colours = {text.get_text(): text.get_color() for text in fig.axes[0].texts}
    assert colours == {"1,000": "white", "10": "black", "0": "black"}


def test_latency_chart_shows_p50_with_the_higher_percentiles() -> None:
    """Bars for p50, p90 and p99 each rise above the axis floor, even when p50 is the smallest bound."""
    rows = [
        {"origin": "a", "node": "b", "count": 100, "mean_ms": 0.8, "p50_ms": 1.0, "p90_ms": 1.0, "p99_ms": 5.0},
        {"origin": "a", "node": "c", "count": 100, "mean_ms": 2.0, "p50_ms": 1.0, "p90_ms": 5.0, "p99_ms": INF},
    ]
    fig = page.latency_figure(rows)
    assert fig is not None
    ax = fig.axes[0]
    floor, ceiling = ax.get_ylim()
    bars = {container.get_label(): [p.get_height() for p in container] for container in ax.containers}
    assert bars == {"p50": [1.0, 1.0], "p90": [1.0, 5.0], "p99": [5.0, 10.0]}
    assert all(floor < h < ceiling for heights in bars.values() for h in heights)
    legend = ax.get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == ["p50", "p90", "p99", "above last bound"]
    assert "p50" in PageDom(page_data({"latency": rows})).text["latency-legend"]


def test_summary_names_open_filter_bounds_in_words() -> None:
    """No --since/--until reads "from the first record to the last record"; a given bound is a UTC time."""
    assert PageDom(page_data({})).text["time-filter"] == "from the first record to the last record"
    since_only = PageDom(page_data({}, (T0, None))).text["time-filter"]
    assert since_only == "from 2026-01-01 00:00:00 UTC to the last record"
    until_only = PageDom(page_data({}, (None, T0 + 60))).text["time-filter"]
    assert until_only == "from the first record until 2026-01-01 00:01:00 UTC (exclusive)"
    assert "None" not in page_data({}) and "open" not in page_data({})


def test_internal_topics_get_their_own_table() -> None:
    """Rows of internal_topics appear in a table under an "Internal topics" heading; top topics stay as given."""
    top = [{"rank": 1, "topic": "t", "published": 3, "published_bytes": 30, "published_per_s": 0.5, "delivered": 3}]
    internal = [{"topic": "$nsd.log", "published": 9, "delivered": 0, "forwarded": 4, "received": 0}]
    html = page_data({"top_topics": top, "internal_topics": internal})
    dom = PageDom(html)
    assert dom.column("top-topics", "topic") == ["t"]
    assert dom.column("internal-topics", "topic") == ["$nsd.log"]
    assert "<h3>Internal topics</h3>" in html
    assert "internal-topics" not in page_data({"top_topics": top})


@pytest.fixture
def kolkata(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone is Asia/Kolkata (UTC+05:30) for the test."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("kolkata")
def test_collected_timestamps_are_utc_whatever_the_local_zone() -> None:
    """PySpark hands timestamps over in local time; the job turns them back into UTC for the page."""
    collected = TimestampType().fromInternal(int(T0 * 1_000_000))
    assert collected == datetime(2026, 1, 1, 5, 30)  # what PySpark's collect() gives here
    assert as_utc(collected) == minute(0)
    assert as_utc(7) == 7


# --- a Spark run over generated dumps -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def report(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> ReportResult:
    """The report of 3,000 generated records (3 nodes, 20 intervals each) plus two busy internal topics."""
    root = tmp_path_factory.mktemp("page")
    generate(root / "m", 3000, nodes=3, topics=6, seed=2, per_file=50)
    write_dump(root / "m", "node1", T0 + 10, [
        counter("node1", "$nsd.log", "published", 1_000_000, 10_000_000),
        counter("node1", "$realm.other#chat", "published", 500_000, 5_000_000),
    ], seq=7)  # fmt: skip
    return run_report(root / "m", root / "out", spark=spark, progress=lambda _m: None)


def dump_minutes(root: Path) -> tuple[datetime, datetime]:
    """The first and last minute of the dumps' ``ts``, read from the files."""
    stamps = [orjson.loads(line)["ts"] for p in root.rglob("*.jsonl") for line in p.read_bytes().splitlines()]
    first, last = (datetime.fromtimestamp(t // 60 * 60, UTC) for t in (min(stamps), max(stamps)))
    return first, last


@pytest.mark.slow
def test_page_of_a_run_shows_every_item(report: ReportResult) -> None:
    """Top topics without ``$`` topics, an internal table, open bounds in words, the data's time span, p50."""
    dom = PageDom(report.html.read_text())
    top = dom.column("top-topics", "topic")
    assert top == [f"com.example.topic.{i}" for i in range(6)]
    assert dom.text["top-topic"] == "com.example.topic.0"
    assert set(dom.column("internal-topics", "topic")) == {"$nsd.log", "$realm.other#chat"}
    assert "from the first record to the last record" in dom.text["summary"]
    first, last = dump_minutes(report.out.parent / "m")
    assert (first, last) == (minute(0), minute(3))  # 20 intervals of 10 s
    assert dom.text["load-span"] == "2026-01-01 00:00 to 2026-01-01 00:03 UTC"
    fig = page.load_figure(report.rows["node_minute"])
    assert fig is not None
    assert fig.axes[0].get_xlim() == (mdates.date2num(first), mdates.date2num(last))
    assert "p50" in dom.text["latency-legend"]
    assert len(dom.images) == 4 and all(i["src"].startswith("data:image/png;base64,") for i in dom.images)


def _chromium() -> str:
    chromium = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
    if not os.access(chromium, os.X_OK):
        pytest.fail(f"{chromium} is missing: install Debian's chromium (`make browser`, part of `make test`)")
    return chromium


def _headless(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on its own profile (other tests may run one too), bounded in time."""
    command = [_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--force-color-profile=srgb",
               f"--user-data-dir={tmp_path / 'profile'}", f"--timeout={BROWSER_SECONDS * 1000}", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_SECONDS + 30)


def _has_colour(image: numpy.ndarray, hex_colour: str, tolerance: float = 6 / 255) -> bool:
    want = numpy.array([int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return bool((numpy.abs(image[..., :3] - want) <= tolerance).all(axis=-1).any())


@pytest.mark.slow
@pytest.mark.browser
def test_page_loads_in_headless_chromium(report: ReportResult, tmp_path: Path) -> None:
    """Chromium's DOM has the summary words, top topics without ``$`` topics and the p50 legend; charts paint."""
    url = report.html.as_uri()
    dumped = _headless(tmp_path, "--dump-dom", url)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = PageDom(dumped.stdout)
    assert "pubsubclub cluster report" in dumped.stdout
    assert "from the first record to the last record" in dom.text["summary"]
    top = dom.column("top-topics", "topic")
    assert top and not any(t.startswith("$") for t in top)
    assert "$nsd.log" in dom.column("internal-topics", "topic")
    assert "p50" in dom.text["latency-legend"]
    assert len(dom.images) == 4

    shot = tmp_path / "page.png"
    painted = _headless(tmp_path, "--window-size=1280,5000", f"--screenshot={shot}", url)
    assert painted.returncode == 0 and shot.exists(), painted.stderr[-2000:]
    pixels = matplotlib.image.imread(shot)
    assert _has_colour(pixels, page.BAR_COLOUR)  # the top-topics chart was decoded and drawn
    assert _has_colour(pixels, dict(page.PERCENTILE_COLOURS)["p50"])  # p50 bars (or the legend swatch)
