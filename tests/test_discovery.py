"""Consul discovery: units on a fake clock against the in-memory double, then real node processes."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from helpers.consulproc import ConsulDoubleProcess
from helpers.nodes import NodeProcess, start_all
from helpers.polling import until, wait_until
from helpers.wampclient import connect, leave, publish_acked, subscribe
from twisted.internet import defer

from pubsubclub.discovery.consul import ConsulDiscovery, Registration
from pubsubclub.federation.retry import RetryPolicy
from pubsubclub.testing import MemoryConsul

SERVICE = "pubsubclub"
OWN_URL = "ws://127.0.0.1:9001/psc"


class FakeFederation:
    """Records what discovery asks of the federation."""

    def __init__(self) -> None:
        self.servers: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def add_server(self, url: str) -> None:
        self.calls.append(("add", url))
        self.servers.add(url)

    def remove_server(self, url: str) -> None:
        self.calls.append(("remove", url))
        self.servers.discard(url)


def add_instance(consul: MemoryConsul, sid: str, port: int, status: str = "passing") -> str:
    """Register another node in the double; returns its PSC URL."""
    consul.double.register(
        {
            "ID": sid,
            "Name": SERVICE,
            "Address": "127.0.0.1",
            "Port": port,
            "Meta": {"node_id": sid, "psc_path": "/psc", "scheme": "ws"},
            "Check": {"TTL": "1h"},
        }
    )
    consul.double.update_ttl(f"service:{sid}", status)
    return f"ws://127.0.0.1:{port}/psc"


def health_requests(consul: MemoryConsul) -> list[float]:
    """Arrival times of the watch's queries."""
    return [r.at for r in consul.double.requests if r.path == f"/v1/health/service/{SERVICE}"]


@pytest.fixture
def consul() -> MemoryConsul:
    """The double in memory on a task.Clock."""
    return MemoryConsul()


@pytest.fixture
def make_discovery(consul: MemoryConsul) -> Iterator[Any]:
    """Build a started discovery; at the end it is stopped and no timer may be left on the clock."""
    made: list[ConsulDiscovery] = []

    def make(advertise: str | None = OWN_URL, **options: Any) -> tuple[ConsulDiscovery, FakeFederation]:
        federation = FakeFederation()
        settings: dict[str, Any] = dict(
            node_id="n1",
            advertise_url=advertise,
            ttl=3.0,
            debounce=0.5,
            watch_wait=10.0,
            backoff=RetryPolicy(initial=1.0, factor=2.0, max_delay=4.0, jitter=0.0),
            reactor=consul.clock,
            client=consul.client(),
        )
        settings.update(options)
        discovery = ConsulDiscovery(federation, **settings)
        made.append(discovery)
        discovery.start()
        return discovery, federation

    yield make
    for discovery in made:
        stopped = defer.ensureDeferred(discovery.stop())
        consul.advance(1)
        assert stopped.called
    consul.double.shutdown()
    assert consul.clock.getDelayedCalls() == []


def test_registers_with_meta_and_keeps_the_ttl_check_passing(consul: MemoryConsul, make_discovery: Any) -> None:
    """The node registers id, address, port and PSC meta, and heartbeats every ttl/3 so the check stays passing."""
    discovery, _ = make_discovery()
    consul.advance(0.1)
    service = consul.double.services["n1"]
    assert (service.name, service.address, service.port) == (SERVICE, "127.0.0.1", 9001)
    assert service.meta == {"node_id": "n1", "psc_versions": "0.1,0.2", "psc_path": "/psc", "scheme": "ws"}
    consul.advance(20)
    assert consul.double.checks["service:n1"].status == "passing"
    passes = [r.at for r in consul.double.requests if r.path == "/v1/agent/check/pass/service:n1"]
    assert len(passes) >= 20 and all(b - a == pytest.approx(1.0, abs=0.06) for a, b in pairwise(passes))
    assert discovery.registration is Registration.REGISTERED


def test_http_check_definition_points_at_health() -> None:
    """With check="http" the agent is told to poll /health every ttl/3."""
    discovery = ConsulDiscovery(
        FakeFederation(),
        node_id="n1",
        advertise_url="wss://node1.example:9443/psc",
        check="http",
        health_url="http://10.0.0.1:8001/health",
        ttl=9.0,
        client=MemoryConsul().client(),
    )
    definition = discovery.definition()
    assert definition["Check"]["HTTP"] == "http://10.0.0.1:8001/health"
    assert definition["Check"]["Interval"] == "3s" and "TTL" not in definition["Check"]
    assert (definition["Address"], definition["Port"], definition["Meta"]["scheme"]) == ("node1.example", 9443, "wss")


def test_others_are_linked_after_the_debounce_never_itself(consul: MemoryConsul, make_discovery: Any) -> None:
    """Two healthy instances become add_server calls after the quiet period; the node's own never does."""
    url2, url3 = add_instance(consul, "n2", 9002), add_instance(consul, "n3", 9003)
    add_instance(consul, "n4", 9004, status="critical")
    discovery, federation = make_discovery()
    consul.advance(0.4)
    assert federation.calls == []
    consul.advance(0.3)
    assert sorted(federation.calls) == [("add", url2), ("add", url3)]
    assert discovery.status()["members"] == [url2, url3]


def test_flapping_check_does_not_churn_links(consul: MemoryConsul, make_discovery: Any) -> None:
    """A check that fails and recovers within the debounce changes nothing; one that stays failed is dropped once."""
    url2 = add_instance(consul, "n2", 9002)
    _, federation = make_discovery()
    consul.advance(1)
    assert federation.calls == [("add", url2)]
    for _ in range(3):
        consul.double.update_ttl("service:n2", "critical")
        consul.advance(0.2)
        consul.double.update_ttl("service:n2", "passing")
        consul.advance(0.2)
    consul.advance(2)
    assert federation.calls == [("add", url2)]
    consul.double.update_ttl("service:n2", "critical")
    consul.advance(1)
    assert federation.calls == [("add", url2), ("remove", url2)]


def test_watch_errors_back_off_and_keep_membership(consul: MemoryConsul, make_discovery: Any) -> None:
    """500s make the watch retry after 1, 2, 4, 4 s (capped); links stay; recovery picks up changes."""
    url2 = add_instance(consul, "n2", 9002)
    discovery, federation = make_discovery()
    consul.advance(1)
    consul.double.fail("500")
    start = len(health_requests(consul))
    consul.advance(25)  # the blocking query times out at 10 s, then every retry fails
    times = health_requests(consul)[start:]
    gaps = [round(b - a, 1) for a, b in pairwise(times)]
    assert gaps[:5] == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert federation.calls == [("add", url2)] and discovery.errors >= 5
    consul.double.fail(None)
    consul.advance(4.1)
    url3 = add_instance(consul, "n3", 9003)
    consul.advance(1)
    assert federation.servers == {url2, url3}


def test_junk_and_dropped_connections_are_retried(consul: MemoryConsul, make_discovery: Any) -> None:
    """A junk body or a dropped connection is logged and retried; membership is kept meanwhile."""
    url2 = add_instance(consul, "n2", 9002)
    discovery, federation = make_discovery()
    consul.advance(1)
    consul.double.fail("junk", count=1)
    add_instance(consul, "n9", 9009, status="critical")  # wakes the watch without changing membership
    consul.advance(0.1)
    consul.double.fail("drop", count=2)
    consul.advance(10)
    assert "watch" in (discovery.last_error or "")
    assert federation.calls == [("add", url2)]
    consul.double.update_ttl("service:n9", "passing")
    consul.advance(1)
    assert federation.servers == {url2, "ws://127.0.0.1:9009/psc"}


def test_agent_down_at_start_then_up(consul: MemoryConsul, make_discovery: Any) -> None:
    """Registration is retried with backoff until the agent answers."""
    consul.double.fail("drop", count=4)
    discovery, _ = make_discovery()
    consul.advance(0.5)
    assert "n1" not in consul.double.services
    consul.advance(8)
    assert "n1" in consul.double.services and discovery.registration is Registration.REGISTERED


def test_agent_that_forgot_us_gets_a_new_registration(consul: MemoryConsul, make_discovery: Any) -> None:
    """After a restart without state the heartbeat is refused and the node registers again; the watch resets."""
    url2 = add_instance(consul, "n2", 9002)
    discovery, federation = make_discovery()
    consul.advance(1)
    index_before = discovery.index
    consul.double.forget()
    consul.advance(3)
    assert consul.double.checks["service:n1"].status == "passing"
    assert discovery.registration is Registration.REGISTERED
    assert discovery.index < index_before
    # n2 is gone from the agent too (nobody re-registered it): dropped after the debounce.
    assert federation.calls == [("add", url2), ("remove", url2)]


def test_watch_only_without_advertise_url(consul: MemoryConsul, make_discovery: Any) -> None:
    """A node without a PSC address to advertise registers nothing but still links to the others."""
    url2 = add_instance(consul, "n2", 9002)
    _, federation = make_discovery(advertise=None)
    consul.advance(1)
    assert federation.servers == {url2}
    assert "n1" not in consul.double.services


def test_token_and_datacenter_are_sent(consul: MemoryConsul, make_discovery: Any) -> None:
    """The ACL token goes with registration and heartbeats, the datacenter with the watch."""
    make_discovery(client=consul.client(token="s3cret", dc="dc1"))
    consul.advance(1)
    by_path = {r.path: dict(r.query) for r in consul.double.requests}
    assert by_path["/v1/agent/service/register"]["token"] == "s3cret"
    assert by_path[f"/v1/health/service/{SERVICE}"]["dc"] == "dc1"
    assert "n1" in consul.double.services


def test_stop_deregisters(consul: MemoryConsul, make_discovery: Any) -> None:
    """stop() deregisters the service and cancels the watch and heartbeat."""
    discovery, _ = make_discovery()
    consul.advance(1)
    stopped = defer.ensureDeferred(discovery.stop())
    consul.advance(0.1)
    assert stopped.called and "n1" not in consul.double.services
    assert discovery.registration is Registration.LEFT


# -- real node processes -----------------------------------------------------

TOPIC = "com.example.discovery"
CONSUL_FLAGS = ("--consul-ttl", "1.5", "--consul-debounce", "0.2")


class ConsulCluster:
    """Node processes that find each other through one Consul double process."""

    def __init__(self, tmp_path: Path, consul: ConsulDoubleProcess) -> None:
        self.tmp_path = tmp_path
        self.consul = consul
        self.nodes: dict[str, NodeProcess] = {}

    def start(self, name: str, *extra: str) -> NodeProcess:
        """Start a node with ``--consul`` and no ``--peer``."""
        return self.start_together([name], *extra)[0]

    def start_together(self, names: list[str], *extra: str) -> list[NodeProcess]:
        """:meth:`start` for several nodes at once (their start-ups overlap)."""
        nodes = [NodeProcess(name, self.tmp_path, extra=("--consul", self.consul.url, *CONSUL_FLAGS, *extra))
                 for name in names]  # fmt: skip
        for node in nodes:
            self.nodes[node.name] = node
        return start_all(nodes)

    def running(self) -> list[NodeProcess]:
        """Nodes whose process is alive."""
        return [n for n in self.nodes.values() if n.proc is not None and n.proc.poll() is None]

    def wait_meshed(self, timeout: float = 15.0) -> None:
        """Until every running node dials exactly the other running nodes and all links are open."""
        nodes = self.running()

        def meshed() -> bool:
            for node in nodes:
                stats = node.stats()
                expected = sorted(other.psc_url for other in nodes if other is not node)
                if sorted(stats["servers"]) != expected:
                    return False
                if sum(1 for link in stats["links"] if link["state"] == "open") != 2 * (len(nodes) - 1):
                    return False
            return True

        wait_until(meshed, f"mesh of {[n.name for n in nodes]} through Consul", timeout)

    def stop_all(self) -> None:
        """Stop every node."""
        for node in self.nodes.values():
            node.stop()


@pytest.fixture
def consul_cluster(tmp_path: Path) -> Iterator[ConsulCluster]:
    """A Consul double process (state kept in a file across restarts) and nodes using it."""
    consul = ConsulDoubleProcess(tmp_path, state_file=tmp_path / "consul-state.json").start()
    cluster = ConsulCluster(tmp_path, consul)
    yield cluster
    cluster.stop_all()
    consul.stop()


async def assert_traffic_flows(cluster: ConsulCluster) -> None:
    """A publish on the first running node reaches a subscriber on every other running node."""
    nodes = cluster.running()
    subscribers = [await connect(node.wamp_url) for node in nodes[1:]]
    recorders = [(await subscribe(s, TOPIC))[0] for s in subscribers]
    others = sorted(n.name for n in nodes[1:])
    await until(lambda: sorted(nodes[0].stats()["remote_interest"].get(TOPIC, [])) == others, "interest")
    publisher = await connect(nodes[0].wamp_url)
    await publish_acked(publisher, TOPIC, {"from": nodes[0].name})
    for recorder in recorders:
        await recorder.wait_for(1)
        assert recorder.args == [{"from": nodes[0].name}]
    await leave(publisher, *subscribers)


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_nodes_join_and_leave_through_consul(consul_cluster: ConsulCluster) -> None:
    """Three nodes mesh via Consul; a fourth joins; a SIGTERM'd node and a kill -9'd node are dropped."""
    consul_cluster.start_together(["node1", "node2", "node3"])
    consul_cluster.wait_meshed()
    await assert_traffic_flows(consul_cluster)

    consul_cluster.start("node4")
    consul_cluster.wait_meshed(timeout=5.0)
    await assert_traffic_flows(consul_cluster)

    consul_cluster.nodes["node2"].stop()
    assert "node2" not in consul_cluster.consul.registered()  # deregistered on the way out
    consul_cluster.wait_meshed(timeout=5.0)
    await assert_traffic_flows(consul_cluster)

    consul_cluster.nodes["node3"].kill()
    await until(lambda: "node3" not in consul_cluster.consul.passing(), "node3's TTL to expire", 5.0)
    assert "node3" in consul_cluster.consul.registered()  # nobody deregistered it
    consul_cluster.wait_meshed(timeout=5.0)
    await assert_traffic_flows(consul_cluster)


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_links_survive_a_consul_restart_and_watching_resumes(consul_cluster: ConsulCluster) -> None:
    """The agent restarts mid-run: links stay up, and a node started afterwards is discovered by all."""
    consul_cluster.start_together(["node1", "node2"])
    consul_cluster.wait_meshed()
    opened = {name: node.stats()["federation"]["links_opened"] for name, node in consul_cluster.nodes.items()}

    consul_cluster.consul.stop()
    await until(
        lambda: all(n.stats()["discovery"]["errors"] > 0 for n in consul_cluster.running()), "nodes to notice", 5.0
    )
    consul_cluster.consul.start()
    await assert_traffic_flows(consul_cluster)

    consul_cluster.start("node3")
    consul_cluster.wait_meshed(timeout=10.0)
    await assert_traffic_flows(consul_cluster)
    for name in ("node1", "node2"):
        # Two new links each (to and from node3); none of the old ones was re-opened.
        assert consul_cluster.nodes[name].stats()["federation"]["links_opened"] == opened[name] + 2


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_http_check_mode(consul_cluster: ConsulCluster) -> None:
    """With --consul-check http the agent polls /health; the nodes mesh and a stopped node is dropped."""
    consul_cluster.start_together(["node1", "node2", "node3"], "--consul-check", "http")
    consul_cluster.wait_meshed()
    checks = consul_cluster.consul.get("/v1/agent/checks")
    assert checks["service:node1"]["Type"] == "http" and checks["service:node1"]["Status"] == "passing"
    consul_cluster.nodes["node3"].stop()
    consul_cluster.wait_meshed(timeout=5.0)
    await assert_traffic_flows(consul_cluster)


def test_consul_settings_are_validated_and_read_from_toml(tmp_path: Path) -> None:
    """An HTTP check without --http, a bad TTL or debounce names the key; TOML numbers are read as seconds."""
    from pubsubclub.config import ConfigError, build, load_toml

    consul = {"consul": "http://127.0.0.1:8500"}
    for flags, key in (
        ({"consul_check": "http"}, "consul-check"),
        ({"consul_check": "script"}, "consul-check"),
        ({"consul_ttl": 0.0}, "consul-ttl"),
        ({"consul_debounce": -1.0}, "consul-debounce"),
    ):
        with pytest.raises(ConfigError) as info:
            build({}, {**consul, **flags})
        assert info.value.key == key
    path = tmp_path / "node.toml"
    path.write_text('consul = "http://127.0.0.1:8500"\nconsul-ttl = 5\nconsul-check = "http"\nhttp = "tcp:8001"\n')
    config = build(load_toml(str(path)), {})
    assert (config.consul.ttl, config.consul.check, config.consul.debounce) == (5.0, "http", 0.5)


def test_node_with_a_frozen_agent_stops_within_its_shutdown_timeout(consul_cluster: ConsulCluster) -> None:
    """SIGSTOP'd agent: deregistration would wait its own 3 s bound; ``--shutdown-timeout 0.5`` ends the stop first.

    The node exits 0 and its log names the step still running, so an operator
    sees why the stop was cut short.
    """
    node = consul_cluster.start("node1", "--shutdown-timeout", "0.5")
    agent = consul_cluster.consul.proc
    assert agent is not None
    agent.send_signal(signal.SIGSTOP)
    try:
        assert node.stop() == 0
    finally:
        agent.send_signal(signal.SIGCONT)
    log = node.log_path.read_text()
    cut = log.index("graceful stop unfinished after 0.5 s (step: leaving discovery); exiting anyway")
    # The deregistration gave up only when the exiting reactor dropped its connection, not at its 3 s bound.
    assert "no answer within" not in log[:cut]
    # (The fixture's teardown fails the test on any traceback in the log: a watch cancelled while its
    # request was still connecting used to be logged as a critical "discovery task failed".)


def test_consul_retry_and_watch_settings_reach_the_discovery(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """[consul] retry-initial, -factor, -max, -jitter, watch-wait and deregister-after reach the discovery."""
    import argparse

    from twisted.internet.testing import MemoryReactorClock

    import pubsubclub.discovery.consul as consul_module
    from pubsubclub.config.load import add_node_flags, node_config
    from pubsubclub.federation.retry import RetryPolicy
    from pubsubclub.node.node import Node

    made: list[dict[str, Any]] = []

    class Recorder:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(kwargs)

        def start(self) -> None:
            pass

        def stop(self) -> None:
            pass

    monkeypatch.setattr(consul_module, "ConsulDiscovery", Recorder)
    parser = argparse.ArgumentParser()
    add_node_flags(parser)
    flags = ["--consul", "http://127.0.0.1:8500", "--data-dir", str(tmp_path)]
    flags += ["--consul-retry-initial", "0.25", "--consul-retry-factor", "3", "--consul-retry-max", "40"]
    flags += ["--consul-retry-jitter", "0.5", "--consul-watch-wait", "30", "--consul-deregister-after", "120"]
    node = Node(node_config(parser.parse_args(flags)), MemoryReactorClock())
    node._start_discovery()
    (kwargs,) = made
    assert kwargs["backoff"] == RetryPolicy(initial=0.25, factor=3.0, max_delay=40.0, jitter=0.5)
    assert (kwargs["watch_wait"], kwargs["deregister_after"]) == (30.0, 120.0)
    # The defaults are the values the discovery had before they were settings.
    defaults = node_config(parser.parse_args(["--consul", "http://127.0.0.1:8500"])).consul
    assert RetryPolicy(defaults.retry_initial, defaults.retry_factor, defaults.retry_max, defaults.retry_jitter) == (
        RetryPolicy(initial=0.5, factor=2.0, max_delay=15.0, jitter=0.2)
    )
    assert (defaults.watch_wait, defaults.deregister_after) == (60.0, 600.0)
    for flag, bad in (("retry_factor", 0.5), ("retry_jitter", 1.0), ("deregister_after", 30.0), ("watch_wait", 700.0)):
        from pubsubclub.config import ConfigError, build

        with pytest.raises(ConfigError) as info:
            build({}, {"consul": "http://127.0.0.1:8500", f"consul_{flag}": bad})
        assert info.value.key == "consul-" + flag.replace("_", "-")
