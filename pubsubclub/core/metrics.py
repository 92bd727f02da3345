"""Node metrics: cheap counters on the hot path, periodic dumps (JSON lines and/or Parquet), Prometheus.

Front-ends and the federation call :meth:`Metrics.count` (one dict lookup and
two integer additions) and :meth:`Metrics.latency`. Every interval a
:class:`MetricsDumper` writes the interval's counts as one file per format in
the layout and schema of docs/metrics.md (through :mod:`pubsubclub.core.dumpfile`:
a temporary name, then renamed), and folds them into the running totals that
the Prometheus collector reports.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from twisted.logger import Logger

from pubsubclub.core.counters import COMPONENTS, AnyEvent, DropReason, Kind, LinkCount, Source
from pubsubclub.core.dumpfile import formats_of, hour_folders, merge_parquet_dumps, parquet_problem, write_dump

log = Logger()

SCHEMA_VERSION = 1

#: Latency histogram bucket upper bounds, milliseconds.
LATENCY_BOUNDS_MS: tuple[float, ...] = (0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)

#: Per-link counters of the replay extension: kind -> (Prometheus family, help).
LINK_COUNTS: dict[LinkCount, tuple[str, str]] = {
    LinkCount.GAPS: ("pubsubclub_link_gaps", "Gaps reported in the stream from a producer node (PSC 0.3)"),
    LinkCount.LOST: ("pubsubclub_link_lost_messages", "Messages from a producer node known lost in gaps (PSC 0.3)"),
    LinkCount.REPLAYED: ("pubsubclub_link_replayed_messages", "Messages resent to a consumer node on resume (PSC 0.3)"),
    LinkCount.DUPLICATES: ("pubsubclub_link_duplicates_dropped", "Duplicate messages dropped by sequence (PSC 0.3)"),
}

#: (topic, frontend, kind, peer, reason)
CounterKey = tuple[str, str, str, str | None, str | None]

#: Topic label of the series that sums every topic past a cap (docs/metrics.md, "Topic cap").
OTHER_TOPIC = "__other__"
#: Topics given their own series in ``/metrics`` (the busiest); the rest are summed under OTHER_TOPIC.
DEFAULT_MAX_TOPICS = 200
#: Counter keys held per interval and in the totals; past it new topics count under OTHER_TOPIC,
#: so publishing on ever new topics cannot grow a node's memory.
DEFAULT_MAX_KEYS = 100_000


#: Event -> its (component, event) counter key, made once: :meth:`Metrics.event` runs several times per message.
#: By enum class first, since members of different enums with the same value are equal strings.
_EVENT_KEYS: dict[type, dict[str, tuple[str, str]]] = {
    cls: {event: (component, event.value) for event in cls} for component, cls in COMPONENTS.items()
}


def payload_size(envelope: Any) -> int:
    """The bytes counted for one message (docs/metrics.md, ``bytes``).

    The size the decoder that read the message put on the envelope (the WAMP
    PUBLISH or PSC301 as received); else the payload's JSON size, computed
    once per envelope.
    """
    size = envelope.size
    if size is not None:
        return int(size)
    wire = envelope.wire
    size = wire.get("size")
    if size is None:
        try:
            size = len(orjson.dumps(envelope.payload))
        except TypeError:  # not JSON (msgpack bytes)
            payload = envelope.payload
            size = len(payload) if isinstance(payload, (bytes, bytearray)) else 0
        wire["size"] = size
    return int(size)


class _Histogram:
    """Counts per bucket, plus count and sum."""

    __slots__ = ("counts", "count", "sum_ms")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BOUNDS_MS) + 1)
        self.count = 0
        self.sum_ms = 0.0

    def add(self, ms: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BOUNDS_MS, ms)] += 1
        self.count += 1
        self.sum_ms += ms

    def merge(self, other: _Histogram) -> None:
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.count += other.count
        self.sum_ms += other.sum_ms


class Metrics:
    """Counters and latency histograms of one node.

    The node makes one (``node/node.py``) and hands it to the hub, the
    federation and every front-end. Every name passed in is one of the enums
    of :mod:`pubsubclub.core.counters` (typed so: mypy refuses a ``str``).
    """

    def __init__(self, node_id: str, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.node_id = node_id
        #: Distinct counter keys kept per interval and in the totals (see DEFAULT_MAX_KEYS).
        self.max_keys = max_keys
        #: This interval's counts: key -> [count, bytes].
        self._interval: dict[CounterKey, list[int]] = {}
        self._interval_latency: dict[str, _Histogram] = {}
        #: Everything before this interval (for Prometheus).
        self._totals: dict[CounterKey, list[int]] = {}
        self._total_latency: dict[str, _Histogram] = {}
        self.interval_start = time.time()
        #: Cumulative per-link replay counts (PSC 0.3): (peer, kind) -> n; kinds in LINK_COUNTS.
        self.link_counts: dict[tuple[str, LinkCount], int] = {}
        #: Hub sinks (and listeners) that raised, by class name; cumulative (docs/security.md).
        self.sink_errors: dict[str, int] = {}
        #: Faults handled without closing anything, by (component, reason); cumulative.
        self.errors: dict[tuple[str, str], int] = {}
        #: Connections the node closed to protect itself, by (front-end or "psc", reason); cumulative.
        self.disconnects: dict[tuple[str, str], int] = {}
        #: Connections refused at accept by a listener's caps, by (listener, reason); cumulative.
        self.refusals: dict[tuple[str, str], int] = {}
        #: Event counters of the components (pubsubclub/core/counters.py), by (component, event); cumulative.
        self.events: dict[tuple[str, str], int] = {}
        #: What components held back (counted once per reactor turn or read, not per message) is added by these,
        #: run before anything reads the counters: every read sees the same totals as counting at once.
        self._settlers: list[Callable[[], None]] = []

    def add_settler(self, settle: Callable[[], None]) -> None:
        """Run ``settle()`` before every read of the counters; it adds what its component held back."""
        self._settlers.append(settle)

    def settle(self) -> None:
        """Add every count held back by a component (run by each read: view, totals, take_interval, collect)."""
        for settle in self._settlers:
            settle()

    def count(
        self,
        topic: str,
        frontend: Source,
        kind: Kind,
        n: int = 1,
        nbytes: int = 0,
        peer: str | None = None,
        reason: DropReason | None = None,
    ) -> None:
        """Add ``n`` messages (``nbytes`` bytes) to a counter."""
        key = (topic, frontend, kind, peer, reason)
        cell = self._interval.get(key)
        if cell is None:
            if len(self._interval) >= self.max_keys:
                # Ever new topics (one client can make thousands) are summed, not tracked one by one.
                key = (OTHER_TOPIC, frontend, kind, peer, reason)
                cell = self._interval.get(key)
                if cell is not None:
                    cell[0] += n
                    cell[1] += nbytes
                    return
            self._interval[key] = [n, nbytes]
        else:
            cell[0] += n
            cell[1] += nbytes

    def event(self, event: AnyEvent, n: int = 1) -> None:
        """Add ``n`` to a component's event counter (the component is the enum's)."""
        key = _EVENT_KEYS[type(event)][event]
        self.events[key] = self.events.get(key, 0) + n

    def view(self, component: str) -> dict[str, int]:
        """One component's event counters as a dict, every declared event present (for /stats)."""
        self.settle()
        return {e.value: self.events.get((component, e.value), 0) for e in COMPONENTS[component]}

    def link_count(self, peer: str, kind: LinkCount, n: int = 1) -> None:
        """Add ``n`` to a per-link replay counter (``kind`` is a key of LINK_COUNTS)."""
        key = (peer, kind)
        self.link_counts[key] = self.link_counts.get(key, 0) + n

    def sink_error(self, sink: str) -> None:
        """A hub sink or listener of class ``sink`` raised; it was logged and skipped."""
        self.sink_errors[sink] = self.sink_errors.get(sink, 0) + 1

    def error(self, component: Source, reason: str, n: int = 1) -> None:
        """``n`` faults of ``component`` handled without closing anything (skipped records, handler errors)."""
        key = (component, reason)
        self.errors[key] = self.errors.get(key, 0) + n

    def disconnect(self, frontend: str, reason: str) -> None:
        """The node closed one connection of ``frontend`` to protect itself (``reason``: slow_consumer, ...)."""
        key = (frontend, reason)
        self.disconnects[key] = self.disconnects.get(key, 0) + 1

    def refusal(self, listener: str, reason: str) -> None:
        """A listener refused one connection at accept (``reason``: address_cap, listener_cap)."""
        key = (listener, reason)
        self.refusals[key] = self.refusals.get(key, 0) + 1

    def latency(self, origin: str, seconds: float) -> None:
        """One cross-node delivery from ``origin`` that took ``seconds``."""
        hist = self._interval_latency.get(origin)
        if hist is None:
            hist = self._interval_latency[origin] = _Histogram()
        ms = seconds * 1000.0 if seconds > 0.0 else 0.0
        hist.counts[bisect.bisect_left(LATENCY_BOUNDS_MS, ms)] += 1  # _Histogram.add, inlined: once per message
        hist.count += 1
        hist.sum_ms += ms

    def latencies(self, origin: str, seconds: list[float]) -> None:
        """Several cross-node deliveries from ``origin`` (:meth:`latency` for each of ``seconds``)."""
        hist = self._interval_latency.get(origin)
        if hist is None:
            hist = self._interval_latency[origin] = _Histogram()
        counts, bucket, total = hist.counts, bisect.bisect_left, 0.0
        for s in seconds:
            ms = s * 1000.0 if s > 0.0 else 0.0
            counts[bucket(LATENCY_BOUNDS_MS, ms)] += 1
            total += ms
        hist.count += len(seconds)
        hist.sum_ms += total

    def take_interval(self, now: float) -> tuple[float, dict[CounterKey, list[int]], dict[str, _Histogram]]:
        """Hand over this interval's counts and start a new interval."""
        self.settle()
        start = self.interval_start
        counters, latency = self._interval, self._interval_latency
        self._interval, self._interval_latency = {}, {}
        self.interval_start = now
        for key, (n, nbytes) in counters.items():
            cell = self._totals.setdefault(key, [0, 0])
            cell[0] += n
            cell[1] += nbytes
        if len(self._totals) > self.max_keys:
            self._totals = _fold_quiet_topics(self._totals, self.max_keys // 2)
        for origin, hist in latency.items():
            self._total_latency.setdefault(origin, _Histogram()).merge(hist)
        return start, counters, latency

    def totals(self) -> Iterator[tuple[CounterKey, int, int]]:
        """Cumulative counts (past intervals plus the current one)."""
        self.settle()
        keys = set(self._totals) | set(self._interval)
        for key in keys:
            past = self._totals.get(key, (0, 0))
            now = self._interval.get(key, (0, 0))
            yield key, past[0] + now[0], past[1] + now[1]

    def capped_totals(self, max_topics: int) -> list[tuple[CounterKey, int, int]]:
        """:meth:`totals` with only the ``max_topics`` busiest topics (by messages, then name) named.

        Every other topic's counts are summed into keys whose topic is
        OTHER_TOPIC, so the sum over all series is unchanged.
        """
        rows = list(self.totals())
        busy: dict[str, int] = {}
        for key, n, _ in rows:
            busy[key[0]] = busy.get(key[0], 0) + n
        named = busiest(busy, max_topics)
        if named is None:
            return rows
        summed: dict[CounterKey, list[int]] = {}
        for key, n, nbytes in rows:
            if key[0] not in named:
                key = (OTHER_TOPIC, *key[1:])  # type: ignore[assignment]
            cell = summed.setdefault(key, [0, 0])
            cell[0] += n
            cell[1] += nbytes
        return [(key, n, nbytes) for key, (n, nbytes) in summed.items()]

    def total_latency(self) -> dict[str, _Histogram]:
        """Cumulative latency histograms per origin."""
        merged: dict[str, _Histogram] = {}
        for source in (self._total_latency, self._interval_latency):
            for origin, hist in source.items():
                merged.setdefault(origin, _Histogram()).merge(hist)
        return merged


def busiest(values: dict[str, int], limit: int) -> set[str] | None:
    """The ``limit`` topics with the largest values (ties by name); None when all fit.

    OTHER_TOPIC is never among them: it is where the others go.
    """
    if len(values) <= limit and OTHER_TOPIC not in values:
        return None
    ranked = sorted((t for t in values if t != OTHER_TOPIC), key=lambda t: (-values[t], t))
    return set(ranked[:limit])


def cap_topics(values: dict[str, int], limit: int) -> dict[str, int]:
    """``values`` with only the ``limit`` largest topics named and the rest summed under OTHER_TOPIC."""
    named = busiest(values, limit)
    if named is None:
        return values
    out = {t: v for t, v in values.items() if t in named}
    rest = sum(v for t, v in values.items() if t not in named)
    if rest or len(values) > len(out):
        out[OTHER_TOPIC] = rest
    return out


def _fold_quiet_topics(counters: dict[CounterKey, list[int]], keep_keys: int) -> dict[CounterKey, list[int]]:
    """Sum the least busy topics' counters under OTHER_TOPIC until at most about ``keep_keys`` keys remain."""
    busy: dict[str, int] = {}
    keys_of: dict[str, int] = {}
    for key, (n, _) in counters.items():
        busy[key[0]] = busy.get(key[0], 0) + n
        keys_of[key[0]] = keys_of.get(key[0], 0) + 1
    kept: set[str] = set()
    room = keep_keys
    for topic in sorted((t for t in busy if t != OTHER_TOPIC), key=lambda t: (-busy[t], t)):
        if keys_of[topic] > room:
            break
        kept.add(topic)
        room -= keys_of[topic]
    folded: dict[CounterKey, list[int]] = {}
    for key, (n, nbytes) in counters.items():
        if key[0] not in kept:
            key = (OTHER_TOPIC, *key[1:])  # type: ignore[assignment]
        cell = folded.setdefault(key, [0, 0])
        cell[0] += n
        cell[1] += nbytes
    return folded


def records(
    node_id: str,
    start: float,
    end: float,
    counters: dict[CounterKey, list[int]],
    latency: dict[str, _Histogram],
    gauges: dict[str, int],
    links: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The schema-v1 records of one interval."""
    base = {"v": SCHEMA_VERSION, "node": node_id, "start": start, "ts": end}
    out: list[dict[str, Any]] = []
    for (topic, frontend, kind, peer, reason), (n, nbytes) in counters.items():
        out.append({**base, "type": "counter", "topic": topic, "frontend": frontend, "kind": kind,
                    "peer": peer, "reason": reason, "count": n, "bytes": nbytes})  # fmt: skip
    for origin, hist in latency.items():
        out.append({**base, "type": "latency", "origin": origin, "bounds_ms": list(LATENCY_BOUNDS_MS),
                    "counts": hist.counts, "count": hist.count, "sum_ms": hist.sum_ms})  # fmt: skip
    for topic, value in gauges.items():
        out.append({**base, "type": "gauge", "name": "subscribers", "topic": topic, "value": float(value)})
    for link in links:
        out.append({**base, "type": "link", "peer": link["peer"], "peer_node": link.get("peer_node"),
                    "role": link["role"], "direction": link["direction"], "state": link["state"]})  # fmt: skip
    return out


class MetricsDumper:
    """Writes one file per interval and format (JSON lines, Parquet) under ``directory``.

    ``dump_format`` is ``[metrics] dump-format``. When it asks for Parquet and
    pyarrow cannot be imported, the dumper writes JSON lines only and
    ``problem`` says why (the node logs it at start). With ``merge_hours``,
    the first dump after a start and the first of each new hour merge the
    Parquet dumps of every other (closed) hour folder of the node into one
    file each (``dumpfile.merge_parquet_dumps``), through ``run_merge``: a
    callable that runs a function off the reactor thread and returns a
    Deferred of its result (None: run it at once, in the caller).
    """

    def __init__(
        self,
        metrics: Metrics,
        directory: str,
        gauges: Callable[[], dict[str, int]],
        links: Callable[[], list[dict[str, Any]]],
        clock: Callable[[], float] = time.time,
        dump_format: str = "jsonl",
        merge_hours: bool = True,
        run_merge: Callable[[Callable[[], list[tuple[str, int]]]], Any] | None = None,
    ) -> None:
        self.metrics = metrics
        self.directory = directory
        self._gauges = gauges
        self._links = links
        self._clock = clock
        self._seq = 0
        self.files_written = 0
        formats = formats_of(dump_format)
        #: Why Parquet was asked for but is not written, or None.
        self.problem = parquet_problem() if "parquet" in formats else None
        #: The formats each dump is written in.
        self.formats = ("jsonl",) if self.problem else formats
        self._merge = merge_hours and "parquet" in self.formats
        self._run_merge = run_merge
        #: The hour folder of the dump that last started a merge; a merge running now.
        self._merged_for: str | None = None
        self._merging = False
        #: Merged files written, as (path, dumps it holds).
        self.merged: list[tuple[str, int]] = []

    def dump(self) -> str | None:
        """Write the interval's records; the last file's path (None when there was nothing)."""
        now = self._clock()
        start, counters, latency = self.metrics.take_interval(now)
        if not counters and not latency:
            return None
        rows = records(self.metrics.node_id, start, now, counters, latency, self._gauges(), self._links())
        stamp = time.gmtime(now)
        folder = os.path.join(
            self.directory,
            f"node={self.metrics.node_id}",
            time.strftime("date=%Y-%m-%d", stamp),
            time.strftime("hour=%H", stamp),
        )
        self._seq += 1
        written = write_dump(folder, f"part-{int(now * 1000)}-{self._seq:06d}", rows, self.formats)
        self.files_written += len(written)
        if self._merge and folder != self._merged_for and not self._merging:
            self._merged_for = folder
            self._start_merge(folder)
        return written[-1]

    def closed_hours(self, current: str) -> list[str]:
        """The node's hour folders other than ``current`` (where dumps are written now), oldest first."""
        node = os.path.join(self.directory, f"node={self.metrics.node_id}")
        return [folder for folder in hour_folders(node) if folder != current]

    def merge_closed_hours(self, current: str) -> list[tuple[str, int]]:
        """Merge the Parquet dumps of each closed hour folder into one file; (merged file, dumps) of each merge."""
        return [merged for folder in self.closed_hours(current) if (merged := merge_parquet_dumps(folder))]

    def _start_merge(self, current: str) -> None:
        if self._run_merge is None:
            self._merged(self.merge_closed_hours(current))
            return
        self._merging = True
        running = self._run_merge(lambda: self.merge_closed_hours(current))
        running.addCallbacks(self._merged, self._merge_failed)
        running.addBoth(self._merge_done)

    def _merged(self, merged: list[tuple[str, int]]) -> None:
        for path, dumps in merged:
            log.info("merged {dumps} metrics dumps into {path}", dumps=dumps, path=path)
        self.merged += merged

    def _merge_failed(self, failure: Any) -> None:
        log.error("cannot merge metrics dumps under {dir}: {error}", dir=self.directory, error=failure.value)

    def _merge_done(self, _result: object) -> None:
        self._merging = False

    def safe_dump(self) -> None:
        """Dump (and merge), logging instead of raising (called from a timer)."""
        try:
            self.dump()
        except (OSError, ValueError, TypeError) as e:  # pyarrow's errors are ValueError/TypeError subclasses
            log.error("cannot write metrics to {dir}: {error}", dir=self.directory, error=e)


class PrometheusCollector:
    """prometheus-client collector over a node's :class:`Metrics`, hub and links."""

    def __init__(
        self,
        metrics: Metrics,
        gauges: Callable[[], dict[str, int]],
        links: Callable[[], list[dict[str, Any]]],
        max_topics: int = DEFAULT_MAX_TOPICS,
    ):
        self._metrics = metrics
        self._gauges = gauges
        self._links = links
        #: Topics with series of their own; the rest are summed under OTHER_TOPIC.
        self.max_topics = max_topics

    def collect(self) -> Iterator[Any]:
        """Yield the metric families."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        self._metrics.settle()
        labels = ["topic", "frontend", "kind", "peer", "reason"]
        messages = CounterMetricFamily("pubsubclub_messages", "Messages by topic, front-end and kind", labels=labels)
        nbytes = CounterMetricFamily("pubsubclub_bytes", "Payload bytes by topic, front-end and kind", labels=labels)
        for (topic, frontend, kind, peer, reason), n, b in self._metrics.capped_totals(self.max_topics):
            values = [topic, frontend, kind, peer or "", reason or ""]
            messages.add_metric(values, n)
            nbytes.add_metric(values, b)
        yield messages
        yield nbytes
        sink_errors = CounterMetricFamily(
            "pubsubclub_sink_errors", "Hub sinks or listeners that raised (logged, skipped)", labels=["sink"]
        )
        for sink, n in sorted(self._metrics.sink_errors.items()):
            sink_errors.add_metric([sink], n)
        yield sink_errors
        errors = CounterMetricFamily(
            "pubsubclub_errors", "Faults handled without closing anything", labels=["component", "reason"]
        )
        for (component, reason), n in sorted(self._metrics.errors.items()):
            errors.add_metric([component, reason], n)
        yield errors
        disconnects = CounterMetricFamily(
            "pubsubclub_disconnects",
            "Connections the node closed to protect itself (slow consumers, queue caps, dead peers)",
            labels=["frontend", "reason"],
        )
        for (frontend, reason), n in sorted(self._metrics.disconnects.items()):
            disconnects.add_metric([frontend, reason], n)
        yield disconnects
        refusals = CounterMetricFamily(
            "pubsubclub_refused_connections",
            "Connections a listener refused at accept (per-address or per-listener cap)",
            labels=["listener", "reason"],
        )
        for (listener, reason), n in sorted(self._metrics.refusals.items()):
            refusals.add_metric([listener, reason], n)
        yield refusals
        events = CounterMetricFamily(
            "pubsubclub_events", "Component events, as in /stats", labels=["component", "event"]
        )
        for (component, name), n in sorted(self._metrics.events.items()):
            events.add_metric([component, name], n)
        yield events
        subscribers = GaugeMetricFamily("pubsubclub_subscribers", "Local subscribers per topic", labels=["topic"])
        for topic, value in cap_topics(self._gauges(), self.max_topics).items():
            subscribers.add_metric([topic], value)
        yield subscribers
        links = GaugeMetricFamily(
            "pubsubclub_link_open", "1 when a PSC link is open", labels=["peer", "role", "direction"]
        )
        for link in self._links():
            links.add_metric([link["peer"], link["role"], link["direction"]], 1.0 if link["state"] == "open" else 0.0)
        yield links
        for kind, (name, text) in LINK_COUNTS.items():
            family = CounterMetricFamily(name, text, labels=["peer"])
            for (peer, counted), n in self._metrics.link_counts.items():
                if counted == kind:
                    family.add_metric([peer], n)
            yield family
        latency = HistogramMetricFamily(
            "pubsubclub_cross_node_latency_seconds", "Origin publish to local delivery", labels=["origin"]
        )
        for origin, hist in self._metrics.total_latency().items():
            cumulative, buckets = 0, []
            for bound, n in zip(LATENCY_BOUNDS_MS, hist.counts, strict=False):
                cumulative += n
                buckets.append((str(bound / 1000.0), cumulative))
            buckets.append(("+Inf", hist.count))
            latency.add_metric([origin], buckets, hist.sum_ms / 1000.0)
        yield latency
