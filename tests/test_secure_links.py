"""Secure links between real node processes: the cluster secret, TLS listeners and ``wss://`` peers.

Certificates are made inside the tests (tests/helpers/certs.py). Node-side
conditions are polled over the operations listener's ``/stats`` and the
nodes' logs with bounded waits; WAMP traffic uses Autobahn-Python clients.
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from helpers.certs import CA, make_ca
from helpers.nodes import REPO, NodeProcess, start_all
from helpers.polling import WAIT_SECONDS, until, wait_until
from helpers.wampclient import connect as wamp_connect
from helpers.wampclient import leave, publish_acked, subscribe
from twisted.internet.ssl import Certificate
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect
from websockets.sync.server import serve as ws_serve

from pubsubclub.config import ConfigError, build
from pubsubclub.federation.auth import LinkAuth

pytestmark = pytest.mark.slow

SECRET = "a cluster secret of the tests, long enough\n"
OTHER_SECRET = "some other cluster's secret, also long\n"
TOPIC = "com.example.secure"


# -- helpers ------------------------------------------------------------------


def open_links(node: NodeProcess) -> list[dict[str, Any]]:
    """The node's links past their PSC handshake."""
    return [link for link in node.stats()["links"] if link["state"] == "open"]


def log_of(node: NodeProcess) -> str:
    """Everything the node logged so far."""
    return node.log_path.read_text()


def wait_for_log(node: NodeProcess, text: str) -> None:
    """Until ``text`` shows up in the node's log."""
    wait_until(lambda: text in log_of(node), f"{text!r} in the log of {node.name}")


def write(path: Path, text: str) -> Path:
    """Write ``text`` to ``path``, readable by its owner only (as a secret must be), and return it."""
    path.write_text(text)
    path.chmod(0o600)
    return path


def tls_listener(port: int, cert: Path) -> str:
    """A Twisted ``ssl:`` endpoint on 127.0.0.1 serving the key and certificate in ``cert``."""
    return f"ssl:{port}:interface=127.0.0.1:privateKey={cert}:certKey={cert}"


class Nodes:
    """Start nodes for one test; every one is stopped at its end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[NodeProcess] = []

    def make(self, name: str, *extra: str) -> NodeProcess:
        """A node (not yet started) with extra flags; later flags override the harness's."""
        node = NodeProcess(name, self.tmp_path, extra=extra)
        self.started.append(node)
        return node

    def stop(self) -> None:
        """Stop every node."""
        for node in self.started:
            node.stop()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    """A node factory; its nodes are stopped after the test."""
    made = Nodes(tmp_path)
    yield made
    made.stop()


async def assert_publish_crosses(
    publisher: NodeProcess, subscriber: NodeProcess, pub_url: str, sub_url: str, trust_root: Any = None
) -> None:
    """A WAMP publish at ``pub_url`` (on ``publisher``) reaches a subscriber at ``sub_url`` (on ``subscriber``)."""
    sub = await wamp_connect(sub_url, trust_root=trust_root)
    pub = await wamp_connect(pub_url, trust_root=trust_root)
    rec, _ = await subscribe(sub, TOPIC)
    await until(
        lambda: publisher.stats()["remote_interest"].get(TOPIC) == [subscriber.name],
        f"{publisher.name} to learn the interest of {subscriber.name}",
    )
    await publish_acked(pub, TOPIC, "across")
    await rec.wait_for(1)
    assert rec.args == ["across"]
    await leave(pub, sub)


# -- cluster secret ---------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_same_secret_links_and_wamp_crosses(nodes: Nodes, tmp_path: Path) -> None:
    """Two nodes with one secret file link both ways, and a WAMP publish on one reaches the other."""
    secret = write(tmp_path / "secret", SECRET)
    a = nodes.make("a", "--cluster-secret-file", str(secret))
    b = nodes.make("b", "--cluster-secret-file", str(secret))
    a.peers, b.peers = [b.psc_url], [a.psc_url]
    start_all([a, b])
    await until(lambda: len(open_links(a)) == 2 and len(open_links(b)) == 2, "links both ways")
    await assert_publish_crosses(a, b, a.wamp_url, b.wamp_url)
    assert a.stats()["federation"]["auth_refused"] == b.stats()["federation"]["auth_refused"] == 0
    assert "SECURITY WARNING" not in log_of(a)


@pytest.fixture
def guarded(nodes: Nodes, tmp_path: Path) -> NodeProcess:
    """A running node whose links must prove SECRET."""
    return nodes.make("guarded", "--cluster-secret-file", str(write(tmp_path / "secret", SECRET))).start()


def test_wrong_or_missing_secret_refused(guarded: NodeProcess, nodes: Nodes, tmp_path: Path) -> None:
    """A node with another secret finds the answer wrong and proves nothing; one with none gets 401; no link."""
    other = write(tmp_path / "other-secret", OTHER_SECRET)
    wrong = nodes.make("wrong", "--cluster-secret-file", str(other))
    missing = nodes.make("missing")
    wrong.peers = missing.peers = [guarded.psc_url]
    start_all([wrong, missing])
    wait_for_log(guarded, "(node missing): HTTP 401, no cluster secret proof")
    wait_for_log(missing, f"could not link to {guarded.psc_url}: WebSocket connection upgrade failed [401]")
    wait_for_log(wrong, f"{guarded.psc_url} did not prove the cluster secret (wrong cluster secret proof)")
    wait_for_log(guarded, "(node wrong) ended before proving the cluster secret")
    seen = guarded.stats()
    assert [link for link in seen["links"] if link["state"] == "open"] == []
    assert seen["federation"]["received"] == seen["federation"]["links_opened"] == 0
    assert seen["federation"]["auth_refused"] >= 1
    assert wrong.stats()["federation"]["auth_refused"] >= 1
    assert seen["remote_interest"] == {}
    assert open_links(wrong) == open_links(missing) == []
    # The refusing side logs the peer's address, as an operator needs it.
    assert "refused PSC link from tcp4:127.0.0.1:" in log_of(guarded)


class RawDialler:
    """A PSC dialler written with the ``websockets`` library and LinkAuth: one connection, its bytes kept."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.url = url
        self.headers = headers

    def status(self) -> int:
        """The HTTP status of the handshake (101 when it upgrades)."""
        try:
            with ws_connect(self.url, subprotocols=["pubsubclub"], additional_headers=self.headers, open_timeout=5):
                return 101
        except InvalidStatus as e:
            return int(e.response.status_code)

    def first_frame(
        self, make: Callable[[str | None, str | None], bytes], accepted: Callable[[], bool] | None = None
    ) -> tuple[int, str]:
        """Upgrade, send ``make(answer header, listener node id)`` first, return the close (code, reason).

        A proof the listener accepts leaves the connection open: then (0, "open"). Given
        ``accepted`` (the listener's own word that it took the proof), that is awaited while
        the connection is held; otherwise the connection must outlive the 5 s proof deadline.
        """
        with ws_connect(
            self.url, subprotocols=["pubsubclub"], additional_headers=self.headers, open_timeout=5, close_timeout=5
        ) as ws:
            headers = ws.response.headers
            ws.send(make(headers.get("X-PubSubClub-Auth"), headers.get("X-PubSubClub-Node")).decode())
            if accepted is not None:
                wait_until(accepted, "the listener to start a session on the proof")
                return 0, "open"
            try:
                ws.recv(timeout=2 * 5)
            except ConnectionClosed as e:
                assert e.rcvd is not None
                return e.rcvd.code, e.rcvd.reason
            except TimeoutError:
                return 0, "open"
            return 0, "open"


def test_raw_client_needs_a_proof(guarded: NodeProcess) -> None:
    """401 without an offer, 403 for v1 or junk; after the upgrade a wrong or junk first frame is closed 4401."""
    auth = LinkAuth(SECRET.strip().encode())
    offer = auth.offer("raw")
    node = {"X-PubSubClub-Node": "raw"}
    assert RawDialler(guarded.psc_url, node).status() == 401
    v1 = "v1:1700000000:" + "0" * 32 + ":" + "0" * 64
    assert RawDialler(guarded.psc_url, {**node, "X-PubSubClub-Auth": v1}).status() == 403
    assert RawDialler(guarded.psc_url, {**node, "X-PubSubClub-Auth": "v3:junk"}).status() == 403
    offered = RawDialler(guarded.psc_url, {**node, "X-PubSubClub-Auth": offer.header()})
    assert offered.first_frame(lambda answer, listener: b'[101, ["0.1"]]') == (4401, "malformed cluster secret proof")
    assert offered.first_frame(lambda answer, listener: b"PSC-AUTH v3:" + b"0" * 64) == (
        4401,
        "wrong cluster secret proof",
    )
    wait_for_log(guarded, "(node raw): closed 4401, wrong cluster secret proof")


def test_captured_proof_opens_nothing(guarded: NodeProcess, nodes: Nodes, tmp_path: Path) -> None:
    """A proof made for one node opens no link on another node, nor on the same node again, nor after a restart.

    The raw dialler holds the secret and completes a real exchange with
    ``guarded``; the same offer header and proof frame, replayed, are what an
    eavesdropper on a plain ws:// link would have.
    """
    other = nodes.make("other", "--cluster-secret-file", str(tmp_path / "secret")).start()
    auth = LinkAuth(SECRET.strip().encode())
    offer = auth.offer("raw")
    headers = {"X-PubSubClub-Node": "raw", "X-PubSubClub-Auth": offer.header()}
    captured: list[bytes] = []

    def prove(answer: str | None, listener: str | None) -> bytes:
        captured.append(auth.prove(offer, answer, listener or "").frame)
        return captured[-1]

    def replay(answer: str | None, listener: str | None) -> bytes:
        return captured[0]

    # The proof is good: the listener starts a PSC session for it (its links show node "raw").
    took_it = lambda: any(link["peer_node"] == "raw" for link in guarded.stats()["links"])  # noqa: E731
    assert RawDialler(guarded.psc_url, headers).first_frame(prove, accepted=took_it) == (0, "open")
    assert RawDialler(other.psc_url, headers).first_frame(replay) == (4401, "wrong cluster secret proof")
    assert RawDialler(guarded.psc_url, headers).first_frame(replay) == (4401, "wrong cluster secret proof")
    guarded.stop()
    guarded.start()
    assert RawDialler(guarded.psc_url, headers).first_frame(replay) == (4401, "wrong cluster secret proof")
    for node in (guarded, other):
        seen = node.stats()
        assert seen["federation"]["received"] == 0
        assert [link for link in seen["links"] if link["peer_node"] == "raw" and link["state"] == "open"] == []
    assert other.stats()["links"] == []


def test_hostile_address_harvests_no_proof(nodes: Nodes, tmp_path: Path) -> None:
    """A node dialling an address that answers without the secret sends it no proof and links to nothing."""
    received: list[str | bytes] = []
    requests: list[dict[str, str]] = []

    def handler(ws: Any) -> None:
        requests.append({k.lower(): v for k, v in ws.request.headers.raw_items()})
        try:
            for message in ws:
                received.append(message)
        except ConnectionClosed:
            pass

    def answer(connection: Any, request: Any, response: Any) -> Any:
        # Pretend to be node "guarded", with a made-up answer.
        response.headers["X-PubSubClub-Node"] = "guarded"
        response.headers["X-PubSubClub-Auth"] = "v3:" + "1" * 32 + ":direct:" + "2" * 64
        return response

    with ws_serve(handler, "127.0.0.1", 0, subprotocols=["pubsubclub"], process_response=answer) as server:
        port = server.socket.getsockname()[1]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        dialler = nodes.make("dialler", "--cluster-secret-file", str(write(tmp_path / "secret", SECRET)))
        url = f"ws://127.0.0.1:{port}/psc"
        dialler.peers = [url]
        dialler.start()
        wait_for_log(dialler, f"{url} did not prove the cluster secret (wrong cluster secret proof)")
        wait_until(lambda: len(requests) >= 2, "a second attempt (the dialler keeps retrying)")
        server.shutdown()
    assert requests[0]["x-pubsubclub-auth"].startswith("v3:")
    assert received == [], "the dialler sent something to an address that did not prove the secret"
    assert open_links(dialler) == []


# -- relays and never-proving strangers ---------------------------------------


class Relay:
    """A hostile TCP forwarder: every connection to it is relayed to ``target_port``; every byte is kept.

    One thread accepts, two per connection copy (one each way); all stop when
    the relay closes. This is what a ``--peer`` address in hostile hands does
    between two real nodes.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"ws://127.0.0.1:{self.port}/psc"
        self.captured = bytearray()
        self.connections = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                inbound, _ = self.listener.accept()
                outbound = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                return
            outbound.settimeout(None)
            with self._lock:
                self.connections += 1
                self._sockets += [inbound, outbound]
            for source, sink in ((inbound, outbound), (outbound, inbound)):
                thread = threading.Thread(target=self._copy, args=(source, sink), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _copy(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    self.captured += data
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def seen(self) -> bytes:
        """Everything relayed so far, both ways."""
        with self._lock:
            return bytes(self.captured)

    def close(self) -> None:
        """Stop accepting and relaying; wait for the threads."""
        # shutdown wakes the thread blocked in accept() (close alone leaves it there until join's timeout).
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(5)


def out_link_to(node: NodeProcess, peer_node: str) -> dict[str, Any] | None:
    """``node``'s open dialled link to ``peer_node``, if it has one."""
    rows = [r for r in open_links(node) if r["peer_node"] == peer_node and r["direction"] == "out"]
    assert len(rows) <= 1, rows
    return rows[0] if rows else None


async def deliver_marker(publisher: NodeProcess, subscriber: NodeProcess, topic: str, marker: str) -> None:
    """A WAMP publish of ``marker`` on ``publisher`` reaches a subscriber on ``subscriber``."""
    sub = await wamp_connect(subscriber.wamp_url)
    pub = await wamp_connect(publisher.wamp_url)
    rec, _ = await subscribe(sub, topic)
    await until(
        lambda: subscriber.name in publisher.stats()["remote_interest"].get(topic, []),
        f"{publisher.name} to learn the interest of {subscriber.name}",
    )
    await publish_acked(pub, topic, marker)
    await rec.wait_for(1)
    assert rec.args == [marker]
    await leave(pub, sub)


@pytest_twisted.ensureDeferred
async def test_relay_between_two_nodes_reads_nothing(nodes: Nodes, tmp_path: Path) -> None:
    """A --peer that relays to another node carries the link, but sees only ciphertext after the proofs.

    The relay saw the handshake (so it really was in the path), the publish
    crossed it, and neither the marker published nor its topic is in any byte
    it forwarded.
    """
    secret = str(write(tmp_path / "secret", SECRET))
    b = nodes.make("b", "--cluster-secret-file", secret, "--no-learn-peers").start()
    relay = Relay(b.psc_port)
    try:
        a = nodes.make("a", "--cluster-secret-file", secret, "--no-learn-peers")
        a.peers = [relay.url]
        a.start()
        await until(lambda: out_link_to(a, "b") is not None, "a's link to b through the relay")
        link = out_link_to(a, "b")
        assert link is not None and link["peer"] == relay.url and link["direct"] is False
        marker = f"MARKER-{os.urandom(8).hex()}"
        await deliver_marker(b, a, "com.example.relayed.secret", marker)
        seen = relay.seen()
    finally:
        relay.close()
    assert b"x-pubsubclub-auth: v3:" in seen.lower(), "the relay did not carry the handshake"
    assert marker.encode() not in seen
    assert b"com.example.relayed.secret" not in seen
    assert b"[101" not in seen and b"[301" not in seen


@pytest_twisted.ensureDeferred
async def test_relayed_link_never_supersedes_the_direct_one(nodes: Nodes, tmp_path: Path) -> None:
    """Linked first through a relay, a node takes the direct link to the same node when it learns it, and keeps it.

    The relayed link is closed ("superseded by a direct link"); redialled, it
    is refused as a duplicate while the direct link stays up and carries the
    traffic.
    """
    secret = str(write(tmp_path / "secret", SECRET))
    b = nodes.make("b", "--cluster-secret-file", secret).start()
    relay = Relay(b.psc_port)
    try:
        a = nodes.make("a", "--cluster-secret-file", secret)
        a.peers = [relay.url]
        a.start()
        # b learns a from a's handshake and dials it; a learns b's own URL from that and dials it too.
        await until(lambda: (out_link_to(a, "b") or {}).get("peer") == b.psc_url, "a's direct link to b to take over")
        assert (out_link_to(a, "b") or {})["direct"] is True
        wait_for_log(a, f"closing the indirect one via {relay.url}")
        # The relay's address is redialled (it is configured) and refused while the direct link lives.
        wait_for_log(a, f"duplicate link to node b via {relay.url}; closing it")
        link = out_link_to(a, "b")
        assert link is not None and link["peer"] == b.psc_url and link["direct"] is True
        await deliver_marker(b, a, "com.example.direct", "direct")
        assert (out_link_to(a, "b") or {}).get("peer") == b.psc_url
        assert "superseded by a newer link" not in log_of(b)
    finally:
        relay.close()


def never_proving(port: int, count: int) -> tuple[list[socket.socket], int]:
    """``count`` connections that upgrade to /psc with a well-formed offer and never prove; (sockets, upgraded)."""
    held, upgraded = [], 0
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        held.append(sock)
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            (
                f"GET /psc HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: pubsubclub\r\n"
                f"X-PubSubClub-Node: stranger\r\nX-PubSubClub-Auth: v3:{os.urandom(16).hex()}\r\n\r\n"
            ).encode()
        )
        head = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in head and (chunk := sock.recv(4096)):
                head += chunk
        upgraded += head.startswith(b"HTTP/1.1 101")
    return held, upgraded


@pytest_twisted.ensureDeferred
async def test_never_proving_connections_do_not_stop_a_real_node(nodes: Nodes, tmp_path: Path) -> None:
    """300 connections from one address that upgrade and never prove, held open: a real node still links and delivers.

    The proof deadline is an hour here, so only the pending caps can make
    room: past the per-address cap each newcomer evicts that address's oldest.
    The node logs a handful of lines about it, not one per connection.
    """
    secret = str(write(tmp_path / "secret", SECRET))
    a = nodes.make("a", "--cluster-secret-file", secret, "--link-proof-timeout", "3600").start()
    held, upgraded = never_proving(a.psc_port, 300)
    try:
        assert upgraded > 16, "the listener refused before the per-address cap was even reached"
        b = nodes.make("b", "--cluster-secret-file", secret)
        b.peers = [a.psc_url]
        b.start()
        await until(lambda: out_link_to(b, "a") is not None, "b's link to a")
        await deliver_marker(a, b, "com.example.crowded", "through")
        seen = a.stats()["federation"]
        assert seen["auth_refused"] >= upgraded - 16
        refusals = [
            line for line in log_of(a).splitlines() if "PSC link" in line and ("refused" in line or "ended" in line)
        ]
        assert len(refusals) <= 12, refusals
    finally:
        for sock in held:
            sock.close()


# -- TLS ----------------------------------------------------------------------


@pytest.fixture
def ca(tmp_path: Path) -> CA:
    """The cluster's CA, made for this test."""
    return make_ca(tmp_path, "cluster-ca")


@pytest.fixture
def server_cert(ca: CA, tmp_path: Path) -> Path:
    """Key and certificate for ``localhost`` and ``127.0.0.1``, signed by the cluster's CA."""
    return ca.issue(tmp_path, "node", dns=("localhost",), ips=("127.0.0.1",))


@pytest_twisted.ensureDeferred
async def test_tls_links_and_wamp_cross(nodes: Nodes, ca: CA, server_cert: Path, tmp_path: Path) -> None:
    """TLS PSC listeners, wss:// peers by name and by IP checked against the CA, TLS WAMP: traffic crosses."""
    secret = write(tmp_path / "secret", SECRET)
    # A bundle: the cluster's CA after an unrelated one.
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(make_ca(tmp_path, "unrelated-ca").pem.read_bytes() + ca.pem.read_bytes())
    a = nodes.make("a")
    b = nodes.make("b")
    for node in (a, b):
        node.extra = (
            "--psc",
            tls_listener(node.psc_port, server_cert),
            "--wamp",
            tls_listener(node.wamp_port, server_cert),
            "--ca-file",
            str(bundle),
            "--cluster-secret-file",
            str(secret),
        )
    a.peers = [f"wss://localhost:{b.psc_port}/psc"]
    b.peers = [f"wss://127.0.0.1:{a.psc_port}/psc"]
    start_all([a, b])
    assert a.ready["psc"] == f"wss://127.0.0.1:{a.psc_port}/psc"
    assert a.ready["wamp"] == f"wss://127.0.0.1:{a.wamp_port}/ws"
    await until(lambda: len(open_links(a)) == 2 and len(open_links(b)) == 2, "TLS links both ways")
    trust = Certificate.loadPEM(ca.pem.read_bytes())
    await assert_publish_crosses(
        a, b, f"wss://localhost:{a.wamp_port}/ws", f"wss://127.0.0.1:{b.wamp_port}/ws", trust_root=trust
    )


def test_certificate_from_another_ca_refused(nodes: Nodes, ca: CA, server_cert: Path, tmp_path: Path) -> None:
    """A node trusting a different CA refuses the listener's certificate: no link, the log says why."""
    listener = nodes.make("listener")
    listener.extra = ("--psc", tls_listener(listener.psc_port, server_cert))
    stranger_ca = make_ca(tmp_path, "stranger-ca")
    dialler = nodes.make("dialler", "--ca-file", str(stranger_ca.pem))
    dialler.peers = [f"wss://127.0.0.1:{listener.psc_port}/psc"]
    start_all([listener, dialler])  # start-ups overlap
    wait_for_log(dialler, f"could not link to wss://127.0.0.1:{listener.psc_port}/psc")
    wait_for_log(dialler, "certificate verify failed")
    assert open_links(dialler) == []
    assert listener.stats()["links"] == [] and listener.stats()["federation"]["links_opened"] == 0


def test_certificate_for_another_name_refused(nodes: Nodes, ca: CA, tmp_path: Path) -> None:
    """A certificate from the right CA but for another name than the dialled one is refused."""
    elsewhere = ca.issue(tmp_path, "elsewhere", dns=("elsewhere.example",), ips=("192.0.2.7",))
    listener = nodes.make("listener")
    listener.extra = ("--psc", tls_listener(listener.psc_port, elsewhere))
    dialler = nodes.make("dialler", "--ca-file", str(ca.pem))
    dialler.peers = [f"wss://127.0.0.1:{listener.psc_port}/psc"]
    start_all([listener, dialler])  # start-ups overlap
    wait_for_log(dialler, f"could not link to wss://127.0.0.1:{listener.psc_port}/psc")
    wait_for_log(dialler, "IPAddressMismatch")
    assert open_links(dialler) == []
    assert listener.stats()["links"] == [] and listener.stats()["federation"]["links_opened"] == 0


# -- the warning --------------------------------------------------------------


def test_public_listener_without_secret_warns(nodes: Nodes, tmp_path: Path) -> None:
    """Binding the PSC listener to 0.0.0.0 without a secret logs a security warning; with a secret it does not."""
    open_node = nodes.make("open")
    open_node.extra = ("--psc", f"tcp:{open_node.psc_port}:interface=0.0.0.0")
    closed = nodes.make("closed", "--cluster-secret-file", str(write(tmp_path / "secret", SECRET)))
    closed.extra = (*closed.extra, "--psc", f"tcp:{closed.psc_port}:interface=0.0.0.0")
    loopback = nodes.make("loopback")
    start_all([open_node, closed, loopback])
    warnings = [line for line in log_of(open_node).splitlines() if "SECURITY WARNING" in line]
    assert len(warnings) == 1 and "listeners psc " in warnings[0], warnings
    assert "SECURITY WARNING" not in log_of(closed)
    assert "SECURITY WARNING" not in log_of(loopback)


@pytest.mark.parametrize(
    ("endpoint", "public"),
    [
        ("tcp:9001:interface=127.0.0.1", False),
        ("tcp:9001:interface=127.0.0.2", False),
        ("tcp:9001:interface=localhost", False),
        ("tcp6:9001:interface=\\:\\:1", False),
        ("unix:/tmp/psc.sock", False),
        ("tcp:9001", True),
        ("tcp:9001:interface=0.0.0.0", True),
        ("tcp:9001:interface=10.1.2.3", True),
        ("tcp6:9001", True),
        ("tcp6:9001:interface=\\:\\:", True),
    ],
)
def test_public_listeners(endpoint: str, public: bool) -> None:
    """Listeners without an interface, or on a non-loopback one, count as public; UNIX sockets do not."""
    config = build({}, {"psc": endpoint, "wamp": "tcp:8080:interface=127.0.0.1"})
    assert config.public_listeners() == (["psc"] if public else [])


# -- configuration ------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"", "is empty"), (b"\n", "is empty"), (b"short\n", "shorter than 16 bytes"), (b"x" * 5000, "longer than")],
)
def test_unusable_secret_file_names_the_key(tmp_path: Path, content: bytes, problem: str) -> None:
    """An empty, too short or too long secret file is a ConfigError naming cluster-secret-file."""
    path = tmp_path / "secret"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=problem) as e:
        build({}, {"cluster_secret_file": str(path)})
    assert e.value.key == "cluster-secret-file"


def test_unreadable_secret_file_names_the_key() -> None:
    """A secret file that cannot be read is a ConfigError naming cluster-secret-file."""
    # A regular file whose read fails with EIO even for root (tests run as root,
    # so a chmod 000 file would still be readable).
    with pytest.raises(ConfigError, match="cannot read") as e:
        build({}, {"cluster_secret_file": "/proc/self/mem"})
    assert e.value.key == "cluster-secret-file"


@pytest.mark.parametrize("ending", ["\n", "\r\n", ""])
def test_secret_is_the_file_without_its_line_break(tmp_path: Path, ending: str) -> None:
    """The secret is the file's bytes without the trailing line break, however it ends."""
    path = write(tmp_path / "secret", "0123456789abcdef-secret" + ending)
    assert build({}, {"cluster_secret_file": str(path)}).cluster_secret() == b"0123456789abcdef-secret"


def test_bad_secret_or_ca_file_exits_2(tmp_path: Path) -> None:
    """``pubsubclub node`` with an empty secret file or a CA file without certificates exits 2 naming the key."""
    empty = write(tmp_path / "empty", "")
    junk = write(tmp_path / "junk.pem", "not a certificate\n")
    for flag, path in (("--cluster-secret-file", empty), ("--ca-file", junk)):
        result = subprocess.run(
            [sys.executable, "-m", "pubsubclub", "node", flag, str(path)],
            capture_output=True,
            text=True,
            timeout=WAIT_SECONDS,
            cwd=REPO,
        )
        assert result.returncode == 2, result
        assert repr(flag[2:]) in result.stderr
