"""Our Twisted adapter for python-consul, against python-consul 1.1.0's own ``consul.twisted``.

Each of the three adapter bugs has one test body run against both adapters:
it passes with ours and is a strict expected failure with python-consul's.
"""

from __future__ import annotations

import warnings
from typing import Any

import consul.twisted
import pytest
import pytest_twisted
from consul.base import ConsulException
from helpers.ports import free_port
from twisted.internet import reactor

from pubsubclub.discovery.consul import (
    ConsulBadResponse,
    ConsulTimeout,
    ConsulUnreachable,
    TreqHTTPClient,
    TwistedConsul,
)
from pubsubclub.testing import ConsulDouble


def client(kind: str, port: int) -> Any:
    """A python-consul ``Consul`` on our adapter or on python-consul's own."""
    if kind == "ours":
        return TwistedConsul("127.0.0.1", port, reactor=reactor)
    return consul.twisted.Consul("127.0.0.1", port)


def theirs(reason: str, raises: type[BaseException]) -> Any:
    """python-consul's adapter, expected to show the bug."""
    return pytest.param("python-consul", marks=pytest.mark.xfail(strict=True, raises=raises, reason=reason))


@pytest.mark.parametrize(
    "kind", ["ours", theirs("a refused connection raises AttributeError on e.message", AttributeError)]
)
@pytest_twisted.ensureDeferred
async def test_refused_connection_is_a_consul_exception(kind: str) -> None:
    """Nothing listening: the call fails with a ConsulException naming the cause, not AttributeError."""
    c = client(kind, free_port())
    with pytest.raises(ConsulException) as info:
        await c.agent.services()
    assert "Connection refused" in str(info.value) or "ConnectionRefused" in str(info.value)


@pytest.mark.filterwarnings("ignore:twisted.internet.defer.returnValue:DeprecationWarning")
@pytest.mark.parametrize("kind", ["ours", theirs("GET query parameters are sent twice", AssertionError)])
@pytest_twisted.ensureDeferred
async def test_get_query_parameters_are_sent_once(kind: str, double: ConsulDouble) -> None:
    """A blocking health query reaches the agent with index, wait and passing once each."""
    c = client(kind, int(double.url.rsplit(":", 1)[1]))
    await c.health.service("web", index=1, wait="50ms", passing=True)
    request = double.requests[-1]
    assert (request.method, request.path) == ("GET", "/v1/health/service/web")
    assert request.query == (("index", "1"), ("wait", "50ms"), ("passing", "1"))


@pytest.mark.parametrize("kind", ["ours", theirs("it calls the deprecated returnValue", AssertionError)])
@pytest_twisted.ensureDeferred
async def test_no_deprecated_return_value(kind: str, double: ConsulDouble) -> None:
    """A round of calls emits no DeprecationWarning for twisted's returnValue."""
    c = client(kind, int(double.url.rsplit(":", 1)[1]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert await c.agent.service.register("web", service_id="w1", port=8080) is True
        index, entries = await c.health.service("web")
        await c.agent.services()
    assert [e["Service"]["ID"] for e in entries] == ["w1"]
    deprecated = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert [m for m in deprecated if "returnValue" in m] == []


@pytest_twisted.ensureDeferred
async def test_register_heartbeat_watch_and_deregister_through_our_adapter(double: ConsulDouble) -> None:
    """Registration with Meta, TTL pass, a passing-filtered blocking query and deregistration all work."""
    c = TwistedConsul.from_url(double.url, reactor=reactor)
    definition = {"ID": "n1", "Name": "pubsubclub", "Address": "127.0.0.1", "Port": 9001, "Meta": {"node_id": "n1"}}
    assert await c.register_service({**definition, "Check": {"CheckID": "service:n1", "TTL": "10s"}}) is True
    assert (await c.agent.services())["n1"]["Meta"] == {"node_id": "n1"}
    index, entries = await c.health.service("pubsubclub", passing=True)
    assert entries == []
    assert await c.agent.check.ttl_pass("service:n1") is True
    later, entries = await c.health.service("pubsubclub", index=index, wait="5s", passing=True)
    assert int(later) > int(index)
    assert [(e["Service"]["ID"], e["Service"]["Port"]) for e in entries] == [("n1", 9001)]
    same, _ = await c.health.service("pubsubclub", index=later, wait="100ms", passing=True)
    assert same == later
    assert await c.agent.service.deregister("n1") is True
    await c.close()


@pytest_twisted.ensureDeferred
async def test_agent_errors_become_typed_consul_exceptions(double: ConsulDouble) -> None:
    """500 stays python-consul's error; junk is ConsulBadResponse; a dropped connection ConsulUnreachable."""
    c = TwistedConsul.from_url(double.url, reactor=reactor)
    double.fail("500", count=1)
    with pytest.raises(ConsulException) as info:
        await c.health.service("web")
    assert "500" in str(info.value) and not isinstance(info.value, (ConsulUnreachable, ConsulTimeout))
    double.fail("junk", count=1)
    with pytest.raises(ConsulBadResponse):
        await c.health.service("web")
    double.fail("drop", count=1)
    with pytest.raises(ConsulUnreachable):
        await c.agent.check.ttl_pass("service:n1")
    assert (await c.health.service("web"))[1] == []
    await c.close()


@pytest_twisted.ensureDeferred
async def test_a_request_without_answer_times_out(double: ConsulDouble) -> None:
    """An agent that never answers: ConsulTimeout after the client's time limit."""
    c = TwistedConsul.from_url(double.url, reactor=reactor, timeout=0.3)
    double.fail("hang")
    started = reactor.seconds()
    with pytest.raises(ConsulTimeout):
        await c.agent.services()
    assert 0.25 < reactor.seconds() - started < 5
    double.fail(None)
    await c.close()


def test_blocking_queries_get_their_wait_plus_jitter_plus_margin() -> None:
    """The time limit of a blocking query covers its wait, Consul's wait/16 jitter and the normal limit."""
    http = TreqHTTPClient("127.0.0.1", 8500, reactor=reactor, timeout=10)
    assert http.request_timeout([("passing", "1")]) == 10
    assert http.request_timeout([("index", 5), ("wait", "16s")]) == 16 + 1 + 10
    assert http.request_timeout({"index": 5}) == 300 + 300 / 16 + 10
    assert http.request_timeout([("index", 5), ("wait", "1h")]) == 600 + 600 / 16 + 10
