"""python-consul's API on Twisted: :class:`TwistedConsul` on :class:`TreqHTTPClient`.

python-consul 1.1.0 ships ``consul.twisted``, which cannot be used: a refused
connection raises ``AttributeError`` (it reads ``e.message``), GET query
parameters are sent twice (in the URL and again as treq ``params``), it calls the
deprecated ``returnValue``, has no time limit per request and always uses the
global reactor. This adapter is our own Twisted HTTP client for it, with the
errors discovery tells apart (:data:`TRANSPORT_ERRORS`: no answer from the agent;
:class:`ConsulBadResponse`: an answer it cannot use) and Go durations as Consul
parses them. :class:`~pubsubclub.discovery.consul.ConsulDiscovery` is its user.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import consul.base
from consul.base import CB, ConsulException
from treq.client import HTTPClient as TreqClient
from twisted.internet import defer, error
from twisted.internet.interfaces import IConsumer
from twisted.python.failure import Failure
from twisted.web import _newclient
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import UNKNOWN_LENGTH, IAgent, IBodyProducer
from zope.interface import implementer

#: Time limit of a request that is not a blocking query, in seconds.
DEFAULT_TIMEOUT = 10.0
#: Consul's own default and maximum ``wait`` of a blocking query (seconds).
CONSUL_DEFAULT_WAIT = 300.0
CONSUL_MAX_WAIT = 600.0

_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string (``10s``, ``1m30s``, ``250ms``), as Consul parses ``wait``."""
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            raise ValueError(f"not a duration: {text!r}")
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if not text:
        raise ValueError("empty duration")
    return total


def format_duration(seconds: float) -> str:
    """A Go duration string Consul accepts: whole seconds, else milliseconds."""
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{max(1, round(seconds * 1000))}ms"


# -- errors ------------------------------------------------------------------


class ConsulUnreachable(ConsulException):
    """The agent could not be reached, or the connection broke before an answer."""


class ConsulTimeout(consul.base.Timeout):
    """No complete answer within the request's time limit."""


class ConsulBadResponse(ConsulException):
    """The agent answered, but not with what its API documents (junk body, missing header)."""


#: Failures that mean "no answer from the agent"; everything else the agent said itself.
TRANSPORT_ERRORS = (ConsulUnreachable, ConsulTimeout)

_CONNECTION_FAILURES = (
    error.ConnectError,
    error.ConnectionLost,
    error.ConnectionDone,
    error.DNSLookupError,
    _newclient.ResponseNeverReceived,
    _newclient.RequestTransmissionFailed,
    _newclient.ResponseFailed,
)


# -- the HTTP client ---------------------------------------------------------


@implementer(IBodyProducer)
class _BytesProducer:
    """A request body written at once (treq's default body producer runs on the global reactor)."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.length = len(body) if body else UNKNOWN_LENGTH

    def startProducing(self, consumer: IConsumer) -> defer.Deferred[None]:
        """Write the whole body."""
        consumer.write(self._body)
        return defer.succeed(None)

    def pauseProducing(self) -> None:
        """Nothing to pause: everything is written at once."""

    def resumeProducing(self) -> None:
        """Nothing to resume."""

    def stopProducing(self) -> None:
        """Nothing to stop."""


def _query_value(params: Any, name: str) -> Any:
    """The value of query parameter ``name`` in python-consul's params (a list of pairs or a dict)."""
    if not params:
        return None
    pairs = params.items() if isinstance(params, Mapping) else params
    for key, value in pairs:
        if key == name:
            return value
    return None


class TreqHTTPClient(consul.base.HTTPClient):  # type: ignore[misc]
    """python-consul's HTTP client contract on treq.

    ``get``/``put``/``post``/``delete`` return a Deferred that fires with
    ``callback(Response)`` (python-consul's parser for the endpoint) or fails
    with a :class:`ConsulException`: :class:`ConsulUnreachable`,
    :class:`ConsulTimeout`, :class:`ConsulBadResponse`, or python-consul's own
    errors for 4xx/5xx answers. Query parameters are put in the URL once.
    Every request has a time limit; a blocking query's limit is its ``wait``
    plus Consul's jitter (wait/16) plus ``timeout``.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8500,
        scheme: str = "http",
        verify: bool = True,
        cert: Any = None,
        *,
        reactor: Any = None,
        timeout: float = DEFAULT_TIMEOUT,
        agent: IAgent | None = None,
    ) -> None:
        super().__init__(host, port, scheme, verify, cert)
        if not verify or cert is not None:
            raise ValueError("TreqHTTPClient verifies TLS with the system CAs; verify=False and cert are not supported")
        if reactor is None:
            from twisted.internet import reactor
        self._reactor = reactor
        self.timeout = timeout
        self._pool: HTTPConnectionPool | None = None
        if agent is None:
            # The watch holds one connection for its blocking query while
            # heartbeats use another.
            self._pool = HTTPConnectionPool(reactor, persistent=True)
            self._pool.maxPersistentPerHost = 4
            agent = Agent(reactor, pool=self._pool)
        self._client = TreqClient(agent, data_to_body_producer=_BytesProducer)

    def get(self, callback: Callable[[Any], Any], path: str, params: Any = None) -> defer.Deferred[Any]:
        """GET ``path``; fires with ``callback(response)``."""
        return self._request(callback, "GET", path, params)

    def put(self, callback: Callable[[Any], Any], path: str, params: Any = None, data: Any = "") -> defer.Deferred[Any]:
        """PUT ``data`` to ``path``; fires with ``callback(response)``."""
        return self._request(callback, "PUT", path, params, data)

    def post(
        self, callback: Callable[[Any], Any], path: str, params: Any = None, data: Any = ""
    ) -> defer.Deferred[Any]:
        """POST ``data`` to ``path``; fires with ``callback(response)``."""
        return self._request(callback, "POST", path, params, data)

    def delete(self, callback: Callable[[Any], Any], path: str, params: Any = None) -> defer.Deferred[Any]:
        """DELETE ``path``; fires with ``callback(response)``."""
        return self._request(callback, "DELETE", path, params)

    def request_timeout(self, params: Any) -> float:
        """Time limit of one request: a blocking query may rightly hang for its whole wait."""
        index = _query_value(params, "index")
        if not index:
            return self.timeout
        wait = _query_value(params, "wait")
        try:
            seconds = parse_duration(str(wait)) if wait else CONSUL_DEFAULT_WAIT
        except ValueError:
            seconds = CONSUL_DEFAULT_WAIT
        seconds = min(seconds, CONSUL_MAX_WAIT)
        return seconds + seconds / 16 + self.timeout

    def close(self) -> defer.Deferred[None]:
        """Close idle pooled connections (in-flight requests are cancelled by their callers)."""
        if self._pool is None:
            return defer.succeed(None)
        return self._pool.closeCachedConnections()  # type: ignore[no-any-return]

    def _request(
        self, callback: Callable[[Any], Any], method: str, path: str, params: Any, data: Any = None
    ) -> defer.Deferred[Any]:
        url = self.uri(path, params)
        timeout = self.request_timeout(params)
        body = data.encode("utf-8") if isinstance(data, str) else data
        d = defer.ensureDeferred(self._exchange(method, url, body or None))
        expired: list[bool] = []

        def expire() -> None:
            expired.append(True)
            d.cancel()

        timer = self._reactor.callLater(timeout, expire)

        def settled(result: Any) -> Any:
            if timer.active():
                timer.cancel()
            return result

        d.addBoth(settled)
        d.addErrback(self._translate, method, url, timeout, expired)
        d.addCallback(self._parse, callback, method, url)
        return d

    async def _exchange(self, method: str, url: str, body: bytes | None) -> consul.base.Response:
        response = await self._client.request(method, url, data=body)
        content = await response.content()
        headers = {
            name.decode("latin-1"): ",".join(v.decode("latin-1") for v in values)
            for name, values in response.headers.getAllRawHeaders()
        }
        return consul.base.Response(response.code, headers, content.decode("utf-8", errors="replace"))

    @staticmethod
    def _translate(failure: Failure, method: str, url: str, timeout: float, expired: list[bool]) -> Failure:
        if expired:
            raise ConsulTimeout(f"{method} {url}: no answer within {timeout:g}s")
        if _cancelled(failure):
            # The caller cancelled (a stopping watch): let it see a cancellation.
            raise defer.CancelledError(f"{method} {url} cancelled")
        if failure.check(*_CONNECTION_FAILURES):
            raise ConsulUnreachable(f"{method} {url}: {_describe(failure.value)}")
        return failure

    @staticmethod
    def _parse(response: consul.base.Response, callback: Callable[[Any], Any], method: str, url: str) -> Any:
        try:
            return callback(response)
        except ConsulException:
            raise
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            # python-consul's parsers fail like this on a junk body or a missing header.
            raise ConsulBadResponse(f"{method} {url}: {response.code} with an unusable answer ({e!r})") from e


def _cancelled(failure: Failure) -> bool:
    """A cancellation, possibly wrapped by twisted.web's client in ResponseNeverReceived & co.

    A request cancelled while its TCP connection is still being made (the agent
    frozen or gone) fails with ``ConnectingCancelledError``, not ``CancelledError``.
    """
    if failure.check(defer.CancelledError, error.ConnectingCancelledError):
        return True
    reasons = getattr(failure.value, "reasons", None) or []
    return any(isinstance(r, Failure) and _cancelled(r) for r in reasons)


def _describe(exc: BaseException | None) -> str:
    reasons = getattr(exc, "reasons", None)
    if reasons:
        return "; ".join(_describe(r.value) for r in reasons if r.value is not None)
    return f"{type(exc).__name__}: {exc}"


class TwistedConsul(consul.base.Consul):  # type: ignore[misc]
    """python-consul's ``Consul`` API on :class:`TreqHTTPClient`: every call returns a Deferred.

    ``reactor`` (for connections and time limits), ``timeout`` and ``agent``
    (any ``IAgent``, e.g. treq's in-memory ``RequestTraversalAgent`` in tests)
    are passed to the HTTP client.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8500,
        *,
        reactor: Any = None,
        timeout: float = DEFAULT_TIMEOUT,
        agent: IAgent | None = None,
        **kwargs: Any,
    ) -> None:
        self._reactor = reactor
        self._timeout = timeout
        self._agent = agent
        super().__init__(host, port, **kwargs)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> TwistedConsul:
        """A client for the agent at ``url`` (``http://host:port``)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        client = cls(parts.hostname, port, scheme=parts.scheme, **kwargs)
        # python-consul lets CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN override its
        # arguments; an explicit URL (a --consul flag) wins here.
        client.http = client.connect(parts.hostname, port, parts.scheme)
        if kwargs.get("token"):
            client.token = kwargs["token"]
        return client

    def connect(self, host: str, port: int, scheme: str, verify: bool = True, cert: Any = None) -> TreqHTTPClient:
        """The HTTP client python-consul's endpoint classes call."""
        return TreqHTTPClient(
            host, port, scheme, verify, cert, reactor=self._reactor, timeout=self._timeout, agent=self._agent
        )

    def register_service(self, definition: Mapping[str, Any], token: str | None = None) -> defer.Deferred[bool]:
        """``PUT /v1/agent/service/register`` with a full service definition.

        python-consul 1.1.0's ``agent.service.register`` cannot send ``Meta``,
        so the definition (Consul's JSON field names) is sent as given.
        """
        params = [("token", token or self.token)] if (token or self.token) else []
        d: defer.Deferred[bool] = self.http.put(
            CB.bool(), "/v1/agent/service/register", params=params, data=json.dumps(dict(definition))
        )
        return d

    def close(self) -> defer.Deferred[None]:
        """Close idle connections."""
        d: defer.Deferred[None] = self.http.close()
        return d
