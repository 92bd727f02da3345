"""``make demo``: a 3-node local cluster, a message crossing it, and a chat page per node.

1. starts three ``pubsubclub node`` processes (static discovery, every node
   lists the others) and prints their endpoints;
2. subscribes an Autobahn-Python client on node 2 and one on node 3, publishes
   on node 1, and prints where the message arrived;
3. keeps the cluster up with the browser chat page served by every node: open
   two of the printed chat URLs in two browsers and chat across nodes.

4. a stream subscriber on node 2 (port 7879) and the C client of
   examples/sysv/ on node 1's System V queue: the C client's message, on
   SysV channel ``chat`` (hub topic ``pubsubclub.demo.chat``, the chat page's
   topic), arrives at the stream subscriber on another node and, while the
   demo runs, in every open chat page (the C client says hello again every
   15 seconds).

Ctrl-C stops everything. Ports (node k uses base + k - 1): WAMP 8080, PSC 9001,
NSD 7001, TEP 7101, stream 7878, ops 8181, SysV key 0x420, or set
DEMO_WAMP_PORT, DEMO_PSC_PORT, DEMO_NSD_PORT, DEMO_TEP_PORT, DEMO_STREAM_PORT,
DEMO_HTTP_PORT, DEMO_SYSV_KEY; stores and metrics go to DEMO_DATA_DIR (default
pubsubclub-data).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import txaio

txaio.use_twisted()

from autobahn.twisted.wamp import ApplicationSession  # noqa: E402
from autobahn.twisted.websocket import WampWebSocketClientFactory  # noqa: E402
from autobahn.wamp.serializer import JsonSerializer  # noqa: E402
from autobahn.wamp.types import ComponentConfig, PublishOptions  # noqa: E402
from twisted.internet import defer, reactor, task  # noqa: E402
from twisted.internet.endpoints import TCP4ClientEndpoint  # noqa: E402

from pubsubclub.cluster import ClusterLayout, print_table, start_nodes, stop_nodes  # noqa: E402

TOPIC = "pubsubclub.demo.hello"
NODES = 3
#: The chat page's topic; SysV channel "chat" maps to it with the demo's SysV prefix.
CHAT_TOPIC = "pubsubclub.demo.chat"
SYSV_PREFIX = "pubsubclub.demo."
C_CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sysv", "client")


def c_client_says(key: int, text: str) -> list[str]:
    """Run the C client once on queue ``key``: log in, register channel ``chat``, send ``text``, quit."""
    script = f"connect\nlogin democ\nregister chat\nsend chat {text}\nquit\n"
    done = subprocess.run([C_CLIENT, hex(key)], input=script, capture_output=True, text=True, timeout=30)
    return done.stdout.splitlines()


def show_sysv_to_stream(nodes: list[dict[str, Any]], key: int) -> None:
    """A stream subscriber on node 2 gets what the C client sends on node 1's queue."""
    from pubsubclub.adapters import stream_codec as c

    host, port = nodes[1]["stream"].split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    decoder = c.ClientDecoder()
    sock.sendall(c.encode(c.Connect("demo", "demo")) + c.encode(c.Subscribe(CHAT_TOPIC, c.Position.LATEST)))

    def events(n: int) -> list[Any]:
        got: list[Any] = []
        while len(got) < n:
            data = sock.recv(65536)
            if not data:
                raise SystemExit("the stream connection closed")
            decoder.receive(data)
            got.extend(decoder.events())
        return got

    events(2)  # OK for Connect and Subscribe
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # node 1 must know node 2 wants the chat topic
        with urllib.request.urlopen(nodes[0]["ops"] + "stats", timeout=5) as r:
            if "node2" in json.loads(r.read())["remote_interest"].get(CHAT_TOPIC, []):
                break
        time.sleep(0.05)
    print(f"\nthe C client (examples/sysv/client) sends on {nodes[0]['name']}'s SysV queue {key:#x}, channel chat:")
    for line in c_client_says(key, "hello from C"):
        print(f"  C client: {line}")
    [message] = [e for e in events(1) if isinstance(e, c.Message)]
    print(f"  stream subscriber on {nodes[1]['name']} received: {message.payload.decode()!r}")
    sock.close()


def wait_for_mesh(nodes: list[dict[str, Any]], timeout: float = 15.0) -> None:
    """Until every node has its links to the others open."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        opened = []
        for node in nodes:
            with urllib.request.urlopen(node["ops"] + "stats", timeout=5) as r:
                links = json.loads(r.read())["links"]
            opened.append(sum(1 for link in links if link["state"] == "open"))
        if all(n == 2 * (NODES - 1) for n in opened):
            return
        time.sleep(0.05)
    raise SystemExit("the nodes did not link up")


async def session(url: str) -> ApplicationSession:
    """A joined Autobahn-Python session."""
    joined: defer.Deferred[ApplicationSession] = defer.Deferred()

    class Session(ApplicationSession):  # type: ignore[misc]
        def onJoin(self, details: Any) -> None:
            joined.callback(self)

    factory = WampWebSocketClientFactory(
        lambda: Session(ComponentConfig("realm1")), url=url, serializers=[JsonSerializer()]
    )
    host, port = url.split("//")[1].split("/")[0].split(":")
    await TCP4ClientEndpoint(reactor, host, int(port)).connect(factory)
    return await joined


async def show_fan_out(nodes: list[dict[str, Any]]) -> None:
    """Subscribers on nodes 2 and 3, a publish on node 1."""
    arrived: defer.Deferred[None] = defer.Deferred()
    seen: list[str] = []

    def on_event(name: str) -> Any:
        def handler(msg: Any) -> None:
            print(f"  {name} received: {msg}")
            seen.append(name)
            if len(seen) == 2 and not arrived.called:
                arrived.callback(None)

        return handler

    subscribers = []
    for node in nodes[1:]:
        s = await session(node["wamp"])
        await s.subscribe(on_event(node["name"]), TOPIC)
        subscribers.append(s)
    # Let PSC201 reach node 1 before publishing (interest is asynchronous).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with urllib.request.urlopen(nodes[0]["ops"] + "stats", timeout=5) as r:
            if len(json.loads(r.read())["remote_interest"].get(TOPIC, [])) == 2:
                break
        await task.deferLater(reactor, 0.05, lambda: None)
    publisher = await session(nodes[0]["wamp"])
    message = {"text": "hello from node1", "at": time.strftime("%H:%M:%S")}
    print(f"\npublishing on {nodes[0]['name']}: {message}")
    await publisher.publish(TOPIC, message, options=PublishOptions(acknowledge=True))
    await arrived.addTimeout(10, reactor)
    for s in [publisher, *subscribers]:
        s.leave()


def main() -> int:
    """Run the demo until Ctrl-C."""
    layout = ClusterLayout(
        count=NODES,
        wamp_base=int(os.environ.get("DEMO_WAMP_PORT", "8080")),
        psc_base=int(os.environ.get("DEMO_PSC_PORT", "9001")),
        nsd_base=int(os.environ.get("DEMO_NSD_PORT", "7001")),
        tep_base=int(os.environ.get("DEMO_TEP_PORT", "7101")),
        stream_base=int(os.environ.get("DEMO_STREAM_PORT", "7878")),
        sysv_base_key=int(os.environ.get("DEMO_SYSV_KEY", "0x420"), 0),
        sysv_prefix=SYSV_PREFIX,
        http_base=int(os.environ.get("DEMO_HTTP_PORT", "8181")),
        data_dir=os.environ.get("DEMO_DATA_DIR", "pubsubclub-data"),
        log_level="warn",
    )
    procs, nodes = start_nodes(layout)
    try:
        wait_for_mesh(nodes)
        print_table(nodes)
        task.react(lambda r: defer.ensureDeferred(show_fan_out(nodes)))
    except SystemExit as e:  # task.react ends with SystemExit, 0 when all went well
        if e.code not in (0, None):
            stop_nodes(procs)
            raise
    try:
        show_sysv_to_stream(nodes, layout.sysv_base_key)
    except Exception:
        stop_nodes(procs)
        raise
    # The reactor above left its own handlers installed; Ctrl-C is ours again, before we say so
    # (a Ctrl-C right after the message would otherwise reach Twisted's handler and be lost).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        print(
            "\nchat: open two of the chat pages above (different nodes) and type."
            f"\nNSD (telnet/nc, JSON lines) and TEP (WebSocket /tep) are served too; stores and metrics are in"
            f" {layout.data_dir}/.\nCtrl-C stops the cluster."
        )
        n = 1
        while all(proc.poll() is None for proc in procs):
            # The C client greets the chat pages every 15 s (they show SysV messages as text).
            time.sleep(15)
            n += 1
            c_client_says(layout.sysv_base_key, f"hello from C #{n}")
    except KeyboardInterrupt:
        pass
    finally:
        stop_nodes(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
