"""The operations listener's resources: ``/health`` and ``/stats`` (``/metrics`` is prometheus-client's)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.web.resource import Resource
from twisted.web.server import Request

from pubsubclub.core.counters import Kind, Source

if TYPE_CHECKING:
    from pubsubclub.core.metrics import Metrics
    from pubsubclub.node.node import Node


def traffic(metrics: Metrics) -> dict[str, Any]:
    """Messages dropped (by reason) and, per peer node, forwarded/received/dropped and the replay counts.

    For ``/stats`` (``pubsubclub status``): one pass over the cumulative
    counters, whose keys are capped (``metrics.max_keys``), so a request costs
    at most that many steps; the hot path is untouched.
    """
    dropped: dict[str, int] = {}
    peers: dict[str, dict[str, int]] = {}
    for (_topic, source, kind, peer, reason), n, _nbytes in metrics.totals():
        if kind == Kind.DROPPED:
            dropped[reason or "unknown"] = dropped.get(reason or "unknown", 0) + n
        if source == Source.PSC and peer is not None:
            row = peers.setdefault(peer, {})
            row[kind] = row.get(kind, 0) + n
    for (peer, counted), n in metrics.link_counts.items():
        row = peers.setdefault(peer, {})
        row[counted.value] = row.get(counted.value, 0) + n
    return {"dropped": dropped, "peers": peers}


class StatsResource(Resource):
    """``GET /stats``: counters and links as JSON, for operators and tests (on ``--http`` only)."""

    isLeaf = True

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        super().__init__()
        self._stats = stats

    def render_GET(self, request: Request) -> bytes:  # noqa: N802 - Twisted Web API
        """The node's counters and links."""
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(self._stats()).encode()


class HealthResource(Resource):
    """``GET /health``: 200 once every listener is up, 503 while starting or stopping.

    The body lists the node's links and their states, for Consul's HTTP
    check, load balancers and operators.
    """

    isLeaf = True

    def __init__(self, node: Node) -> None:
        super().__init__()
        self._node = node

    def render_GET(self, request: Request) -> bytes:  # noqa: N802 - Twisted Web API
        """Readiness and links as JSON."""
        node = self._node
        wamp, bridge = node.frontend("wamp"), node.frontend("bridge")
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        if node.state != "ready":
            request.setResponseCode(503)
        body = {
            "status": node.state,
            "node": node.hub.node_id,
            "links": node.federation.links(),
            "open_links": node.federation.open_links(),
            "wamp_sessions": 0 if wamp is None else len(wamp.router.sessions),
        }
        if bridge is not None:
            body["router_joined"] = bridge.session is not None
        place = node.place
        if place is not None and place.count > 1 and place.primary:
            # The workers linked both ways to the primary (itself included): the node's serving width.
            federation = node.federation
            both = [link["peer_node"] for link in federation.links() if link["state"] == "open"]
            linked = {peer for peer in both if federation.is_worker_name(peer) and both.count(peer) == 2}
            body["workers"] = {"count": place.count, "linked": 1 + len(linked)}
        return json.dumps(body).encode()


#: Longest the primary waits for a worker's /stats, in seconds (a worker that does not answer is listed as such).
WORKER_STATS_TIMEOUT = 2.0

#: /stats sections summed over a node's workers (numbers added, nested objects alike); the rest are the primary's.
SUMMED_SECTIONS = ("hub", "errors", "sink_errors", "federation", "wamp", "tep", "edge", "logins")


def summed(total: Any, more: Any) -> Any:
    """``total`` with the numbers of ``more`` added where both have them (objects recursively); else ``total``."""
    if isinstance(total, dict) and isinstance(more, dict):
        merged = dict(total)
        for key, value in more.items():
            merged[key] = summed(merged[key], value) if key in merged else value
        return merged
    if isinstance(total, (int, float)) and isinstance(more, (int, float)) and not isinstance(total, bool):
        return total + more
    return total


class WorkersStatsResource(Resource):
    """The primary worker's ``GET /stats``: the node as a whole, its counters summed over every worker.

    Each worker's own counters are kept under ``workers`` (index, pid, WAMP
    sessions, hub counters); the links, interest and discovery are the
    primary's (it holds them). Every other worker is asked over its Unix ops
    socket, at most :data:`WORKER_STATS_TIMEOUT` seconds.
    """

    isLeaf = True

    def __init__(self, stats: Callable[[], dict[str, Any]], sockets: list[str], reactor: Any) -> None:
        super().__init__()
        self._stats = stats
        self._sockets = sockets
        self._reactor = reactor

    def render_GET(self, request: Request) -> Any:  # noqa: N802 - Twisted Web API
        """Ask the workers, then answer (NOT_DONE_YET meanwhile)."""
        from twisted.internet import defer
        from twisted.web.server import NOT_DONE_YET

        asks = [self._ask(path) for path in self._sockets]
        defer.gatherResults(asks).addCallback(self._answer, request)
        return NOT_DONE_YET

    def _ask(self, path: str) -> Any:
        from twisted.web.client import Agent, readBody

        reactor = self._reactor
        agent = Agent.usingEndpointFactory(reactor, _UnixEndpoints(reactor, path))
        d = agent.request(b"GET", b"http://worker/stats").addCallback(readBody).addCallback(json.loads)
        d.addTimeout(WORKER_STATS_TIMEOUT, reactor)
        return d.addErrback(lambda failure: {"unreachable": failure.getErrorMessage() or "no answer"})

    def _answer(self, answers: list[dict[str, Any]], request: Request) -> None:
        own = self._stats()
        body = dict(own)
        rows = [_worker_row(own)]
        for index, answer in enumerate(answers, start=1):
            if "unreachable" in answer:
                rows.append({"index": index, "state": "unreachable", "why": answer["unreachable"]})
                continue
            rows.append(_worker_row(answer))
            for section in SUMMED_SECTIONS:
                if section in body and section in answer:
                    body[section] = summed(body[section], answer[section])
        logins = body.get("logins")
        if isinstance(logins, dict) and isinstance(own.get("logins"), dict):
            # The processes share one table (federation/logins.py): each holds every source, so not summed.
            body["logins"] = {**logins, "sources": own["logins"].get("sources"), "shared": own["logins"].get("shared")}
        body["gc"] = _node_gc([row["gc"] for row in rows if isinstance(row.get("gc"), dict)], own.get("gc"))
        body["workers"] = rows
        if not request.finished and not getattr(request, "_disconnected", False):
            request.setHeader(b"content-type", b"application/json")
            request.write(json.dumps(body).encode())
            request.finish()


#: The collector's counts a node's ``gc`` adds over its workers; its longest full collections are their maximum.
GC_SUMMED = ("frozen", "full_collections", "freezes", "thaws")
GC_LONGEST = ("max_full_ms", "startup_full_ms")


def _node_gc(each: list[dict[str, Any]], own: Any) -> Any:
    """The node's ``gc``: the workers' counts added, the longest full collection of any (the rest the primary's)."""
    if not each or not isinstance(own, dict):
        return own
    node = dict(own)
    for key in GC_SUMMED:
        values = [gc[key] for gc in each if isinstance(gc.get(key), (int, float))]
        if values:
            node[key] = sum(values)
    for key in GC_LONGEST:
        values = [gc[key] for gc in each if isinstance(gc.get(key), (int, float))]
        if values:
            node[key] = max(values)
    return node


def _worker_row(stats: dict[str, Any]) -> dict[str, Any]:
    """One worker's line in the node's /stats."""
    worker = stats.get("worker") or {}
    wamp = stats.get("wamp") or {}
    return {
        "index": worker.get("index"),
        "pid": worker.get("pid"),
        "node": stats.get("node"),
        "state": "up",
        "wamp_sessions": wamp.get("sessions") if isinstance(wamp, dict) else None,
        "edge_caps": worker.get("edge_caps"),
        "logins": stats.get("logins"),
        "gc": stats.get("gc"),
        "hub": stats.get("hub"),
        "remote_interest": stats.get("remote_interest"),
        "remote_patterns": stats.get("remote_patterns"),
    }


class _UnixEndpoints:
    """An Agent endpoint factory that reaches every URL over one Unix socket."""

    def __init__(self, reactor: Any, path: str) -> None:
        self._reactor = reactor
        self._path = path

    def endpointForURI(self, uri: Any) -> Any:  # noqa: N802 - Twisted API
        """The Unix socket, whatever the URL."""
        from twisted.internet.endpoints import UNIXClientEndpoint

        return UNIXClientEndpoint(self._reactor, self._path, timeout=WORKER_STATS_TIMEOUT)


def merged_metrics(texts: list[tuple[str, str]]) -> bytes:
    """Prometheus texts of several workers as one, each sample labelled ``worker="<index>"``."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Any] = {}
    for worker, text in texts:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = family
                samples = []
            else:
                samples = merged.samples
            samples.extend(s._replace(labels={**s.labels, "worker": worker}) for s in family.samples)
            merged.samples = samples

    class _Merged:
        def collect(self) -> Any:
            return iter(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())
    return bytes(generate_latest(registry))


class WorkersMetricsResource(Resource):
    """The primary worker's ``GET /metrics``: every worker's series, labelled ``worker`` (Prometheus text).

    Sum ``by`` everything but ``worker`` for the node as a whole. A worker
    that does not answer within :data:`WORKER_STATS_TIMEOUT` is left out.
    """

    isLeaf = True

    def __init__(self, own: Callable[[], bytes], sockets: list[str], reactor: Any) -> None:
        super().__init__()
        self._own = own
        self._sockets = sockets
        self._reactor = reactor

    def render_GET(self, request: Request) -> Any:  # noqa: N802 - Twisted Web API
        """Ask the workers, then answer (NOT_DONE_YET meanwhile)."""
        from twisted.internet import defer
        from twisted.web.server import NOT_DONE_YET

        asks = [self._ask(path) for path in self._sockets]
        defer.gatherResults(asks).addCallback(self._answer, request)
        return NOT_DONE_YET

    def _ask(self, path: str) -> Any:
        from twisted.web.client import Agent, readBody

        reactor = self._reactor
        agent = Agent.usingEndpointFactory(reactor, _UnixEndpoints(reactor, path))
        d = agent.request(b"GET", b"http://worker/metrics").addCallback(readBody)
        d.addTimeout(WORKER_STATS_TIMEOUT, reactor)
        return d.addErrback(lambda _failure: None)

    def _answer(self, answers: list[bytes | None], request: Request) -> None:
        texts = [("0", self._own().decode())]
        texts += [(str(i), text.decode()) for i, text in enumerate(answers, start=1) if text is not None]
        body = merged_metrics(texts)
        if not request.finished and not getattr(request, "_disconnected", False):
            request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
            request.write(body)
            request.finish()


class MetricsTextResource(Resource):
    """``GET /metrics`` of a worker's Unix ops socket (prometheus-client's WSGI resource wants a TCP peer)."""

    isLeaf = True

    def __init__(self, text: Callable[[], bytes]) -> None:
        super().__init__()
        self._text = text

    def render_GET(self, request: Request) -> bytes:  # noqa: N802 - Twisted Web API
        """This worker's series."""
        request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
        return self._text()
