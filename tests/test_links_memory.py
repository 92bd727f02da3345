"""PSC links between Federations, with real Autobahn protocols over in-memory transports.

Every node runs on one ``MemoryReactorClock`` of a
:class:`pubsubclub.testing.MemoryNetwork`: its ``connectTCP`` calls are
recorded, and the network answers each with the server factory of the node
listening on the dialled port, joined by ``iosim`` transports. Time moves only
when a test advances the clock, so pings, timeouts and retries are exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.python.failure import Failure

from pubsubclub.core.patterns import Pattern
from pubsubclub.federation import Federation, Role, psc
from pubsubclub.federation.auth import Refusal
from pubsubclub.federation.replay import ReplaySettings
from pubsubclub.federation.session import (
    CLOSE_BAD_MESSAGE,
    CLOSE_DUPLICATE,
    CLOSE_NO_COMMON_VERSION,
    CLOSE_REMOVED,
    CLOSE_SELF,
    CLOSE_UNAUTHENTICATED,
)
from pubsubclub.testing import MemoryLink, MemoryNetwork, RecordingSink, RecordingWire, no_logged_errors, psc_url

PING = MemoryNetwork.ping_interval
RETRY = MemoryNetwork.retry

OPCODE_PING = 9

# The tests' short names for pubsubclub.testing's public doubles.
MemoryNetwork = MemoryNetwork
MemoryLink = MemoryLink
RecordingSink = RecordingSink
RecordingWire = RecordingWire
url = psc_url


@pytest.fixture
def net() -> Iterator[MemoryNetwork]:
    """An empty in-memory network; the test fails if anything logged an error or touched the real reactor."""
    from twisted.internet import reactor as global_reactor

    before = set(global_reactor.getDelayedCalls())
    with no_logged_errors():
        yield MemoryNetwork()
    assert set(global_reactor.getDelayedCalls()) <= before


def _link(net: MemoryNetwork, dialler: Federation, port: int) -> MemoryLink:
    dialler.add_server(psc_url(port))
    [link] = net.answer()
    return link


# -- handshake ------------------------------------------------------------


def test_producer_listens_dialler_sends_hello_first(net: MemoryNetwork) -> None:
    """When producers listen, the dialling consumer sends PSC101 and the producer answers PSC102 0.2."""
    a = net.node("a", 9001)
    b = net.node("b", 9002)
    link = _link(net, a, 9002)
    assert link.client_wire.messages()[0] == psc.Hello(((0, 1), (0, 2)))
    assert link.server_wire.messages() == [psc.ChooseVersion((0, 2))]
    assert [(r["role"], r["state"], r["version"], r["peer_node"]) for r in a.links()] == [
        ("consumer", "open", "0.2", "b")
    ]
    assert [(r["role"], r["state"], r["version"], r["peer_node"]) for r in b.links()] == [
        ("producer", "open", "0.2", "a")
    ]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_consumer_listens_listener_sends_hello_first(net: MemoryNetwork) -> None:
    """When consumers listen, the listening consumer sends PSC101 although it did not dial."""
    a = net.node("a", 9001, listen_role=Role.CONSUMER)
    b = net.node("b", 9002, listen_role=Role.CONSUMER)
    link = _link(net, a, 9002)
    assert link.server_wire.messages() == [psc.Hello(((0, 1), (0, 2)))]
    assert link.client_wire.messages() == [psc.ChooseVersion((0, 2))]
    assert [(r["role"], r["state"], r["version"]) for r in a.links()] == [("producer", "open", "0.2")]
    assert [(r["role"], r["state"], r["version"]) for r in b.links()] == [("consumer", "open", "0.2")]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


@pytest.mark.parametrize("old_side", ["dialler", "listener"])
def test_version_0_1_chosen_when_one_side_only_speaks_it(net: MemoryNetwork, old_side: str) -> None:
    """PSC102 carries 0.1 when one side speaks only 0.1, and PSC301 then has no metadata."""
    old = {"versions": ((0, 1),)}
    a = net.node("a", 9001, **(old if old_side == "dialler" else {}))
    b = net.node("b", 9002, **(old if old_side == "listener" else {}))
    sink = RecordingSink()
    a.hub.subscribe("t", sink)
    link = _link(net, a, 9002)
    assert psc.ChooseVersion((0, 1)) in link.server_wire.messages()
    assert {r["version"] for r in a.links() + b.links()} == {"0.1"}
    b.hub.publish(b.hub.envelope("t", [1, 2]))
    net.flush()
    assert link.server_wire.messages()[-1] == psc.Publish("t", [1, 2])
    assert [(e.topic, e.payload, e.origin) for e in sink.got] == [("t", [1, 2], "b")]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_no_common_version_closes_4406_and_backs_off(net: MemoryNetwork) -> None:
    """With no common version the producer closes 4406 naming the versions; the consumer backs off."""
    a = net.node("a", 9001, versions=((0, 1),))
    b = net.node("b", 9002, versions=((0, 2),))
    link = _link(net, a, 9002)
    code, reason = link.server_wire.close()
    assert code == CLOSE_NO_COMMON_VERSION
    assert "0.1" in reason and "0.2" in reason
    assert link.client.remoteCloseCode == CLOSE_NO_COMMON_VERSION
    assert a.open_links() == b.open_links() == 0
    assert a.links() == [
        {
            "peer": psc_url(9002),
            "peer_node": None,
            "role": "consumer",
            "state": "connecting",
            "version": None,
            "direction": "out",
            "topics": 0,
            "patterns": 0,
        }
    ]
    # A failed handshake is a failed attempt: the delays grow 1 s, 2 s, 4 s.
    for delay in (1.0, 2.0, 4.0):
        net.advance(delay - 0.01)
        assert net.dials() == len(net.links)
        net.advance(0.01)
        assert net.dials() == len(net.links) + 1
        [link] = net.answer()
        assert link.server_wire.close()[0] == CLOSE_NO_COMMON_VERSION
    net.stop()
    assert net.reactor.getDelayedCalls() == []


# -- interest -------------------------------------------------------------


def test_consumer_sends_whole_interest_in_one_subscribe(net: MemoryNetwork) -> None:
    """After the handshake the consumer sends every hub topic in one PSC201."""
    a = net.node("a", 9001)
    net.node("b", 9002)
    sink = RecordingSink()
    for topic in ("t1", "t2", "t3"):
        a.hub.subscribe(topic, sink)
    link = _link(net, a, 9002)
    assert link.client_wire.messages() == [psc.Hello(((0, 1), (0, 2))), psc.Subscribe(("t1", "t2", "t3"))]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_consumer_without_topics_sends_nothing_after_handshake(net: MemoryNetwork) -> None:
    """A consumer with no local subscribers sends no PSC201."""
    a = net.node("a", 9001)
    net.node("b", 9002)
    link = _link(net, a, 9002)
    assert link.client_wire.messages() == [psc.Hello(((0, 1), (0, 2)))]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_first_subscriber_subscribes_last_one_unsubscribes(net: MemoryNetwork) -> None:
    """The first local subscriber of a topic sends PSC201, the last one leaving sends PSC202, others nothing."""
    a = net.node("a", 9001)
    b = net.node("b", 9002)
    link = _link(net, a, 9002)
    one, two = RecordingSink(), RecordingSink()
    a.hub.subscribe("t", one)
    a.hub.subscribe("t", two)
    net.flush()
    a.hub.unsubscribe("t", one)
    net.flush()
    assert link.client_wire.messages()[1:] == [psc.Subscribe(("t",))]
    assert [r["topics"] for r in b.links()] == [1]
    a.hub.unsubscribe("t", two)
    net.flush()
    assert link.client_wire.messages()[1:] == [psc.Subscribe(("t",)), psc.Unsubscribe("t")]
    assert [r["topics"] for r in b.links()] == [0]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_interest_resent_after_reconnect(net: MemoryNetwork) -> None:
    """After a dropped link the consumer redials after the retry delay and sends all its topics again."""
    a = net.node("a", 9001)
    b = net.node("b", 9002)
    sink = RecordingSink()
    a.hub.subscribe("t1", sink)
    first = _link(net, a, 9002)
    first.server_wire.loseConnection()
    net.flush()
    assert a.open_links() == b.open_links() == 0
    a.hub.subscribe("t2", sink)  # while the link is down
    net.advance(RETRY.initial - 0.01)
    assert net.dials() == 1
    net.advance(0.01)
    [second] = net.answer()
    assert second.client_wire.messages() == [psc.Hello(((0, 1), (0, 2))), psc.Subscribe(("t1", "t2"))]
    b.hub.publish(b.hub.envelope("t2", "hi"))
    net.flush()
    assert [e.payload for e in sink.got] == ["hi"]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_clean_close_by_a_configured_server_is_retried(net: MemoryNetwork) -> None:
    """A server that closes the link cleanly (1000) is redialled about a second later, while still configured."""
    a = net.node("a", 9001)
    b = net.node("b", 9002)
    first = _link(net, a, 9002)
    first.server.sendClose(1000, "going away for a bit")
    net.flush()
    assert a.open_links() == 0
    net.advance(RETRY.initial - 0.01)
    assert net.dials() == 1
    net.advance(0.01)
    [second] = net.answer()
    assert a.open_links() == 1 and b.open_links() == 1
    net.stop()
    assert net.reactor.getDelayedCalls() == []


# -- publishing -----------------------------------------------------------


def test_publish_reaches_each_node_once_and_is_not_reforwarded(net: MemoryNetwork) -> None:
    """In a full mesh of three nodes a publish reaches every node's sink once; receivers forward nothing."""
    nodes = {name: net.node(name, port) for name, port in (("a", 9001), ("b", 9002), ("c", 9003))}
    ports = {"a": 9001, "b": 9002, "c": 9003}
    sinks = {name: RecordingSink() for name in nodes}
    for name, federation in nodes.items():
        federation.hub.subscribe("t", sinks[name])
        for other in nodes:
            if other != name:
                federation.add_server(psc_url(ports[other]))
    net.answer()
    assert [f.open_links() for f in nodes.values()] == [4, 4, 4]
    a = nodes["a"]
    envelope = a.hub.envelope("t", {"n": None, "deep": [{"x": 1.5}]})
    a.hub.publish(envelope)
    net.flush()
    for name in nodes:
        assert [(e.payload, e.origin, e.message_id) for e in sinks[name].got] == [
            ({"n": None, "deep": [{"x": 1.5}]}, "a", envelope.message_id)
        ]
    assert [f.stats["forwarded"] for f in nodes.values()] == [2, 0, 0]
    assert [f.stats["received"] for f in nodes.values()] == [0, 1, 1]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_publish_without_interest_is_not_sent(net: MemoryNetwork) -> None:
    """A publish on a topic no consumer asked for does not cross the link."""
    net.node("a", 9001)
    b = net.node("b", 9002)
    link = _link(net, net.nodes[0], 9002)
    b.hub.publish(b.hub.envelope("nobody", 1))
    net.flush()
    assert link.server_wire.messages() == [psc.ChooseVersion((0, 2))]
    assert b.stats["forwarded"] == 0
    net.stop()
    assert net.reactor.getDelayedCalls() == []


# -- liveness -------------------------------------------------------------


def test_pongs_keep_the_link_up(net: MemoryNetwork) -> None:
    """The client pings every interval; a server that answers keeps the link up."""
    a = net.node("a", 9001)
    net.node("b", 9002)
    link = _link(net, a, 9002)
    for _ in range(10):
        net.advance(PING)
    pings = [f for f in link.client_wire.frames() if f[0] == OPCODE_PING]
    assert len(pings) == 10
    assert a.open_links() == 1 and net.dials() == 1
    net.stop()
    assert net.reactor.getDelayedCalls() == []


@pytest.mark.parametrize("rand", [0.0, 0.5, 0.999])
def test_ping_timeout_reconnects_within_jitter(net: MemoryNetwork, rand: float) -> None:
    """A server that never pongs is dropped after interval + timeout, and redialled within the jitter bounds."""
    draws: list[float] = []

    def recorded_rand() -> float:
        draws.append(rand)
        return rand

    a = net.node("a", 9001, rand=recorded_rand)
    net.node("b", 9002)
    link = _link(net, a, 9002)
    link.server_wire.muted = True
    net.advance(PING)
    assert [f[0] for f in link.client_wire.frames()].count(OPCODE_PING) == 1
    net.advance(PING - 0.01)
    assert a.open_links() == 1
    net.advance(0.01)
    assert a.open_links() == 0
    assert link.client_wire.disconnected
    drop = net.reactor.seconds()
    low, high = RETRY.initial * (1 - RETRY.jitter), RETRY.initial * (1 + RETRY.jitter)
    redial = None
    while net.reactor.seconds() < drop + high + 0.1:
        net.advance(0.01)
        if net.dials() == 2:
            redial = net.reactor.seconds() - drop
            break
    assert redial is not None and low - 0.01 <= redial <= high + 0.01
    assert draws == [rand]
    assert redial == pytest.approx(RETRY.delay(1, lambda: rand), abs=0.011)
    net.answer()
    assert a.open_links() == 1
    net.stop()
    assert net.reactor.getDelayedCalls() == []


# -- discovery ------------------------------------------------------------


def test_remove_server_closes_4410_and_stops_retrying(net: MemoryNetwork) -> None:
    """remove_server closes the link with 4410 and no dial follows, however long we wait."""
    a = net.node("a", 9001)
    b = net.node("b", 9002)
    link = _link(net, a, 9002)
    a.remove_server(psc_url(9002))
    net.flush()
    code, reason = link.client_wire.close()
    assert code == CLOSE_REMOVED and "removed" in reason
    assert link.server.remoteCloseCode == CLOSE_REMOVED
    assert a.servers() == [] and a.links() == [] and b.links() == []
    for _ in range(100):
        net.advance(10)
    assert net.dials() == 1
    assert net.reactor.getDelayedCalls() == []
    net.stop()
    assert net.reactor.getDelayedCalls() == []


@pytest.mark.parametrize("when", ["dialling", "waiting to retry"])
def test_remove_server_without_a_link_stops_retrying(net: MemoryNetwork, when: str) -> None:
    """remove_server while dialling or while waiting to retry leaves nothing scheduled."""
    a = net.node("a", 9001)
    net.node("b", 9002)
    a.add_server(psc_url(9002))
    if when == "waiting to retry":
        [link] = net.answer()
        link.server_wire.loseConnection()
        net.flush()
        assert len(net.reactor.getDelayedCalls()) == 1
    a.remove_server(psc_url(9002))
    net.flush()
    for _ in range(100):
        net.advance(10)
    assert net.dials() == 1
    assert a.servers() == []
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_add_own_advertise_url_does_nothing(net: MemoryNetwork) -> None:
    """add_server with the node's own advertised URL does not dial."""
    a = net.node("a", 9001)
    a.add_server(psc_url(9001))
    assert a.servers() == [] and net.dials() == 0
    net.stop()
    assert net.reactor.getDelayedCalls() == []


@pytest.mark.parametrize("server", ["same federation", "other federation, same id"])
def test_server_with_our_node_id_is_dropped(net: MemoryNetwork, server: str) -> None:
    """A server answering with our own node id makes us close with 4508 and forget its URL for good."""
    a = net.node("a", 9001)
    if server == "same federation":
        net.listeners[9100] = net.listeners[9001]  # another address of this very node
    else:
        net.node("a", 9100)
    a.add_server(psc_url(9100))
    [link] = net.answer()
    assert link.client_wire.close()[0] == CLOSE_SELF
    assert all(f.links() == [] for f in net.nodes)
    assert a.servers() == []
    for _ in range(100):
        net.advance(10)
    assert net.dials() == 1
    net.stop()
    assert net.reactor.getDelayedCalls() == []


# -- junk -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("sender", "payload", "binary", "reason"),
    [
        ("consumer", b"not json", False, "not JSON"),
        ("producer", b'[201,"t"]', False, "unexpected Subscribe from a producer"),
        ("consumer", b'[201,"t"]', True, "binary frames"),
        ("consumer", b'[301,"t",1]', False, "unexpected Publish from a consumer"),
    ],
)
def test_junk_closes_only_that_link(net: MemoryNetwork, sender: str, payload: bytes, binary: bool, reason: str) -> None:
    """Junk from a peer closes that link with 4400 and a reason; the node's other link keeps working."""
    a = net.node("a", 9001)
    b = net.node("b", 9002)
    c = net.node("c", 9003)
    sinks = {"a": RecordingSink(), "c": RecordingSink()}
    a.hub.subscribe("t", sinks["a"])
    c.hub.subscribe("t", sinks["c"])
    a.add_server(psc_url(9002))
    c.add_server(psc_url(9002))
    bad, good = net.answer()
    assert b.open_links() == 2
    speaker, hearer = (bad.client, bad.server_wire) if sender == "consumer" else (bad.server, bad.client_wire)
    speaker.sendMessage(payload, isBinary=binary)
    net.flush()
    code, text = hearer.close()
    assert code == CLOSE_BAD_MESSAGE
    assert reason in text
    assert a.open_links() == 0 and b.open_links() == 1 and c.open_links() == 1
    b.hub.publish(b.hub.envelope("t", "still here"))
    net.flush()
    assert [e.payload for e in sinks["c"].got] == ["still here"]
    assert sinks["a"].got == []
    assert good.server_wire.close() is None
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_remove_server_with_silent_peer_leaves_no_timers(net: MemoryNetwork) -> None:
    """remove_server when the peer never answers the close leaves no close-handshake timer behind."""
    a = net.node("a", 9001)
    net.node("b", 9002)
    link = _link(net, a, 9002)
    link.server_wire.muted = True
    a.remove_server(psc_url(9002))
    net.flush()
    assert link.client_wire.close()[0] == CLOSE_REMOVED
    assert link.client_wire.disconnected and link.server_wire.disconnected
    assert net.reactor.getDelayedCalls() == []
    net.stop()


# -- link authentication ----------------------------------------------------

SECRET = b"cluster secret for tests, 32 b.."


def _headers(wire: RecordingWire) -> dict[str, str]:
    """The HTTP handshake headers a wire wrote (lower-case names), and its status line under ``""``."""
    head = bytes(wire.written).split(b"\r\n\r\n", 1)[0].decode()
    status, *lines = head.split("\r\n")
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    return {"": status, **headers}


def test_same_secret_links_with_proofs_both_ways(net: MemoryNetwork) -> None:
    """With one secret: offer, answer, proof frame first; the link opens and no secret crosses.

    The listener's answer tells an unproven dialler nothing but its node id:
    not whom it dials (peer learning), which only cluster members may learn.
    """
    a = net.node("a", 9001, secret=SECRET, learn_peers=True)
    b = net.node("b", 9002, secret=SECRET, learn_peers=True)
    net.node("c", 9003, secret=SECRET)
    b.add_server(psc_url(9003))
    net.answer()
    a.add_server(psc_url(9002))
    # The first, then the dials back that learning brings.
    [link] = [ln for ln in net.answer() if _headers(ln.client_wire)["x-pubsubclub-node"] == "a"]
    request, answer = _headers(link.client_wire), _headers(link.server_wire)
    assert "x-pubsubclub-peers" in request and "x-pubsubclub-peers" not in answer
    assert request["x-pubsubclub-auth"].startswith("v3:")
    assert request["x-pubsubclub-dialled"] == psc_url(9002)
    assert answer[""].startswith("HTTP/1.1 101") and answer["x-pubsubclub-auth"].startswith("v3:")
    assert answer["x-pubsubclub-auth"].split(":")[2] == "direct"
    # The proof is the only text frame; every PSC frame after it, both ways, is sealed (binary, no plaintext).
    assert [payload[:12] for payload in link.client_wire.texts()] == [b"PSC-AUTH v3:"]
    assert link.server_wire.texts() == []
    for wire in (link.client_wire, link.server_wire):
        sealed = [payload for opcode, payload in wire.frames() if opcode == 2]
        assert sealed and not any(b"[10" in payload for payload in sealed)
    assert SECRET not in bytes(link.client_wire.written) + bytes(link.server_wire.written)
    assert a.links()[0]["direct"] is True
    assert a.open_links() == 1
    assert b.auth is not None and b.auth.pending() == 0
    net.stop()
    assert net.reactor.getDelayedCalls() == []


@pytest.mark.parametrize("reason", ["no offer", "v1 proof", "v2 offer"])
def test_missing_or_old_offer_refused_at_handshake(net: MemoryNetwork, reason: str) -> None:
    """No offer gets HTTP 401, a v1 proof or a v2 (unsealed) offer 403; no session starts, the dialler backs off."""
    a = net.node("a", 9001, secret=None if reason == "no offer" else SECRET)
    b = net.node("b", 9002, secret=SECRET)
    if reason != "no offer":
        old = _V1Offer() if reason == "v1 proof" else _V2Offer()
        a.auth.offer = lambda node, url: old  # type: ignore[union-attr,method-assign,assignment,return-value]
    status = 401 if reason == "no offer" else 403
    link = _link(net, a, 9002)
    assert _headers(link.server_wire)[""].startswith(f"HTTP/1.1 {status} ")
    assert link.client.session is None and link.server.session is None
    assert b.links() == [] and a.open_links() == 0
    assert b.stats["auth_refused"] == 1 and b.stats["received"] == 0
    net.advance(RETRY.initial)
    [again] = net.answer()
    assert _headers(again.server_wire)[""].startswith(f"HTTP/1.1 {status} ")
    net.stop()
    assert net.reactor.getDelayedCalls() == []


class _V1Offer:
    """What a node from before challenge-response sent."""

    def header(self) -> str:
        return "v1:1700000000:" + "0" * 32 + ":" + "0" * 64


class _V2Offer:
    """What a node from before sealed links sent."""

    def header(self) -> str:
        return "v2:" + "0" * 32


def test_wrong_secret_dialler_sends_no_proof(net: MemoryNetwork) -> None:
    """A dialler with another secret finds the answer wrong, closes 4401 and never proves (nothing to harvest)."""
    a = net.node("a", 9001, secret=b"another secret, 32 bytes long...")
    b = net.node("b", 9002, secret=SECRET)
    link = _link(net, a, 9002)
    assert link.client_wire.close() == (CLOSE_UNAUTHENTICATED, "listener did not prove the cluster secret")
    assert link.client_wire.texts() == []
    assert link.client.session is None and link.server.session is None
    assert a.stats["auth_refused"] == 1 and b.stats["received"] == 0
    assert b.auth is not None and b.auth.pending() == 0
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_every_attempt_gets_a_fresh_offer(net: MemoryNetwork) -> None:
    """A redial after a dropped link offers a new nonce and proves again."""
    a = net.node("a", 9001, secret=SECRET)
    b = net.node("b", 9002, secret=SECRET)
    first = _link(net, a, 9002)
    first.server_wire.loseConnection()
    net.flush()
    net.advance(RETRY.initial)
    [second] = net.answer()
    assert _headers(first.client_wire)["x-pubsubclub-auth"] != _headers(second.client_wire)["x-pubsubclub-auth"]
    assert a.open_links() == b.open_links() == 1
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def _raw_connection(net: MemoryNetwork, port: int) -> tuple[Any, RecordingWire]:
    """A bare connection to the listener on ``port``, fed bytes by the test."""
    server = net.listeners[port].buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
    wire = RecordingWire(server, True, IPv4Address("TCP", "127.0.0.1", port), IPv4Address("TCP", "127.0.0.1", 50000))
    server.makeConnection(wire)
    return server, wire


def _client_frames(wire: RecordingWire) -> bytes:
    """What a client wrote after its handshake (its masked WebSocket frames)."""
    return bytes(wire.written).split(b"\r\n\r\n", 1)[1]


def test_replayed_exchange_refused(net: MemoryNetwork) -> None:
    """The dialler's bytes of an accepted link (handshake and proof frame) sent again: closed 4401, no session."""
    a = net.node("a", 9001, secret=SECRET)
    b = net.node("b", 9002, secret=SECRET)
    first = _link(net, a, 9002)
    handshake, _, _ = bytes(first.client_wire.written).partition(b"\r\n\r\n")
    server, wire = _raw_connection(net, 9002)
    server.dataReceived(handshake + b"\r\n\r\n")
    assert _headers(wire)[""].startswith("HTTP/1.1 101")
    server.dataReceived(_client_frames(first.client_wire))
    assert wire.close() == (CLOSE_UNAUTHENTICATED, "wrong cluster secret proof")
    assert server.session is None and b.open_links() == 1 and b.stats["auth_refused"] == 1
    server.connectionLost(Failure(ConnectionDone()))
    assert b.auth is not None and b.auth.pending() == 0
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_proof_for_another_node_refused(net: MemoryNetwork) -> None:
    """a's handshake and proof made for b, replayed to c (Host rewritten to c's): closed 4401, no session on c."""
    a = net.node("a", 9001, secret=SECRET)
    net.node("b", 9002, secret=SECRET)
    c = net.node("c", 9003, secret=SECRET)
    to_b = _link(net, a, 9002)
    handshake, _, _ = bytes(to_b.client_wire.written).partition(b"\r\n\r\n")
    server, wire = _raw_connection(net, 9003)
    server.dataReceived(handshake.replace(b":9002", b":9003") + b"\r\n\r\n")
    assert _headers(wire)[""].startswith("HTTP/1.1 101")
    server.dataReceived(_client_frames(to_b.client_wire))
    assert wire.close() == (CLOSE_UNAUTHENTICATED, "wrong cluster secret proof")
    assert server.session is None and c.links() == [] and c.stats["auth_refused"] == 1
    server.connectionLost(Failure(ConnectionDone()))
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_unproven_connection_closed_after_the_timeout(net: MemoryNetwork) -> None:
    """A connection that passes the handshake but never sends its proof is closed 4401 after proof_timeout."""
    a = net.node("a", 9001, secret=SECRET)
    b = net.node("b", 9002, secret=SECRET)
    handshake, _, _ = bytes(_link(net, a, 9002).client_wire.written).partition(b"\r\n\r\n")
    server, wire = _raw_connection(net, 9002)
    server.dataReceived(handshake + b"\r\n\r\n")
    assert b.auth is not None and b.auth.pending() == 1
    net.advance(b.auth.proof_timeout - 0.5)
    assert wire.close() is None
    net.advance(1)
    assert wire.close() == (CLOSE_UNAUTHENTICATED, "no cluster secret proof in time")
    assert b.auth.pending() == 0 and server.session is None
    server.connectionLost(Failure(ConnectionDone()))
    net.stop()
    assert net.reactor.getDelayedCalls() == []


@pytest.mark.parametrize("listener_secret", [None, b"another secret, 32 bytes long..."])
def test_listener_that_cannot_prove_the_secret_is_dropped(net: MemoryNetwork, listener_secret: bytes | None) -> None:
    """A listener that lets us in without proving the secret is closed with 4401 before any message."""
    a = net.node("a", 9001, secret=SECRET)
    b = net.node("b", 9002, secret=listener_secret)
    link = _link(net, a, 9002)
    assert link.client_wire.close() == (CLOSE_UNAUTHENTICATED, "listener did not prove the cluster secret")
    assert link.client.session is None
    assert link.client_wire.texts() == []
    assert a.open_links() == b.open_links() == 0 and a.stats["auth_refused"] == 1
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def _open_link_to(node: Federation, peer_node: str) -> dict[str, Any]:
    """``node``'s one open dialled link to ``peer_node``."""
    rows = node.links()
    [row] = [r for r in rows if r["peer_node"] == peer_node and r["state"] == "open" and r["direction"] == "out"]
    return row


def test_direct_link_displaces_an_indirect_one(net: MemoryNetwork) -> None:
    """Linked to b through another address first (a relay, an alias), a's direct link to b's URL takes over.

    The indirect one is closed 4409 and, redialled, refused while the direct one lives.
    """
    a = net.node("a", 9001, secret=SECRET)
    net.node("b", 9002, secret=SECRET)
    net.listeners[9100] = net.listeners[9002]  # another address of b: not the URL b advertises
    relayed = _link(net, a, 9100)
    assert _open_link_to(a, "b")["direct"] is False
    direct = _link(net, a, 9002)
    assert relayed.client_wire.close() == (CLOSE_DUPLICATE, "superseded by a direct link to the same node")
    assert direct.client_wire.close() is None
    row = _open_link_to(a, "b")
    assert row["direct"] is True and row["peer"] == psc_url(9002)
    net.advance(RETRY.initial * 1.5)
    [again] = net.answer()
    assert again.client_wire.close() == (CLOSE_DUPLICATE, "already linked to node b")
    assert _open_link_to(a, "b")["peer"] == psc_url(9002) and direct.client_wire.close() is None
    net.stop()


def test_indirect_link_never_displaces_a_direct_one(net: MemoryNetwork) -> None:
    """Linked to b directly first, a link through another address of b is closed 4409; the direct one stays."""
    a = net.node("a", 9001, secret=SECRET)
    net.node("b", 9002, secret=SECRET)
    net.listeners[9100] = net.listeners[9002]
    direct = _link(net, a, 9002)
    relayed = _link(net, a, 9100)
    assert relayed.client_wire.close() == (CLOSE_DUPLICATE, "already linked to node b")
    assert direct.client_wire.close() is None and _open_link_to(a, "b")["direct"] is True
    net.stop()


def _masked(opcode: int, payload: bytes) -> bytes:
    """One client WebSocket frame (masked with a zero key, which leaves the payload as it is)."""
    assert len(payload) < 126
    return bytes((0x80 | opcode, 0x80 | len(payload))) + b"\0\0\0\0" + payload


@pytest.mark.parametrize("attack", ["replayed", "tampered", "plaintext"])
def test_sealed_link_closes_on_a_replayed_tampered_or_injected_frame(net: MemoryNetwork, attack: str) -> None:
    """A relay repeating a sealed frame, flipping a bit, or injecting a plain PSC message: closed 4401, not handled."""
    a = net.node("a", 9001, secret=SECRET)
    b = net.node("b", 9002, secret=SECRET)
    link = _link(net, a, 9002)
    first_sealed = next(payload for opcode, payload in link.client_wire.frames() if opcode == 2)
    if attack == "replayed":
        frame = _masked(2, first_sealed)
    elif attack == "tampered":
        frame = _masked(2, first_sealed[:-1] + bytes((first_sealed[-1] ^ 1,)))
    else:
        frame = _masked(1, psc.encode(psc.Subscribe(("injected",))))
    with no_logged_errors():
        link.server.dataReceived(frame)
        net.flush()
    code, reason = link.server_wire.close() or (None, "")
    assert code == CLOSE_UNAUTHENTICATED
    assert ("did not open" in reason) if attack != "plaintext" else reason == "a text frame on a sealed link"
    assert "injected" not in b.remote_interest() and b.open_links() == 0
    net.stop()


def test_never_proving_connections_evict_each_other_not_a_real_node(net: MemoryNetwork) -> None:
    """300 upgraded connections from one address that never prove hold at most the per-address cap; a real dial links.

    The evicted ones are closed 4401 with the reason; the pending count never passes the cap.
    """
    a = net.node("a", 9001, secret=SECRET)
    b = net.node("b", 9002, secret=SECRET)
    assert b.auth is not None
    handshake, _, _ = bytes(_link(net, a, 9002).client_wire.written).partition(b"\r\n\r\n")
    a.remove_server(psc_url(9002))
    net.flush()
    held = []
    for _ in range(300):
        server, wire = _raw_connection(net, 9002)
        server.dataReceived(handshake + b"\r\n\r\n")
        held.append(wire)
        assert b.auth.pending() <= b.auth.max_pending_per_source
    evicted = [wire for wire in held if wire.close() is not None]
    assert len(evicted) == 300 - b.auth.max_pending_per_source
    assert evicted[0].close() == (CLOSE_UNAUTHENTICATED, Refusal.EVICTED.value)
    c = net.node("c", 9003, secret=SECRET)
    link = _link(net, c, 9002)
    assert link.client_wire.close() is None and c.open_links() == 1
    assert b.auth.pending() == b.auth.max_pending_per_source - 1
    net.advance(b.auth.proof_timeout + 3)
    assert b.auth.pending() == 0 and c.open_links() == 1
    net.stop()


def test_server_with_our_node_id_is_dropped_with_a_secret(net: MemoryNetwork) -> None:
    """With a secret, a node dialling itself still passes the check and drops the URL (no retry loop)."""
    a = net.node("a", 9001, secret=SECRET)
    net.listeners[9100] = net.listeners[9001]
    a.add_server(psc_url(9100))
    [link] = net.answer()
    assert link.client_wire.close()[0] == CLOSE_SELF
    assert a.servers() == [] and a.stats["auth_refused"] == 0
    net.stop()
    assert net.reactor.getDelayedCalls() == []


# -- peer learning: one --peer joins the whole cluster -----------------------------------------


def _settle(net: MemoryNetwork, rounds: int = 10) -> None:
    """Answer every dial, including those made because of what earlier links told, until none is new."""
    for _ in range(rounds):
        if not net.answer():
            return
    raise AssertionError("dials kept coming")


def _peers_of(federation: Federation) -> dict[str, list[str]]:
    """node id -> directions of its open links with that node."""
    peers: dict[str, list[str]] = {}
    for row in federation.links():
        if row["state"] == "open":
            peers.setdefault(row["peer_node"], []).append(row["direction"])
    return {node: sorted(d) for node, d in sorted(peers.items())}


@pytest.mark.parametrize("secret", [None, SECRET])
def test_one_peer_joins_the_whole_cluster_with_links_both_ways(net: MemoryNetwork, secret: bytes | None) -> None:
    """b and c each know only a; after the handshakes every node links both ways with every other.

    With a cluster secret a listener tells whom it dials only in its own
    requests (never to an unproven dialler), and the mesh still closes.
    """
    a = net.node("a", 9001, learn_peers=True, secret=secret)
    b = net.node("b", 9002, learn_peers=True, secret=secret)
    c = net.node("c", 9003, learn_peers=True, secret=secret)
    sink = RecordingSink()
    b.hub.subscribe("t", sink)
    b.add_server(psc_url(9001))
    _settle(net)
    c.add_server(psc_url(9001))
    _settle(net)
    for node, others in ((a, ("b", "c")), (b, ("a", "c")), (c, ("a", "b"))):
        assert _peers_of(node) == {o: ["in", "out"] for o in others}, node.node_id
    assert sorted(c.servers()) == [psc_url(9001), psc_url(9002)]
    c.hub.publish(c.hub.envelope("t", "from c"))
    a.hub.publish(a.hub.envelope("t", "from a"))
    net.flush()
    assert sorted(e.payload for e in sink.got) == ["from a", "from c"]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_a_node_without_learning_still_links_one_way_as_before(net: MemoryNetwork) -> None:
    """A peer that neither tells nor learns (as a 0.1 node) gets exactly the links it had: none back."""
    a = net.node("a", 9001, learn_peers=True)
    old = net.node("old", 9002)
    old.add_server(psc_url(9001))
    _settle(net)
    assert _peers_of(a) == {"old": ["in"]}  # 'old' told a nothing: a cannot dial back
    assert _peers_of(old) == {"a": ["out"]}
    assert a.servers() == []
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_learned_server_that_stays_unreachable_is_forgotten(net: MemoryNetwork) -> None:
    """A node told about an address nobody answers on stops dialling it after a minute; configured ones stay."""
    a = net.node("a", 9001, learn_peers=True)
    b = net.node("b", 9002, learn_peers=True)
    b.add_server("ws://127.0.0.1:9999/psc")  # configured on b, never answers
    b.add_server(psc_url(9001))
    _answer_all_but(net, 9999)
    assert "ws://127.0.0.1:9999/psc" in a.servers()  # learned from b's handshake
    for _ in range(100):
        net.advance(1.0)
        _answer_all_but(net, 9999)
    assert "ws://127.0.0.1:9999/psc" not in a.servers()
    assert sorted(a.servers()) == [psc_url(9002)]
    assert "ws://127.0.0.1:9999/psc" in b.servers()  # configured: never forgotten
    net.stop()


def _answer_all_but(net: MemoryNetwork, dead_port: int) -> None:
    """Answer dials to live listeners; fail dials to ``dead_port`` as connection refused."""
    for _ in range(10):
        if not net.unanswered():
            return
        net.refuse(dead_port)
        net.answer()
    raise AssertionError("dials kept coming")


def test_bad_urls_in_a_handshake_are_ignored_and_counted(net: MemoryNetwork) -> None:
    """Only ws/wss URLs with a host and port, of bounded length, are dialled."""
    a = net.node("a", 9001, learn_peers=True)
    before = set(a.servers())
    a._learn(
        (None, "http://x:1/psc ws://nohost ws://h:notaport/psc " + "ws://h:1/" + "p" * 600 + " ws://10.0.0.9:7/psc")
    )
    assert set(a.servers()) - before == {"ws://10.0.0.9:7/psc"}
    assert a.hub.metrics.errors[("psc", "bad_learned_url")] == 4
    a.remove_server("ws://10.0.0.9:7/psc")
    net.stop()


# -- knowing that interest has propagated ---------------------------------------------------------


def test_interest_settles_only_after_the_producer_handled_it(net: MemoryNetwork) -> None:
    """interest_settled fires after a round trip on each producer link, so the producer has the PSC201 by then."""
    a = net.node("a", 9001)
    b = net.node("b", 9002)
    _link(net, a, 9002)
    a.hub.subscribe("t.new", RecordingSink())
    settled = a.hub.interest_settled()
    assert not settled.called  # the PSC201 and the ping are still on the wire
    assert "t.new" not in b.remote_interest()
    net.flush()
    assert settled.called and b.remote_interest() == {"t.new": ["a"]}
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_interest_settles_when_a_link_goes_down_or_at_once_without_links(net: MemoryNetwork) -> None:
    """A link lost while waiting counts as settled (its interest is resent on reconnect); no links: at once."""
    alone = net.node("alone", 9003)
    assert alone.hub.interest_settled().called
    a = net.node("a", 9001)
    net.node("b", 9002)
    link = _link(net, a, 9002)
    link.server_wire.muted = True
    settled = a.hub.interest_settled()
    assert not settled.called
    link.server_wire.loseConnection()
    net.flush()
    assert settled.called
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_interest_settles_after_the_timeout_when_the_peer_never_answers(net: MemoryNetwork) -> None:
    """A peer that reads but never answers cannot hold SUBSCRIBED for ever: the wait ends after its timeout."""
    from pubsubclub.federation.federation import INTEREST_SETTLE_TIMEOUT

    a = net.node("a", 9001)
    net.node("b", 9002)
    link = _link(net, a, 9002)
    link.server_wire.muted = True
    settled = a.hub.interest_settled()
    net.advance(INTEREST_SETTLE_TIMEOUT - 0.5)
    assert not settled.called
    net.advance(1)
    assert settled.called and settled.result is None
    net.stop()


def test_received_envelope_carries_the_psc301_size(net: MemoryNetwork) -> None:
    """A message from another node is counted with the size of the PSC301 it came in, received and delivered."""
    a, b = net.node("a", 9001), net.node("b", 9002)
    sink = WampCountedSink()
    b.hub.subscribe("t", sink)
    _link(net, b, 9001)
    envelope = a.hub.envelope("t", {"p": "x" * 50})
    a.hub.publish(envelope)
    net.flush()
    [got] = sink.got
    meta = psc.Meta(envelope.origin, envelope.published_at, envelope.message_id, False)
    size = len(psc.encode_publish("t", envelope.payload, meta))
    assert got.size == size
    _, counters, _ = b.hub.metrics.take_interval(0.0)
    assert counters[("t", "psc", "received", "a", None)] == [1, size]
    assert counters[("t", "wamp", "delivered", None, None)] == [1, size]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


# -- pattern interest (PSC 0.5) ---------------------------------------------

REPLAY = ReplaySettings(max_bytes=1024 * 1024, window=60.0)
PREFIX_APP = Pattern("prefix", "app.")
WILD_TEMP = Pattern("wildcard", "home..temp")


def _published(wire: RecordingWire) -> list[str]:
    """Topics of the PSC301s written on ``wire``."""
    return [m.topic for m in wire.messages() if isinstance(m, psc.Publish)]


def _publish_on(federation: Federation, *topics: str) -> None:
    for topic in topics:
        federation.hub.publish(federation.hub.envelope(topic, topic))


def test_0_5_carries_pattern_interest_and_forwards_only_what_matches(net: MemoryNetwork) -> None:
    """Two 0.5 nodes: patterns ride PSC103, then PSC203/PSC204; a PSC301 crosses only for a matching topic."""
    a = net.node("a", 9001, replay=REPLAY)
    b = net.node("b", 9002, replay=REPLAY)
    sink = RecordingSink()
    a.hub.subscribe_pattern(PREFIX_APP, sink)
    link = _link(net, a, 9002)
    assert link.client_wire.messages() == [
        psc.Hello((psc.V0_1, psc.V0_2, psc.V0_3, psc.V0_4, psc.V0_5, psc.V0_6, psc.V0_7, psc.V0_8)),
        psc.Resume(None, 0, (), (PREFIX_APP,)),
    ]
    assert b.remote_patterns() == {"prefix:app.": ["a"]}
    a.hub.subscribe_pattern(WILD_TEMP, sink)
    net.flush()
    assert link.client_wire.messages()[2:] == [psc.SubscribePattern(WILD_TEMP)]
    # Unwanted topics first, each followed by a wanted marker: only the markers cross.
    _publish_on(b, "other.x", "app.one", "home.k.humidity", "home.k.temp", "apple")
    net.flush()
    assert _published(link.server_wire) == ["app.one", "home.k.temp"]
    assert sink.matched == [("app.one", PREFIX_APP), ("home.k.temp", WILD_TEMP)]
    a.hub.unsubscribe_pattern(PREFIX_APP, sink)
    net.flush()
    assert link.client_wire.messages()[3:] == [psc.UnsubscribePattern(PREFIX_APP)]
    _publish_on(b, "app.two", "home.x.temp")
    net.flush()
    assert _published(link.server_wire)[2:] == ["home.x.temp"]
    assert b.links()[0]["patterns"] == 1
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_exact_and_pattern_interest_in_one_topic_cross_once(net: MemoryNetwork) -> None:
    """A consumer wanting a topic exactly and by a pattern gets one PSC301; each local subscription gets it."""
    a = net.node("a", 9001, replay=REPLAY)
    b = net.node("b", 9002, replay=REPLAY)
    exact, by_pattern = RecordingSink(), RecordingSink()
    a.hub.subscribe("app.x", exact)
    a.hub.subscribe_pattern(PREFIX_APP, by_pattern)
    link = _link(net, a, 9002)
    _publish_on(b, "app.x")
    net.flush()
    assert _published(link.server_wire) == ["app.x"]
    assert [e.topic for e in exact.got] == ["app.x"]
    assert by_pattern.matched == [("app.x", PREFIX_APP)]
    assert b.stats["forwarded"] == 1
    net.stop()


@pytest.mark.parametrize("old_side", ["producer", "consumer"])
def test_a_0_4_peer_gets_exact_topics_and_no_pattern_messages(net: MemoryNetwork, old_side: str) -> None:
    """With a 0.4-only peer the link is 0.4: exact topics flow as before, no pattern message crosses either way."""
    old = {"replay": REPLAY, "patterns": False}
    a = net.node("a", 9001, **(old if old_side == "consumer" else {"replay": REPLAY}))
    b = net.node("b", 9002, **(old if old_side == "producer" else {"replay": REPLAY}))
    sink = RecordingSink()
    a.hub.subscribe("news", sink)
    a.hub.subscribe_pattern(PREFIX_APP, sink)
    link = _link(net, a, 9002)
    assert link.server_wire.messages()[0] == psc.ChooseVersion(psc.V0_4)
    a.hub.subscribe_pattern(WILD_TEMP, sink)
    a.hub.unsubscribe_pattern(WILD_TEMP, sink)
    net.flush()
    said = link.client_wire.messages()
    assert said[1:] == [psc.Resume(None, 0, ("news",))]
    assert psc.encode(said[1]) == b'[103,null,0,["news"]]'  # the 0.4 form, no patterns item
    # A pattern subscriber misses what the peer publishes on topics nobody here wants exactly.
    _publish_on(b, "app.one", "news")
    net.flush()
    assert _published(link.server_wire) == ["news"]
    assert [e.topic for e in sink.got] == ["news"]
    assert b.remote_patterns() == {}
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_pattern_messages_on_a_0_4_link_close_it(net: MemoryNetwork) -> None:
    """PSC203 or PSC103 patterns on a link below 0.5 are a protocol error (4400)."""
    a = net.node("a", 9001, replay=REPLAY)
    net.node("b", 9002, replay=REPLAY, patterns=False)
    link = _link(net, a, 9002)
    link.client.sendMessage(b'[203,"prefix","app."]', isBinary=False)
    net.flush()
    code, reason = link.server_wire.close() or (0, "")
    assert code == CLOSE_BAD_MESSAGE and "unexpected SubscribePattern from a consumer" in reason
    net.stop()


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b'[203,"regex","a.*"]', "bad PSC message: PSC203: pattern match must be 'prefix' or 'wildcard', got 'regex'"),
        (b'[204,"prefix",""]', "bad PSC message: PSC204: pattern must not be empty"),
        (b'[203,"prefix"]', "bad PSC message: PSC203 takes 2 parameter(s), got 1"),
        (b'[203,"prefix","p.4"]', "PSC203 over the limit of 3 patterns per peer"),
    ],
)
def test_bad_or_too_many_patterns_from_a_peer_close_the_link(net: MemoryNetwork, frame: bytes, reason: str) -> None:
    """A malformed pattern, or one past max_patterns_per_peer, closes the link with 4400 naming the problem."""
    a = net.node("a", 9001, replay=REPLAY)
    b = net.node("b", 9002, replay=REPLAY, limits=psc.Limits(max_patterns_per_peer=3))
    sink = RecordingSink()
    for i in range(3):
        a.hub.subscribe_pattern(Pattern("prefix", f"p.{i}"), sink)
    link = _link(net, a, 9002)
    assert len(b.remote_patterns()) == 3
    link.client.sendMessage(frame, isBinary=False)
    net.flush()
    assert link.server_wire.close() == (CLOSE_BAD_MESSAGE, reason)
    net.stop()


def test_resume_with_more_patterns_than_the_peer_allows_is_refused(net: MemoryNetwork) -> None:
    """A PSC103 holding more patterns than the producer's max_patterns_per_peer closes the link with 4400."""
    a = net.node("a", 9001, replay=REPLAY)
    net.node("b", 9002, replay=REPLAY, limits=psc.Limits(max_patterns_per_peer=2))
    sink = RecordingSink()
    for i in range(3):
        a.hub.subscribe_pattern(Pattern("prefix", f"p.{i}"), sink)
    link = _link(net, a, 9002)
    code, reason = link.server_wire.close() or (0, "")
    assert code == CLOSE_BAD_MESSAGE and "PSC103 with 3 patterns is over the limit of 2 per peer" in reason
    net.stop()


def test_a_node_announces_at_most_its_limit_and_fills_freed_places(net: MemoryNetwork) -> None:
    """Past max_patterns_per_peer a pattern is held back (counted); it is announced when an announced one goes."""
    a = net.node("a", 9001, replay=REPLAY, limits=psc.Limits(max_patterns_per_peer=1))
    b = net.node("b", 9002, replay=REPLAY)
    sink = RecordingSink()
    a.hub.subscribe_pattern(PREFIX_APP, sink)
    a.hub.subscribe_pattern(WILD_TEMP, sink)
    assert a.hub.metrics.errors[("psc", "patterns_over_limit")] == 1
    link = _link(net, a, 9002)
    assert link.client_wire.messages()[1] == psc.Resume(None, 0, (), (PREFIX_APP,))
    a.hub.unsubscribe_pattern(PREFIX_APP, sink)
    net.flush()
    assert link.client_wire.messages()[2:] == [psc.UnsubscribePattern(PREFIX_APP), psc.SubscribePattern(WILD_TEMP)]
    assert b.remote_patterns() == {"wildcard:home..temp": ["a"]}
    net.stop()


def test_patterns_flow_when_consumers_listen(net: MemoryNetwork) -> None:
    """With consumers listening, the listening consumer sends its patterns in PSC103 and later PSC203."""
    a = net.node("a", 9001, replay=REPLAY, listen_role=Role.CONSUMER)
    b = net.node("b", 9002, replay=REPLAY, listen_role=Role.CONSUMER)
    sink = RecordingSink()
    b.hub.subscribe_pattern(PREFIX_APP, sink)
    link = _link(net, a, 9002)  # a dials: a is the producer, b the consumer
    assert link.server_wire.messages()[1] == psc.Resume(None, 0, (), (PREFIX_APP,))
    b.hub.subscribe_pattern(WILD_TEMP, sink)
    net.flush()
    _publish_on(a, "app.1", "home.k.temp", "other")
    net.flush()
    assert sink.matched == [("app.1", PREFIX_APP), ("home.k.temp", WILD_TEMP)]
    assert _published(link.client_wire) == ["app.1", "home.k.temp"]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


class WampCountedSink(RecordingSink):
    """A recording sink whose deliveries the hub counts (as it counts a WAMP session's)."""

    counts_as = "wamp"
