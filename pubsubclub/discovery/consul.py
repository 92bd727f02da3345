"""Consul discovery: register this node, watch the healthy ones, drive the federation.

Two parts:

- :class:`~pubsubclub.discovery.client.TwistedConsul`, python-consul's ``Consul``
  API on :class:`~pubsubclub.discovery.client.TreqHTTPClient`, our own Twisted HTTP
  client for it (in :mod:`pubsubclub.discovery.client`, which says why
  python-consul's ``consul.twisted`` cannot be used; its names stay importable from
  here).
- :class:`ConsulDiscovery` (here), which registers the node (with a TTL check it
  heartbeats, or an HTTP check on ``/health``), watches the service's passing
  instances with blocking queries and turns each change into
  ``Federation.add_server`` / ``remove_server`` calls, debounced. The registration
  lifecycle and the watch share the agent, the retry policy and the stop signal,
  so they stay one class.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from consul.base import ConsulException
from twisted.internet import defer, task
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from pubsubclub.discovery.client import (  # noqa: F401 (re-exported: the adapter's names, by their old path)
    CONSUL_DEFAULT_WAIT,
    CONSUL_MAX_WAIT,
    DEFAULT_TIMEOUT,
    TRANSPORT_ERRORS,
    ConsulBadResponse,
    ConsulTimeout,
    ConsulUnreachable,
    TreqHTTPClient,
    TwistedConsul,
    format_duration,
    parse_duration,
)
from pubsubclub.federation import psc
from pubsubclub.federation.retry import RetryPolicy

log = Logger()


class Registration(Enum):
    """Where this node's registration stands with the agent."""

    #: Not registered yet, or the agent forgot us (restarted, check unknown): register next.
    UNREGISTERED = "unregistered"
    #: The agent has our definition; the heartbeat keeps the check passing.
    REGISTERED = "registered"
    #: Stopped: deregistered (or tried to) and no longer heartbeating.
    LEFT = "left"


class _Forgotten(ConsulException):
    """The agent answered a heartbeat but no longer knows our service or check."""


def _versions() -> str:
    return ",".join(f"{major}.{minor}" for major, minor in psc.SUPPORTED_VERSIONS)


class ConsulDiscovery:
    """Keeps this node registered in Consul and the federation linked to the service's healthy instances.

    ``start()`` registers (service id = ``node_id``; address and port of
    ``advertise_url``; node id, PSC versions, path and scheme in ``Meta``)
    with a TTL check heartbeated every ``ttl/3`` (``check="ttl"``) or an HTTP
    check of ``health_url`` every ``ttl/3`` (``check="http"``). A refused
    heartbeat (the agent restarted and forgot us) re-registers at once.

    The watch is a blocking query on ``/v1/health/service/<service>?passing``;
    each answer becomes the wanted set of PSC URLs (never this node's own).
    Changes are applied after ``debounce`` seconds without further change
    (held at most ``max_hold``), so a flapping check does not churn links.
    Errors (refused, 5xx, junk, time-outs) are logged and retried with
    ``backoff``; the last applied membership stays meanwhile. With
    ``advertise_url`` None the node only watches. All timers run on
    ``reactor``.
    """

    def __init__(
        self,
        federation: Any,
        *,
        consul_url: str = "http://127.0.0.1:8500",
        service: str = "pubsubclub",
        node_id: str,
        advertise_url: str | None,
        token: str | None = None,
        dc: str | None = None,
        check: str = "ttl",
        health_url: str | None = None,
        ttl: float = 10.0,
        debounce: float = 0.5,
        max_hold: float | None = None,
        watch_wait: float = 60.0,
        deregister_after: float = 600.0,
        backoff: RetryPolicy = RetryPolicy(initial=0.5, factor=2.0, max_delay=15.0, jitter=0.2),
        stop_timeout: float = 3.0,
        reactor: Any = None,
        rand: Callable[[], float] = random.random,
        client: TwistedConsul | None = None,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor
        if check not in ("ttl", "http"):
            raise ValueError(f"check must be 'ttl' or 'http', not {check!r}")
        if check == "http" and advertise_url is not None and health_url is None:
            raise ValueError("an HTTP check needs health_url")
        self.federation = federation
        self.service = service
        self.service_id = node_id
        self.node_id = node_id
        self.advertise_url = advertise_url
        self.check = check
        self.check_id = f"service:{node_id}"
        self.health_url = health_url
        self.ttl = ttl
        self.debounce = debounce
        self.max_hold = max_hold if max_hold is not None else max(5 * debounce, debounce)
        self.watch_wait = watch_wait
        self.deregister_after = deregister_after
        self._backoff = backoff
        self._stop_timeout = stop_timeout
        self._reactor = reactor
        self._rand = rand
        self._token = token
        self.consul = (
            client if client is not None else TwistedConsul.from_url(consul_url, token=token, dc=dc, reactor=reactor)
        )
        self.registration = Registration.UNREGISTERED
        #: The blocking query's index (0: read without blocking next).
        self.index = 0
        #: PSC URL -> service id, as last handed to the federation.
        self.applied: dict[str, str] = {}
        #: PSC URL -> service id, as last seen in Consul.
        self.wanted: dict[str, str] = {}
        self.errors = 0
        self.last_error: str | None = None
        self._running = False
        self._tasks: list[defer.Deferred[None]] = []
        self._apply_call: IDelayedCall | None = None
        self._pending_since = 0.0

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Register (retried until it works) and start watching."""
        if self._running:
            return
        self._running = True
        if self.advertise_url is not None:
            self._tasks.append(self._spawn(self._keep_registered()))
        else:
            log.info("consul: no PSC address to advertise; watching {service} only", service=self.service)
        self._tasks.append(self._spawn(self._watch()))

    async def stop(self) -> None:
        """Stop watching and heartbeating, then deregister (bounded by ``stop_timeout``)."""
        if not self._running:
            return
        self._running = False
        for d in self._tasks:
            d.cancel()
        self._tasks.clear()
        if self._apply_call is not None and self._apply_call.active():
            self._apply_call.cancel()
        self._apply_call = None
        if self.advertise_url is not None:
            d = self.consul.agent.service.deregister(self.service_id)
            d.addTimeout(self._stop_timeout, self._reactor)
            try:
                await d
                log.info("consul: deregistered {sid}", sid=self.service_id)
            except (ConsulException, defer.TimeoutError) as e:
                log.warn("consul: could not deregister {sid}: {error}", sid=self.service_id, error=e)
        self.registration = Registration.LEFT
        await self.consul.close()

    def status(self) -> dict[str, Any]:
        """State for ``/stats``."""
        return {
            "service": self.service,
            "service_id": self.service_id,
            "registration": self.registration.value,
            "index": self.index,
            "members": sorted(self.applied),
            "pending": self._apply_call is not None and self._apply_call.active(),
            "errors": self.errors,
            "last_error": self.last_error,
        }

    def definition(self) -> dict[str, Any]:
        """The service definition registered with the agent."""
        assert self.advertise_url is not None
        parts = urlsplit(self.advertise_url)
        interval = format_duration(self.ttl / 3)
        check: dict[str, Any] = {
            "CheckID": self.check_id,
            "DeregisterCriticalServiceAfter": format_duration(self.deregister_after),
        }
        if self.check == "ttl":
            check.update(Name="PubSubClub node heartbeat", TTL=format_duration(self.ttl))
        else:
            check.update(
                Name="PubSubClub node /health",
                HTTP=self.health_url,
                Method="GET",
                Interval=interval,
                Timeout=format_duration(min(self.ttl / 3, 5.0)),
            )
        return {
            "ID": self.service_id,
            "Name": self.service,
            "Address": parts.hostname,
            "Port": parts.port or (443 if parts.scheme == "wss" else 80),
            "Tags": ["psc"],
            "Meta": {
                "node_id": self.node_id,
                "psc_versions": _versions(),
                "psc_path": parts.path or "/",
                "scheme": parts.scheme,
            },
            "Check": check,
        }

    # -- helpers -----------------------------------------------------------

    def _spawn(self, coro: Any) -> defer.Deferred[None]:
        d: defer.Deferred[None] = defer.ensureDeferred(coro)
        d.addErrback(lambda f: f.trap(defer.CancelledError))
        d.addErrback(lambda f: log.failure("consul: discovery task failed", f))
        return d

    def _sleep(self, seconds: float) -> defer.Deferred[None]:
        return task.deferLater(self._reactor, seconds)

    def _delay(self, failures: int) -> float:
        return self._backoff.delay(failures, self._rand)

    def _failed(self, what: str, e: Exception) -> None:
        self.errors += 1
        self.last_error = f"{what}: {e}"
        log.warn("consul: {what} failed: {error}", what=what, error=e)

    # -- registration ------------------------------------------------------

    async def _keep_registered(self) -> None:
        failures = 0
        while self._running:
            try:
                if self.registration is Registration.UNREGISTERED:
                    if not await self.consul.register_service(self.definition()):
                        raise ConsulException("registration refused")
                    self.registration = Registration.REGISTERED
                    log.info(
                        "consul: registered {sid} ({url}) in service {service}",
                        sid=self.service_id,
                        url=self.advertise_url,
                        service=self.service,
                    )
                await self._refresh()
            except TRANSPORT_ERRORS as e:
                # No answer: the agent may still hold our registration.
                failures += 1
                self._failed("heartbeat", e)
                await self._sleep(self._delay(failures))
                continue
            except ConsulException as e:
                # The agent answered and refused: it lost our registration
                # (restarted) or is unwell. Register again; at once the first time.
                failures += 1
                self.registration = Registration.UNREGISTERED
                self._failed("registration" if isinstance(e, _Forgotten) else "heartbeat", e)
                await self._sleep(0 if failures == 1 else self._delay(failures - 1))
                continue
            failures = 0
            await self._sleep(self.ttl / 3)

    async def _refresh(self) -> None:
        """TTL: mark the check passing. HTTP: make sure the agent still knows us."""
        if self.check == "ttl":
            if not await self.consul.agent.check.ttl_pass(self.check_id):
                raise _Forgotten(f"the agent does not know check {self.check_id}")
        else:
            services = await self.consul.agent.services()
            if not isinstance(services, dict) or self.service_id not in services:
                raise _Forgotten(f"the agent does not know service {self.service_id}")

    # -- watch -------------------------------------------------------------

    async def _watch(self) -> None:
        failures = 0
        while self._running:
            try:
                index, entries = await self.consul.health.service(
                    self.service,
                    index=self.index or None,
                    wait=format_duration(self.watch_wait),
                    passing=True,
                )
                new_index = int(index)
                members = self._members(entries)
            except (ConsulException, ValueError, TypeError) as e:
                failures += 1
                self._failed("watch", e)
                # The agent may come back restarted, its index behind ours:
                # read afresh instead of blocking on an index it may never reach.
                self.index = 0
                await self._sleep(self._delay(failures))
                continue
            failures = 0
            # Consul's rules for blocking clients: an index that went backwards
            # restarts the loop from 0; an index of 0 is never waited on.
            if new_index < self.index:
                log.info("consul: index went backwards ({old} -> {new}); reading afresh", old=self.index, new=new_index)
                self.index = 0
            else:
                self.index = max(new_index, 1)
            self._observe(members)

    def _members(self, entries: Any) -> dict[str, str]:
        if not isinstance(entries, Sequence) or isinstance(entries, (str, bytes)):
            raise ConsulBadResponse(f"health answer is not a list: {entries!r:.100}")
        members: dict[str, str] = {}
        for entry in entries:
            try:
                sid, url = self._member_url(entry)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                log.warn("consul: ignoring malformed instance {entry!r:.200}: {error!r}", entry=entry, error=e)
                continue
            if sid == self.service_id or url == self.advertise_url:
                continue
            members[url] = sid
        return members

    @staticmethod
    def _member_url(entry: Mapping[str, Any]) -> tuple[str, str]:
        service = entry["Service"]
        sid = str(service["ID"])
        address = service.get("Address") or entry["Node"]["Address"]
        port = int(service["Port"])
        if not address or not 0 < port < 65536:
            raise ValueError("no address or port")
        meta = service.get("Meta") or {}
        scheme = meta.get("scheme", "ws")
        path = meta.get("psc_path", "/psc")
        if scheme not in ("ws", "wss") or not str(path).startswith("/"):
            raise ValueError(f"bad scheme or path {scheme!r} {path!r}")
        host = f"[{address}]" if ":" in address else address
        return sid, f"{scheme}://{host}:{port}{path}"

    # -- debounce and apply ------------------------------------------------

    def _observe(self, members: dict[str, str]) -> None:
        self.wanted = members
        now = self._reactor.seconds()
        if set(members) == set(self.applied):
            # Back where we are (a flap undone within the quiet period): nothing to do.
            if self._apply_call is not None and self._apply_call.active():
                self._apply_call.cancel()
            self._apply_call = None
            return
        if self._apply_call is not None and self._apply_call.active():
            deadline = self._pending_since + self.max_hold
            self._apply_call.reset(max(0.0, min(self.debounce, deadline - now)))
            return
        self._pending_since = now
        self._apply_call = self._reactor.callLater(self.debounce, self._apply)

    @staticmethod
    def _log_removal_failure(failure: Failure, url: str) -> None:
        log.failure("consul: removing {url} failed", failure, url=url)

    def _apply(self) -> None:
        self._apply_call = None
        wanted, applied = self.wanted, self.applied
        added = [url for url in wanted if url not in applied]
        removed = [url for url in applied if url not in wanted]
        self.applied = dict(wanted)
        if added or removed:
            log.info("consul: membership change: +{added} -{removed}", added=added, removed=removed)
        for url in removed:
            d = defer.maybeDeferred(self.federation.remove_server, url)
            d.addErrback(self._log_removal_failure, url)
        for url in added:
            try:
                self.federation.add_server(url)
            except Exception:  # one bad URL must not stop the others
                log.failure("consul: adding {url} failed", url=url)
