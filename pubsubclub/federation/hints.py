"""What to do when a link cannot be made: a hint per failure reason, the failing-connect hook, the ready report.

:func:`link_failure_hint` names the likely mistake behind a failed dial
(a path other than ``/psc``, a WAMP port given as a PSC peer, nothing
listening, an untrusted certificate). The federation logs it with every
``could not link to URL: REASON`` line and keeps the last reason per server;
:class:`PeerReport` logs "ready, K of N peers reachable" once every
configured peer linked or :data:`READY_REPORT_SECONDS` after start, with
the reason and hint of each one that did not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

log = Logger()

#: Seconds after start when the node reports which configured peers it reached (earlier if all did).
READY_REPORT_SECONDS = 3.0
#: Seconds between looks at the links while waiting to report.
READY_REPORT_POLL = 0.25


def link_failure_hint(reason: str, url: str | None = None) -> str | None:
    """The likely mistake behind ``reason`` (why dialling ``url`` failed), as advice; None when there is no guess."""
    lowered = reason.lower()
    where = "the peer"
    if url is not None:
        try:
            parts = urlsplit(url)
            where = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'wss' else 80)}"
        except ValueError:
            pass
    if "[404]" in reason or "404 not found" in lowered:
        return "is the path /psc? a node's PSC listener answers at /psc only"
    if "[400]" in reason and "subprotocol" in lowered:
        return "that looks like a WAMP port, not a PSC port: give the peer's --psc port"
    if "connection refused" in lowered or "connection was refused" in lowered:
        return f"nothing listening at {where}: is the peer running, and is that its --psc port?"
    if "certificate verify failed" in lowered or "certificate_verify_failed" in lowered:
        return "the peer's certificate is not trusted: pass the CA that signed it with --ca-file"
    if "timeout" in lowered or "timed out" in lowered:
        return f"no answer from {where}: wrong host, or a firewall in the way?"
    if "dns lookup failed" in lowered or "name or service not known" in lowered:
        return f"cannot resolve {where}: check the host name"
    return None


def with_hint(reason: str, url: str | None = None) -> str:
    """``reason``, followed by its hint in parentheses when there is one."""
    hint = link_failure_hint(reason, url)
    return reason if hint is None else f"{reason} ({hint})"


@implementer(IStreamClientEndpoint)
class ReportingEndpoint:
    """A client endpoint that tells ``failed(reason)`` when a connect fails (refused, timeout, DNS).

    Other attributes are the wrapped endpoint's (the retry log line reads its host and port).
    """

    def __init__(self, endpoint: IStreamClientEndpoint, failed: Callable[[str], None]) -> None:
        self._endpoint = endpoint
        self._failed = failed

    def connect(self, factory: Any) -> Deferred[Any]:
        """Connect; a failure is reported, then passed on unchanged."""

        def report(failure: Failure) -> Failure:
            self._failed(failure.getErrorMessage())
            return failure

        return self._endpoint.connect(factory).addErrback(report)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._endpoint, name)


class PeerStates(Protocol):
    """What :class:`PeerReport` asks the federation."""

    def peer_states(self, urls: list[str]) -> list[tuple[str, bool, str | None]]:
        """(url, linked, last failure reason) of each of ``urls``."""


class PeerReport:
    """Logs "ready, K of N peers reachable" (and why each other one is not) once, soon after start."""

    def __init__(self, clock: Any, federation: PeerStates, urls: list[str], within: float = READY_REPORT_SECONDS):
        self._clock = clock
        self._federation = federation
        self._urls = urls
        self._deadline = clock.seconds() + within
        self._call: Any = None

    def start(self) -> None:
        """Look now and then every :data:`READY_REPORT_POLL` seconds until all linked or the deadline."""
        self._look()

    def stop(self) -> None:
        """Do not report (the node is stopping)."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def _look(self) -> None:
        self._call = None
        states = self._federation.peer_states(self._urls)
        reached = sum(1 for _, linked, _ in states if linked)
        if reached < len(states) and self._clock.seconds() < self._deadline:
            self._call = self._clock.callLater(READY_REPORT_POLL, self._look)
            return
        log_at = log.info if reached == len(states) else log.warn
        log_at("ready, {reached} of {total} peers reachable", reached=reached, total=len(states))
        for url, linked, reason in states:
            if not linked:
                log.warn(
                    "peer {url} not reachable: {reason}",
                    url=url,
                    reason="no answer yet" if reason is None else with_hint(reason, url),
                )
