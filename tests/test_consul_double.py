"""The Consul double in pubsubclub.testing, over real HTTP: Consul's documented behaviour for what discovery uses."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
import treq
from twisted.internet import defer, reactor
from twisted.web.resource import Resource
from twisted.web.server import Site

from pubsubclub.testing import ConsulDouble

TTL_SERVICE = {"Name": "web", "ID": "web1", "Port": 8080, "Check": {"TTL": "10s"}}


class Answer:
    """Status, headers (lower-case names) and body of one response."""

    def __init__(self, code: int, headers: dict[str, str], body: bytes) -> None:
        self.code = code
        self.headers = headers
        self.body = body

    @property
    def index(self) -> int:
        """``X-Consul-Index``."""
        return int(self.headers["x-consul-index"])

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


async def call(double: ConsulDouble, method: str, path: str, body: Any = None) -> Answer:
    """One request to the double over a fresh connection."""
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    d = treq.request(method, double.url + path, data=data, persistent=False)
    d.addTimeout(15, reactor)
    response = await d
    content = await response.content()
    headers = {k.decode().lower(): v[0].decode() for k, v in response.headers.getAllRawHeaders()}
    return Answer(response.code, headers, content)


@pytest_twisted.ensureDeferred
async def test_a_fresh_agent_reports_an_index_of_1(double: ConsulDouble) -> None:
    """A fresh agent answers a health read with X-Consul-Index 1 (never 0) and an empty list."""
    answer = await call(double, "GET", "/v1/health/service/none")
    assert (answer.code, answer.index, answer.json()) == (200, 1, [])


@pytest_twisted.ensureDeferred
async def test_endpoints_discovery_does_not_use_are_not_served(double: ConsulDouble) -> None:
    """The KV store, the catalog and warn/fail over HTTP answer Consul's plain 404."""
    for method, path in (
        ("GET", "/v1/kv/missing"),
        ("PUT", "/v1/kv/key"),
        ("GET", "/v1/catalog/services"),
        ("PUT", "/v1/agent/check/warn/service:web1"),
    ):
        answer = await call(double, method, path)
        assert (answer.code, answer.body) == (404, b"404 page not found"), path


@pytest_twisted.ensureDeferred
async def test_blocking_query_answers_early_when_the_index_moves(double: ConsulDouble) -> None:
    """A query blocked on the current index answers as soon as a registration changes the result."""
    first = await call(double, "GET", "/v1/health/service/web")
    assert first.json() == []
    started = reactor.seconds()
    blocked = defer.ensureDeferred(call(double, "GET", f"/v1/health/service/web?index={first.index}&wait=10s"))
    await call(double, "PUT", "/v1/agent/service/register", TTL_SERVICE)
    answer = await blocked
    assert reactor.seconds() - started < 5
    assert answer.index > first.index
    assert [e["Service"]["ID"] for e in answer.json()] == ["web1"]


@pytest_twisted.ensureDeferred
async def test_blocking_query_times_out_with_the_same_index(double: ConsulDouble) -> None:
    """Without a change, the query hangs for its wait and returns the index it was given."""
    await call(double, "PUT", "/v1/agent/service/register", TTL_SERVICE)
    first = await call(double, "GET", "/v1/health/service/web")
    started = reactor.seconds()
    # Another service's registration moves the global index but not this query's.
    unrelated = call(double, "PUT", "/v1/agent/service/register", {**TTL_SERVICE, "Name": "db", "ID": "db1"})
    answer = await call(double, "GET", f"/v1/health/service/web?index={first.index}&wait=600ms")
    await unrelated
    assert 0.55 <= reactor.seconds() - started < 5
    assert answer.index == first.index
    assert answer.json() == first.json()


@pytest_twisted.ensureDeferred
async def test_bad_index_or_wait_is_a_400(double: ConsulDouble) -> None:
    """``index=abc`` and ``wait=soon`` are refused the way Consul refuses them."""
    bad_index = await call(double, "GET", "/v1/health/service/web?index=abc")
    bad_wait = await call(double, "GET", "/v1/health/service/web?index=1&wait=soon")
    assert (bad_index.code, bad_index.body) == (400, b"Invalid index")
    assert (bad_wait.code, bad_wait.body) == (400, b"Invalid wait time")


@pytest_twisted.ensureDeferred
async def test_ttl_check_goes_critical_when_not_refreshed(double: ConsulDouble) -> None:
    """A TTL check starts critical, passes on /pass, and is critical with "TTL expired" after its TTL."""
    await call(double, "PUT", "/v1/agent/service/register", {**TTL_SERVICE, "Check": {"TTL": "500ms"}})
    checks = (await call(double, "GET", "/v1/agent/checks")).json()
    assert checks["service:web1"]["Status"] == "critical"
    assert (await call(double, "PUT", "/v1/agent/check/pass/service:web1")).code == 200
    passing = await call(double, "GET", "/v1/health/service/web?passing")
    assert len(passing.json()) == 1
    expired = await call(double, "GET", f"/v1/health/service/web?passing&index={passing.index}&wait=5s")
    assert expired.json() == []
    check = (await call(double, "GET", "/v1/agent/checks")).json()["service:web1"]
    assert (check["Status"], check["Output"]) == ("critical", "TTL expired")


@pytest_twisted.ensureDeferred
async def test_passing_filter_leaves_out_warning_and_critical(double: ConsulDouble) -> None:
    """``?passing`` lists only instances whose every check passes; warning is not passing."""
    for sid in ("a", "b", "c"):
        await call(double, "PUT", "/v1/agent/service/register", {**TTL_SERVICE, "ID": sid})
    await call(double, "PUT", "/v1/agent/check/pass/service:a")
    double.update_ttl("service:b", "warning", "slow")
    everyone = (await call(double, "GET", "/v1/health/service/web")).json()
    healthy = (await call(double, "GET", "/v1/health/service/web?passing=1")).json()
    assert [e["Service"]["ID"] for e in everyone] == ["a", "b", "c"]
    assert [e["Service"]["ID"] for e in healthy] == ["a"]
    statuses = {c["CheckID"]: (c["Status"], c["Output"]) for c in everyone[1]["Checks"]}
    assert statuses == {"serfHealth": ("passing", "Agent alive and reachable"), "service:b": ("warning", "slow")}
    unknown = await call(double, "PUT", "/v1/agent/check/pass/service:zzz")
    assert (unknown.code, unknown.body) == (500, b'CheckID "service:zzz" does not have associated TTL')


@pytest_twisted.ensureDeferred
async def test_register_is_case_insensitive_and_idempotent(double: ConsulDouble) -> None:
    """python-consul's lower-case fields work; re-registering an unchanged service moves no index."""
    body = {"name": "web", "id": "w", "port": 1, "meta": {"k": "v"}, "check": {"ttl": "10s"}}
    await call(double, "PUT", "/v1/agent/service/register", body)
    await call(double, "PUT", "/v1/agent/check/pass/service:w")
    before = await call(double, "GET", "/v1/health/service/web")
    await call(double, "PUT", "/v1/agent/service/register", body)
    after = await call(double, "GET", "/v1/health/service/web")
    assert after.index == before.index
    assert after.json()[0]["Service"]["Meta"] == {"k": "v"}
    assert after.json()[0]["Checks"][1]["Status"] == "passing"
    missing = await call(double, "PUT", "/v1/agent/service/register", {"port": 1})
    assert (missing.code, missing.body) == (400, b"Missing service name")


@pytest_twisted.ensureDeferred
async def test_deregister_removes_the_instance_and_its_checks(double: ConsulDouble) -> None:
    """Deregistering wakes watchers with a higher index; an unknown id is a 404."""
    await call(double, "PUT", "/v1/agent/service/register", TTL_SERVICE)
    before = await call(double, "GET", "/v1/health/service/web")
    blocked = defer.ensureDeferred(call(double, "GET", f"/v1/health/service/web?index={before.index}&wait=10s"))
    assert (await call(double, "PUT", "/v1/agent/service/deregister/web1")).code == 200
    after = await blocked
    assert after.json() == [] and after.index > before.index
    assert (await call(double, "GET", "/v1/agent/checks")).json() == {}
    assert (await call(double, "GET", "/v1/agent/services")).json() == {}
    assert (await call(double, "PUT", "/v1/agent/service/deregister/web1")).code == 404


@pytest_twisted.ensureDeferred
async def test_http_check_is_polled(double: ConsulDouble) -> None:
    """An HTTP check follows the target: 200 passing, 429 warning, 503 critical."""
    codes = [200]

    class Health(Resource):
        isLeaf = True

        def render_GET(self, request: Any) -> bytes:
            request.setResponseCode(codes[0])
            return b"{}"

    port = reactor.listenTCP(0, Site(Health()), interface="127.0.0.1")
    try:
        check = {"HTTP": f"http://127.0.0.1:{port.getHost().port}/health", "Interval": "100ms", "Timeout": "1s"}
        await call(double, "PUT", "/v1/agent/service/register", {**TTL_SERVICE, "Check": check})
        index = 0
        reached: list[str] = []
        deadline = reactor.seconds() + 10
        for code, status in ((200, "passing"), (429, "warning"), (503, "critical")):
            codes[0] = code
            # Each watch is bounded by its wait (and call()'s time limit), the whole by the deadline.
            while reactor.seconds() < deadline:
                answer = await call(double, "GET", f"/v1/health/service/web?index={index}&wait=1s")
                index = answer.index
                if answer.json()[0]["Checks"][1]["Status"] == status:
                    reached.append(status)
                    break
        assert reached == ["passing", "warning", "critical"]
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_failure_modes_and_restart(double: ConsulDouble) -> None:
    """fail() gives 500s or junk for a count of requests; restart keeps state; forgetting resets indexes to 1."""
    await call(double, "PUT", "/v1/agent/service/register", TTL_SERVICE)
    await call(double, "PUT", "/v1/agent/check/pass/service:web1")
    double.fail("500", count=1)
    assert (await call(double, "GET", "/v1/agent/services")).code == 500
    double.fail("junk", count=1)
    junk = await call(double, "GET", "/v1/agent/services")
    assert junk.code == 200
    try:
        junk.json()
        raise AssertionError("junk parsed as JSON")
    except ValueError:
        pass
    assert list((await call(double, "GET", "/v1/agent/services")).json()) == ["web1"]
    before = await call(double, "GET", "/v1/health/service/web")
    await double.restart()
    kept = await call(double, "GET", "/v1/health/service/web")
    assert kept.index == before.index and len(kept.json()) == 1
    await double.restart(keep_state=False)
    forgotten = await call(double, "GET", "/v1/health/service/web")
    assert forgotten.index == 1 < before.index and forgotten.json() == []


@pytest_twisted.ensureDeferred
async def test_indexes_never_go_backwards(double: ConsulDouble) -> None:
    """Across registrations, check changes and deregistrations, each query's index only grows."""
    seen: list[int] = []
    for i in range(5):
        await call(double, "PUT", "/v1/agent/service/register", {**TTL_SERVICE, "ID": f"w{i}"})
        await call(double, "PUT", f"/v1/agent/check/pass/service:w{i}")
        seen.append((await call(double, "GET", "/v1/health/service/web")).index)
        await call(double, "PUT", f"/v1/agent/service/deregister/w{i}")
        seen.append((await call(double, "GET", "/v1/health/service/web")).index)
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
