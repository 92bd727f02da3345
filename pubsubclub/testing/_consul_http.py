"""The Consul double's HTTP face: routing ``/v1/...`` requests, writing Consul's answers, a droppable Site.

:class:`~pubsubclub.testing._consul.ConsulDouble` holds the state and answers the
calls; this module turns HTTP requests into those calls (and their errors into
Consul's plain-text answers) and writes the ``X-Consul-*`` headers.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from pubsubclub.testing._consul_records import PASSING, RecordedRequest, _HTTPError, _query_bool

if TYPE_CHECKING:
    from pubsubclub.testing._consul import ConsulDouble

log = Logger()


def _write(
    request: Request, code: int, body: Any, index: int | None, content_type: bytes = b"text/plain; charset=utf-8"
) -> None:
    if request.finished or request._disconnected:
        return
    request.setResponseCode(code)
    if index is not None:
        request.setHeader(b"X-Consul-Index", str(max(1, index)).encode())
        request.setHeader(b"X-Consul-Knownleader", b"true")
        request.setHeader(b"X-Consul-Lastcontact", b"0")
    if isinstance(body, bytes):
        if body:
            request.setHeader(b"content-type", content_type)
            request.write(body)
    elif body is not None:
        request.setHeader(b"content-type", b"application/json")
        request.write(json.dumps(body).encode())
    request.finish()


class _TrackingSite(Site):
    """A Site that knows its open connections, so a stop can drop them as an agent's exit does."""

    noisy = False

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource)
        self.protocols: set[Any] = set()

    def log(self, request: Any) -> None:
        """No access log: a test run would drown in it."""

    def buildProtocol(self, addr: Any) -> Any:
        proto = super().buildProtocol(addr)
        protocols = self.protocols
        protocols.add(proto)
        lost = proto.connectionLost

        def connection_lost(reason: Any) -> None:
            protocols.discard(proto)
            lost(reason)

        proto.connectionLost = connection_lost
        return proto


class _ConsulResource(Resource):
    """Routes requests to the double; every error is Consul's plain-text answer."""

    isLeaf = True

    def __init__(self, double: ConsulDouble) -> None:
        super().__init__()
        self._double = double

    def render(self, request: Request) -> Any:
        """Record, maybe fail on purpose, then route."""
        double = self._double
        method = request.method.decode()
        raw_path = urlsplit(request.uri.decode("latin-1")).path
        path = unquote(raw_path)
        query = tuple(parse_qsl(urlsplit(request.uri.decode("latin-1")).query, keep_blank_values=True))
        body = request.content.read() if request.content is not None else b""
        double.requests.append(RecordedRequest(method, path, query, body, double.reactor.seconds()))
        params: dict[str, list[str]] = {}
        for k, v in query:
            params.setdefault(k, []).append(v)
        if path.startswith("/v1/"):
            mode = double._take_failure()
            if mode == "500":
                _write(request, 500, b"rpc error making call: No cluster leader", None)
                return NOT_DONE_YET
            if mode == "junk":
                _write(request, 200, b"<html>502 Bad Gateway</html>\x00\xff", double.index)
                return NOT_DONE_YET
            if mode == "drop":
                request.transport.abortConnection()  # type: ignore[union-attr]
                return NOT_DONE_YET
            if mode == "hang":
                return NOT_DONE_YET
        try:
            if "dc" in params and params["dc"][-1] != double.datacenter:
                raise _HTTPError(500, "No path to datacenter")
            return self._route(request, method, path, params, body)
        except _HTTPError as e:
            _write(request, e.code, e.message.encode(), None)
            return NOT_DONE_YET

    def _route(self, request: Request, method: str, path: str, params: dict[str, list[str]], body: bytes) -> Any:
        d = self._double

        def want(*methods: str) -> None:
            if method not in methods:
                raise _HTTPError(405, f"method {method} not allowed")

        if path == "/v1/agent/service/register":
            want("PUT")
            try:
                definition = json.loads(body or b"null")
            except ValueError:
                raise _HTTPError(400, "Request decode failed: invalid JSON") from None
            d.register(definition)
            _write(request, 200, b"", None)
        elif path.startswith("/v1/agent/service/deregister/"):
            want("PUT")
            d.deregister(path.removeprefix("/v1/agent/service/deregister/"))
            _write(request, 200, b"", None)
        elif path.startswith("/v1/agent/check/pass/"):
            want("PUT")
            d.update_ttl(path.removeprefix("/v1/agent/check/pass/"), PASSING, params.get("note", [""])[-1])
            _write(request, 200, b"", None)
        elif path == "/v1/agent/services":
            want("GET")
            _write(request, 200, {s.id: s.view() for s in d.services.values()}, None)
        elif path == "/v1/agent/checks":
            want("GET")
            _write(request, 200, {c.id: c.view(d.node) for c in d.checks.values()}, None)
        elif path.startswith("/v1/health/service/"):
            want("GET")
            name = path.removeprefix("/v1/health/service/")
            passing = _query_bool(params, "passing")
            return d.blocking(
                request,
                params,
                lambda: d._service_query_index(name),
                lambda: (200, d.health_service(name, passing)),
            )
        else:
            raise _HTTPError(404, "404 page not found")
        return NOT_DONE_YET
