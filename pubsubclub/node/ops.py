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
        return json.dumps(body).encode()
