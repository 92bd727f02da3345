"""The Consul double's state records: services, checks, blocking-query waiters, injected failures.

Plain data (and the field rules of Consul's JSON decoder) for
:class:`~pubsubclub.testing._consul.ConsulDouble`, which owns and changes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.web.server import Request

from pubsubclub.discovery.client import parse_duration

log = Logger()


PASSING, WARNING, CRITICAL = "passing", "warning", "critical"
_STATUSES = (PASSING, WARNING, CRITICAL)
#: Consul's default HTTP check time-out.
HTTP_CHECK_TIMEOUT = 10.0


class _HTTPError(Exception):
    """An error answer: status code and Consul's plain-text message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _field(obj: dict[str, Any], *names: str) -> Any:
    """Consul's decoder matches field names without regard to case (and knows some snake_case aliases)."""
    wanted = {n.lower() for n in names}
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() in wanted:
            return value
    return None


def _duration(value: Any, what: str) -> float | None:
    if value in (None, ""):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) / 1e9  # Go's JSON: a bare number of a time.Duration is nanoseconds
    try:
        return parse_duration(str(value))
    except ValueError:
        raise _HTTPError(400, f"Request decode failed: invalid duration for {what}: {value!r}") from None


def _query_bool(params: dict[str, list[str]], name: str) -> bool:
    """Consul's boolean query parameters: present (``?passing``), or a true value."""
    if name not in params:
        return False
    value = params[name][-1].lower()
    return value not in ("false", "0")


@dataclass
class _Service:
    id: str
    name: str
    address: str
    port: int
    tags: list[str]
    meta: dict[str, str]
    create_index: int
    modify_index: int

    def view(self) -> dict[str, Any]:
        return {
            "ID": self.id,
            "Service": self.name,
            "Tags": list(self.tags),
            "Address": self.address,
            "Meta": dict(self.meta),
            "Port": self.port,
            "Weights": {"Passing": 1, "Warning": 1},
            "EnableTagOverride": False,
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }

    def same(self, other: _Service) -> bool:
        return (self.name, self.address, self.port, self.tags, self.meta) == (
            other.name,
            other.address,
            other.port,
            other.tags,
            other.meta,
        )


@dataclass
class _Check:
    id: str
    name: str
    service_id: str
    service_name: str
    status: str
    ttl: float | None = None
    http: str | None = None
    method: str = "GET"
    header: dict[str, list[str]] = field(default_factory=dict)
    interval: float | None = None
    timeout: float = HTTP_CHECK_TIMEOUT
    deregister_after: float | None = None
    output: str = ""
    create_index: int = 0
    modify_index: int = 0
    timer: IDelayedCall | None = None
    reaper: IDelayedCall | None = None

    def kind(self) -> tuple[Any, ...]:
        return (self.name, self.ttl, self.http, self.method, self.interval, self.timeout, self.deregister_after)

    def view(self, node: str) -> dict[str, Any]:
        return {
            "Node": node,
            "CheckID": self.id,
            "Name": self.name,
            "Status": self.status,
            "Notes": "",
            "Output": self.output,
            "ServiceID": self.service_id,
            "ServiceName": self.service_name,
            "ServiceTags": [],
            "Type": "ttl" if self.ttl is not None else "http",
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }

    def saved(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in self.__dict__.items()
            if k not in ("timer", "reaper")  # timers are restarted on load
        }


@dataclass
class _Waiter:
    request: Request
    min_index: int
    query_index: Callable[[], int]
    answer: Callable[[], tuple[int, Any]]
    timer: IDelayedCall | None = None


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the double received it (query pairs in order, repeats kept)."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...]
    body: bytes
    #: ``reactor.seconds()`` when it arrived.
    at: float = 0.0


@dataclass
class _Failure:
    mode: str
    count: int | None
    until: float | None


FAIL_MODES = ("500", "junk", "drop", "hang")
