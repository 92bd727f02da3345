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

Ctrl-C (or SIGTERM) stops everything and removes the SysV queues the demo
made (a demo killed with SIGKILL leaves them: list them with ``ipcs -q``,
remove one with ``ipcrm -Q 0x420``). Ports (node k uses base + k - 1): WAMP
8080, PSC 9001, NSD 7001, TEP 7101, stream 7878, ops 8181, SysV key 0x420, or
set DEMO_WAMP_PORT, DEMO_PSC_PORT, DEMO_NSD_PORT, DEMO_TEP_PORT,
DEMO_STREAM_PORT, DEMO_HTTP_PORT, DEMO_SYSV_KEY (e.g. ``DEMO_WAMP_PORT=18080
make demo``); a port in use is named at start with the variable that moves
it. Stores and metrics go to DEMO_DATA_DIR (default pubsubclub-data).
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

import sysv_ipc
import txaio

txaio.use_twisted()

from autobahn.twisted.wamp import ApplicationSession  # noqa: E402
from autobahn.twisted.websocket import WampWebSocketClientFactory  # noqa: E402
from autobahn.wamp.serializer import JsonSerializer  # noqa: E402
from autobahn.wamp.types import ComponentConfig, PublishOptions  # noqa: E402
from twisted.internet import defer, reactor, task  # noqa: E402
from twisted.internet.endpoints import TCP4ClientEndpoint  # noqa: E402

from pubsubclub.cli.cluster import ClusterLayout, print_table, start_nodes, stop_nodes  # noqa: E402

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
    from pubsubclub.frontends.stream import codec as c

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


#: The environment variable that moves each kind of port, and the ClusterLayout field it sets.
PORT_VARIABLES = (
    ("DEMO_WAMP_PORT", "wamp_base", "WAMP"),
    ("DEMO_PSC_PORT", "psc_base", "PSC"),
    ("DEMO_NSD_PORT", "nsd_base", "NSD"),
    ("DEMO_TEP_PORT", "tep_base", "TEP"),
    ("DEMO_STREAM_PORT", "stream_base", "stream"),
    ("DEMO_HTTP_PORT", "http_base", "ops"),
)


def port_in_use(layout: ClusterLayout) -> str | None:
    """What to do about the first of the demo's ports that is taken (None: all are free)."""
    for variable, field, what in PORT_VARIABLES:
        base = getattr(layout, field)
        for k in range(layout.count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", base + k))
                except OSError:
                    return (
                        f"port {base + k} (node{k + 1}'s {what} listener) is in use: move the demo's {what} ports"
                        f" with {variable}, e.g. `{variable}={base + 10000} make demo`"
                    )
    return None


def existing_queues(keys: list[int]) -> set[int]:
    """The keys among ``keys`` that have a System V message queue now."""
    found = set()
    for key in keys:
        try:
            sysv_ipc.MessageQueue(key)
        except sysv_ipc.ExistentialError:
            continue
        found.add(key)
    return found


def remove_queues(keys: set[int]) -> None:
    """Remove the System V queues of ``keys`` (those the demo's nodes made)."""
    for key in sorted(keys):
        try:
            sysv_ipc.MessageQueue(key).remove()
        except (sysv_ipc.ExistentialError, sysv_ipc.PermissionsError):
            continue
        print(f"removed SysV queue {key:#x}")


def main() -> int:
    """Run the demo until Ctrl-C; remove the SysV queues it made on the way out."""
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
    problem = port_in_use(layout)
    if problem is not None:
        print(f"demo: error: {problem}", file=sys.stderr)
        return 2
    keys = [layout.sysv_base_key + k for k in range(layout.count)]
    made = set(keys) - existing_queues(keys)
    try:
        return run(layout)
    finally:
        # Only the queues this run made: a queue someone made before (with their own mode) stays.
        remove_queues(made & existing_queues(keys))


def run(layout: ClusterLayout) -> int:
    """Start the cluster, show a message crossing it, and serve the chat pages until Ctrl-C or SIGTERM."""
    interrupt_on_sigterm()
    procs, nodes = start_nodes(layout)
    try:
        try:
            wait_for_mesh(nodes)
            print_table(nodes)
            task.react(lambda r: defer.ensureDeferred(show_fan_out(nodes)))
        except SystemExit as e:  # task.react ends with SystemExit, 0 when all went well
            if e.code not in (0, None):
                raise
        show_sysv_to_stream(nodes, layout.sysv_base_key)
        # The reactor above left its own handlers installed; Ctrl-C is ours again, before we say so
        # (a Ctrl-C right after the message would otherwise reach Twisted's handler and be lost).
        interrupt_on_sigterm()
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


def interrupt_on_sigterm() -> None:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt, so the cleanup in ``finally`` runs for both."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))


if __name__ == "__main__":
    sys.exit(main())
