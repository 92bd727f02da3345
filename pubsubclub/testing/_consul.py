"""A Consul agent's HTTP API, as far as pubsubclub's Consul discovery uses it.

:class:`ConsulDouble` stands in for a Consul agent (no Consul binary can be
installed where these tests run). It serves real HTTP with ``twisted.web`` so
the real client code runs against it, in-process (``await double.listen()``)
or as a process (:mod:`pubsubclub.testing.consul_agent`).
:class:`MemoryConsul` serves the same double in memory on a fake clock.

It serves what :mod:`pubsubclub.discovery.consul` calls, following Consul's
documentation:

- Blocking queries, https://developer.hashicorp.com/consul/api-docs/features/blocking:
  ``X-Consul-Index`` on every answer of a blocking endpoint (never 0: an
  empty result reports 1); ``index`` and ``wait`` query parameters (``wait``
  is a Go duration such as ``2s`` or ``1m30s``, default 5m, at most 10m, plus
  up to wait/16 of random jitter); the answer comes early as soon as the
  query's own index moves past ``index``, and with the same index back when
  the wait runs out. Indexes never go backwards while the agent lives; a
  restart without state (``restart(keep_state=False)``) starts them again,
  which is what clients must detect ("reset the index if it goes backwards").
- Agent services, https://developer.hashicorp.com/consul/api-docs/agent/service:
  ``PUT /v1/agent/service/register`` (JSON body, field names matched without
  regard to case as Consul's decoder does; ``Check`` or ``Checks`` with
  ``TTL``, or ``HTTP`` + ``Interval`` [+ ``Timeout``, ``Method``, ``Header``];
  check ids ``service:<id>`` or ``service:<id>:<n>``; initial status
  ``critical`` unless ``Status`` says otherwise; re-registering an unchanged
  service changes nothing and keeps its checks' status),
  ``PUT /v1/agent/service/deregister/:id``, ``GET /v1/agent/services``.
- Agent checks, https://developer.hashicorp.com/consul/api-docs/agent/check:
  ``PUT /v1/agent/check/pass/:id`` (``note`` sets the output; a TTL check goes
  ``critical`` with output "TTL expired" when not refreshed in time; an
  unknown or non-TTL check answers 500 ``CheckID "x" does not have associated
  TTL``), and ``GET /v1/agent/checks``, which discovery does not call but
  tests read to see what it registered. HTTP checks are polled every
  ``Interval`` (first poll after a random stagger within one interval): 2xx is
  passing, 429 warning, anything else or no answer within ``Timeout``
  (default 10s) critical. ``DeregisterCriticalServiceAfter`` removes a
  service whose check stayed critical that long.
- Health, https://developer.hashicorp.com/consul/api-docs/health:
  ``GET /v1/health/service/:name`` (``passing``, ``dc``), each entry
  ``{"Node", "Service", "Checks"}`` with the node's ``serfHealth`` check.

Nothing else: no KV store, catalog, ACLs (tokens are accepted and ignored),
sessions, other check types, ``warn``/``fail`` over HTTP (tests call
:meth:`ConsulDouble.update_ttl`), agent maintenance mode, ``tag`` filters or
the ``hash`` blocking mode; unknown paths answer 404. A ``dc`` other than the
double's (``dc1``) answers 500 "No path to datacenter".

For error tests, ``fail(mode, count=, seconds=)`` makes ``/v1/`` requests fail:
``500`` (an error status with Consul's text), ``junk`` (200 with a body that
is not JSON), ``drop`` (the connection closed without an answer) or ``hang``
(no answer at all). ``state_file`` keeps the state across restarts, like an
agent with a data directory; ``restart()`` does the same in-process.

One double, one state: :class:`ConsulDouble` (here) holds it and answers the
calls; :mod:`~pubsubclub.testing._consul_records` has its records (services,
checks, waiters, failures) and :mod:`~pubsubclub.testing._consul_http` its HTTP
face (routing, answers, the Site).
"""

from __future__ import annotations

import json
import os
import random
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from pubsubclub.discovery.client import CONSUL_DEFAULT_WAIT, CONSUL_MAX_WAIT, parse_duration
from pubsubclub.testing._consul_http import _ConsulResource, _TrackingSite, _write
from pubsubclub.testing._consul_records import (
    _STATUSES,
    CRITICAL,
    FAIL_MODES,
    HTTP_CHECK_TIMEOUT,
    PASSING,
    WARNING,
    RecordedRequest,
    _Check,
    _duration,
    _Failure,
    _field,
    _HTTPError,
    _Service,
    _Waiter,
)

log = Logger()


class ConsulDouble:
    """A Consul agent's HTTP API, as far as pubsubclub uses it, served over real HTTP."""

    def __init__(
        self,
        *,
        reactor: Any = None,
        node: str = "consul-double",
        address: str = "127.0.0.1",
        datacenter: str = "dc1",
        rand: Callable[[], float] = random.random,
        http_get: Callable[[str, str, dict[str, list[str]], float], defer.Deferred[int]] | None = None,
        state_file: str | None = None,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor
        self.reactor = reactor
        self.node = node
        self.address = address
        self.datacenter = datacenter
        self.rand = rand
        self._http_get = http_get
        self.state_file = state_file
        #: Every request received, oldest first (bounded).
        self.requests: deque[RecordedRequest] = deque(maxlen=2000)
        self._failure: _Failure | None = None
        self._waiters: list[_Waiter] = []
        self._port: IListeningPort | None = None
        self._site: _TrackingSite | None = None
        self._reset_state()
        if state_file is not None and os.path.exists(state_file):
            self._load(state_file)

    # -- state -------------------------------------------------------------

    def _reset_state(self) -> None:
        for check in getattr(self, "checks", {}).values():
            self._cancel_timers(check)
        #: The raft-like index: bumped by every write that changes something. It starts
        #: at 1, the index an empty result reports, so the first write moves past it.
        self.index = 1
        self.services: dict[str, _Service] = {}
        self.checks: dict[str, _Check] = {}
        self._services_table_index = 0
        #: Service name -> index of the last change to its instances or their checks.
        self._service_name_index: dict[str, int] = {}

    def _bump(self) -> int:
        self.index += 1
        return self.index

    def _changed(self) -> None:
        """Wake blocking queries whose index moved; persist."""
        for waiter in list(self._waiters):
            if waiter.query_index() > waiter.min_index:
                self._answer_waiter(waiter)
        if self.state_file is not None:
            self._save(self.state_file)

    def _touch_service_name(self, name: str, index: int) -> None:
        self._service_name_index[name] = index

    def _service_query_index(self, name: str) -> int:
        return max(1, self._service_name_index.get(name, self._services_table_index))

    # -- the agent's operations (also usable directly by tests) ------------

    def register(self, body: dict[str, Any]) -> None:
        """``PUT /v1/agent/service/register``."""
        if not isinstance(body, dict):
            raise _HTTPError(400, "Request decode failed: not a JSON object")
        name = _field(body, "Name")
        if not isinstance(name, str) or not name:
            raise _HTTPError(400, "Missing service name")
        sid = _field(body, "ID") or name
        port = _field(body, "Port") or 0
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise _HTTPError(400, "Request decode failed: invalid Port")
        tags = _field(body, "Tags") or []
        meta = _field(body, "Meta") or {}
        if not isinstance(tags, list) or not isinstance(meta, dict):
            raise _HTTPError(400, "Request decode failed: invalid Tags or Meta")
        definitions = []
        single = _field(body, "Check")
        if single:
            definitions.append(single)
        many = _field(body, "Checks") or []
        if not isinstance(many, list):
            raise _HTTPError(400, "Request decode failed: invalid Checks")
        definitions.extend(many)
        new_checks = [self._check_from(d, sid, name, i, len(definitions)) for i, d in enumerate(definitions)]

        index = self.index + 1  # the index this write gets, if it changes anything
        service = _Service(
            str(sid), name, str(_field(body, "Address") or ""), port, [str(t) for t in tags], dict(meta), index, index
        )
        old = self.services.get(service.id)
        changed = old is None or not old.same(service)
        if old is not None:
            service.create_index = old.create_index
            if not changed:
                service.modify_index = old.modify_index
        old_checks = {c.id: c for c in self.checks.values() if c.service_id == service.id}
        for check in new_checks:
            previous = old_checks.pop(check.id, None)
            if previous is not None and previous.kind() == check.kind():
                check.status, check.output = previous.status, previous.output
                check.create_index, check.modify_index = previous.create_index, previous.modify_index
                # Keep the running TTL/HTTP timers of the unchanged check.
                check.timer, check.reaper = previous.timer, previous.reaper
                previous.timer = previous.reaper = None
            else:
                if previous is not None:
                    self._cancel_timers(previous)
                changed = True
                check.create_index = check.modify_index = index
        for gone in old_checks.values():
            self._cancel_timers(gone)
            del self.checks[gone.id]
            changed = True
        if old is not None and old.name != service.name:
            self._touch_service_name(old.name, index)
        self.services[service.id] = service
        for check in new_checks:
            self.checks[check.id] = check
            if check.timer is None:
                self._arm(check)
        if changed:
            self._bump()
            self._services_table_index = index
            self._touch_service_name(name, index)
            self._changed()

    def _check_from(self, d: Any, sid: str, name: str, i: int, total: int) -> _Check:
        if not isinstance(d, dict):
            raise _HTTPError(400, "Request decode failed: invalid check")
        check_id = _field(d, "CheckID", "ID") or (f"service:{sid}" if total == 1 else f"service:{sid}:{i + 1}")
        ttl = _duration(_field(d, "TTL"), "TTL")
        http = _field(d, "HTTP")
        interval = _duration(_field(d, "Interval"), "Interval")
        if ttl is None and not http:
            raise _HTTPError(400, "Invalid check: the double supports TTL and HTTP checks only")
        if ttl is not None and ttl <= 0:
            raise _HTTPError(400, "Invalid check: TTL must be > 0 for TTL checks")
        if http and (interval is None or interval <= 0):
            raise _HTTPError(400, "Invalid check: Interval must be > 0 for Script, HTTP, H2PING, or TCP checks")
        status = _field(d, "Status") or CRITICAL
        if status not in _STATUSES:
            raise _HTTPError(400, f"Invalid check status: {status!r}")
        timeout = _duration(_field(d, "Timeout"), "Timeout")
        header = _field(d, "Header") or {}
        return _Check(
            id=str(check_id),
            name=str(_field(d, "Name") or f"Service '{name}' check"),
            service_id=sid,
            service_name=name,
            status=status,
            ttl=ttl,
            http=str(http) if http else None,
            method=str(_field(d, "Method") or "GET"),
            header={str(k): [str(x) for x in v] for k, v in header.items()} if isinstance(header, dict) else {},
            interval=interval,
            timeout=timeout or HTTP_CHECK_TIMEOUT,
            deregister_after=_duration(
                _field(d, "DeregisterCriticalServiceAfter", "deregister_critical_service_after"),
                "DeregisterCriticalServiceAfter",
            ),
        )

    def deregister(self, service_id: str) -> None:
        """``PUT /v1/agent/service/deregister/:id``."""
        service = self.services.pop(service_id, None)
        if service is None:
            raise _HTTPError(404, f'Unknown service ID "{service_id}". Ensure that the service ID is passed')
        for check in [c for c in self.checks.values() if c.service_id == service_id]:
            self._cancel_timers(check)
            del self.checks[check.id]
        index = self._bump()
        self._services_table_index = index
        self._touch_service_name(service.name, index)
        self._changed()

    def update_ttl(self, check_id: str, status: str, output: str = "") -> None:
        """``PUT /v1/agent/check/pass/:id`` (warn and fail only when called): set the status and restart the TTL."""
        check = self.checks.get(check_id)
        if check is None or check.ttl is None:
            raise _HTTPError(500, f'CheckID "{check_id}" does not have associated TTL')
        self._arm(check)
        self._set_status(check, status, output)

    def _set_status(self, check: _Check, status: str, output: str) -> None:
        if check.id not in self.checks or self.checks[check.id] is not check:
            return
        if status != CRITICAL and check.reaper is not None:
            check.reaper.cancel()
            check.reaper = None
        elif status == CRITICAL and check.reaper is None and check.deregister_after is not None:
            check.reaper = self.reactor.callLater(check.deregister_after, self._reap, check)
        if (check.status, check.output) == (status, output):
            return  # Consul syncs only real changes to the catalog: no index bump
        check.status, check.output = status, output
        check.modify_index = self._bump()
        self._touch_service_name(check.service_name, check.modify_index)
        self._changed()

    def _arm(self, check: _Check) -> None:
        if check.timer is not None and check.timer.active():
            check.timer.cancel()
        if check.ttl is not None:
            check.timer = self.reactor.callLater(check.ttl, self._ttl_expired, check)
        elif check.interval is not None:
            check.timer = self.reactor.callLater(check.interval * self.rand(), self._poll, check)
        if check.status == CRITICAL and check.reaper is None and check.deregister_after is not None:
            check.reaper = self.reactor.callLater(check.deregister_after, self._reap, check)

    def _ttl_expired(self, check: _Check) -> None:
        check.timer = None
        self._set_status(check, CRITICAL, "TTL expired")

    def _reap(self, check: _Check) -> None:
        check.reaper = None
        if self.checks.get(check.id) is check and check.service_id in self.services:
            log.info("consul double: {sid} critical too long; deregistered", sid=check.service_id)
            self.deregister(check.service_id)

    def _poll(self, check: _Check) -> None:
        assert check.http is not None and check.interval is not None
        check.timer = self.reactor.callLater(check.interval, self._poll, check)
        d = self._http_check(check.http, check.method, check.header, check.timeout)

        def done(code: int) -> None:
            if 200 <= code < 300:
                self._set_status(check, PASSING, f"HTTP {check.method} {check.http}: {code}")
            elif code == 429:
                self._set_status(check, WARNING, f"HTTP {check.method} {check.http}: 429 Too Many Requests")
            else:
                self._set_status(check, CRITICAL, f"HTTP {check.method} {check.http}: {code}")

        def failed(f: Any) -> None:
            self._set_status(check, CRITICAL, f"HTTP {check.method} {check.http}: {f.getErrorMessage()}")

        d.addCallbacks(done, failed)

    def _http_check(self, url: str, method: str, header: dict[str, list[str]], timeout: float) -> defer.Deferred[int]:
        if self._http_get is not None:
            return self._http_get(url, method, header, timeout)
        import treq
        from twisted.web.client import Agent

        client = treq.client.HTTPClient(Agent(self.reactor))

        async def get() -> int:
            response = await client.request(method, url, headers=dict(header) or None)  # type: ignore[arg-type]
            await response.content()
            return int(response.code)

        d = defer.ensureDeferred(get())
        d.addTimeout(timeout, self.reactor)
        return d

    def _cancel_timers(self, check: _Check) -> None:
        for timer in (check.timer, check.reaper):
            if timer is not None and timer.active():
                timer.cancel()
        check.timer = check.reaper = None

    # -- failures and lifecycle --------------------------------------------

    def fail(self, mode: str | None, count: int | None = None, seconds: float | None = None) -> None:
        """Make the next ``count`` requests (or those within ``seconds``; or all) fail; ``None`` ends it."""
        if mode is None or mode == "none":
            self._failure = None
            return
        if mode not in FAIL_MODES:
            raise ValueError(f"fail mode must be one of {', '.join(FAIL_MODES)}")
        until = self.reactor.seconds() + seconds if seconds is not None else None
        self._failure = _Failure(mode, count, until)

    def _take_failure(self) -> str | None:
        f = self._failure
        if f is None:
            return None
        if f.until is not None and self.reactor.seconds() >= f.until:
            self._failure = None
            return None
        if f.count is not None:
            if f.count <= 0:
                self._failure = None
                return None
            f.count -= 1
        return f.mode

    def resource(self) -> Resource:
        """The twisted.web resource serving the API."""
        return _ConsulResource(self)

    async def listen(self, port: int = 0, interface: str = "127.0.0.1") -> int:
        """Serve on ``interface:port`` (0: any free port); returns the port."""
        from twisted.internet.endpoints import TCP4ServerEndpoint

        self._site = _TrackingSite(self.resource())
        self._port = await TCP4ServerEndpoint(self.reactor, port, interface=interface).listen(self._site)
        return int(self._port.getHost().port)  # type: ignore[attr-defined,union-attr]

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` while listening."""
        assert self._port is not None
        host = self._port.getHost()
        return f"http://{host.host}:{host.port}"  # type: ignore[attr-defined]

    async def stop(self) -> None:
        """Stop listening and drop every open connection, as a stopping agent does."""
        if self._port is not None:
            await defer.maybeDeferred(self._port.stopListening)
            self._port = None
        for waiter in list(self._waiters):
            self._drop_waiter(waiter)
        if self._site is not None:
            for proto in list(self._site.protocols):
                # Site builds a proxy; the transport belongs to the channel behind it.
                transport = getattr(getattr(proto, "_channel", proto), "transport", None)
                if transport is not None:
                    transport.abortConnection()
            self._site = None

    async def restart(self, keep_state: bool = True) -> int:
        """Stop and listen again on the same port; without ``keep_state``, like a dev agent: all forgotten."""
        assert self._port is not None
        host = self._port.getHost()
        await self.stop()
        if not keep_state:
            self.forget()
        return await self.listen(host.port, host.host)  # type: ignore[attr-defined,union-attr]

    def forget(self) -> None:
        """Lose every service and check, indexes included, as a restarted dev-mode agent does.

        Blocked queries lose their connection, as they would when the agent exits.
        """
        for waiter in list(self._waiters):
            self._drop_waiter(waiter)
            channel = waiter.request.channel
            if channel is not None and channel.transport is not None:
                channel.transport.abortConnection()  # type: ignore[attr-defined]
        self._reset_state()
        self._changed()

    def shutdown(self) -> None:
        """Cancel every timer (TTL, HTTP polls, waits); for tests that end."""
        for check in self.checks.values():
            self._cancel_timers(check)
        for waiter in list(self._waiters):
            self._drop_waiter(waiter)

    # -- persistence (``--state-file``) ------------------------------------

    def _save(self, path: str) -> None:
        state = {
            "index": self.index,
            "services": [s.__dict__ for s in self.services.values()],
            "checks": [c.saved() for c in self.checks.values()],
            "services_table_index": self._services_table_index,
            "service_name_index": self._service_name_index,
        }
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, path)

    def _load(self, path: str) -> None:
        with open(path) as f:
            state = json.load(f)
        self.index = state["index"]
        self.services = {s["id"]: _Service(**s) for s in state["services"]}
        self.checks = {c["id"]: _Check(**c) for c in state["checks"]}
        self._services_table_index = state["services_table_index"]
        self._service_name_index = state["service_name_index"]
        # Like an agent restoring persisted checks: the TTL clock starts again.
        for check in self.checks.values():
            self._arm(check)

    # -- reads ---------------------------------------------------------------

    def health_service(self, name: str, passing: bool = False) -> list[dict[str, Any]]:
        """``GET /v1/health/service/:name`` entries."""
        node = {
            "ID": "40e4a748-2192-161a-0510-9bf59fe950b5",
            "Node": self.node,
            "Address": self.address,
            "Datacenter": self.datacenter,
            "TaggedAddresses": {"lan": self.address, "wan": self.address},
            "Meta": {},
            "CreateIndex": 1,
            "ModifyIndex": 1,
        }
        serf = {
            "Node": self.node,
            "CheckID": "serfHealth",
            "Name": "Serf Health Status",
            "Status": PASSING,
            "Notes": "",
            "Output": "Agent alive and reachable",
            "ServiceID": "",
            "ServiceName": "",
            "ServiceTags": [],
            "Type": "",
            "CreateIndex": 1,
            "ModifyIndex": 1,
        }
        entries = []
        for service in sorted(self.services.values(), key=lambda s: s.id):
            if service.name != name:
                continue
            checks = [serf] + [c.view(self.node) for c in self.checks.values() if c.service_id == service.id]
            if passing and any(c["Status"] != PASSING for c in checks):
                continue
            entries.append({"Node": node, "Service": service.view(), "Checks": checks})
        return entries

    # -- blocking queries ---------------------------------------------------

    def _answer_waiter(self, waiter: _Waiter) -> None:
        self._drop_waiter(waiter)
        code, body = waiter.answer()
        _write(waiter.request, code, body, waiter.query_index())

    def _drop_waiter(self, waiter: _Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        if waiter.timer is not None and waiter.timer.active():
            waiter.timer.cancel()
        waiter.timer = None

    def blocking(
        self,
        request: Request,
        params: dict[str, list[str]],
        query_index: Callable[[], int],
        answer: Callable[[], tuple[int, Any]],
    ) -> Any:
        """Answer now, or when ``query_index()`` passes ``index``, or with the same index after ``wait``."""
        min_index = 0
        if "index" in params:
            try:
                min_index = int(params["index"][-1])
                if min_index < 0:
                    raise ValueError
            except ValueError:
                raise _HTTPError(400, "Invalid index") from None
        wait = CONSUL_DEFAULT_WAIT
        if "wait" in params:
            try:
                wait = parse_duration(params["wait"][-1])
            except ValueError:
                raise _HTTPError(400, "Invalid wait time") from None
        wait = min(wait, CONSUL_MAX_WAIT)
        if min_index > 0 and query_index() <= min_index:
            waiter = _Waiter(request, min_index, query_index, answer)
            # Consul adds up to wait/16 so that many waiters do not wake together.
            waiter.timer = self.reactor.callLater(wait + wait / 16 * self.rand(), self._answer_waiter, waiter)
            self._waiters.append(waiter)
            request.notifyFinish().addErrback(lambda _: self._drop_waiter(waiter))
            return NOT_DONE_YET
        code, body = answer()
        _write(request, code, body, query_index())
        return NOT_DONE_YET


class MemoryConsul:
    """The double served in memory on a fake clock, for unit tests of Consul clients.

    Requests travel through treq's ``RequestTraversalAgent`` (real HTTP
    parsing, no sockets); the double's timers (TTLs, blocking waits) and the
    client's run on ``clock``. :meth:`advance` moves time in small steps and
    delivers whatever was written meanwhile.
    """

    def __init__(self, clock: Any = None, **double_options: Any) -> None:
        from treq.testing import RequestTraversalAgent
        from twisted.internet.task import Clock

        self.clock = clock if clock is not None else Clock()
        double_options.setdefault("rand", lambda: 0.0)
        self.double = ConsulDouble(reactor=self.clock, **double_options)
        self.agent = RequestTraversalAgent(self.double.resource())

    def client(self, **options: Any) -> Any:
        """A :class:`~pubsubclub.discovery.consul.TwistedConsul` talking to the double."""
        from pubsubclub.discovery.client import TwistedConsul

        return TwistedConsul("127.0.0.1", 8500, reactor=self.clock, agent=self.agent, **options)

    def advance(self, seconds: float, step: float = 0.05) -> None:
        """Let ``seconds`` pass, delivering HTTP traffic after every step."""
        self.agent.flush()
        remaining = seconds
        while remaining > 1e-9:
            dt = min(step, remaining)
            self.clock.advance(dt)
            self.agent.flush()
            remaining -= dt
