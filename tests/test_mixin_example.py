"""The PubSubClubMixin contract, shown on a user's own WAMP server (examples/)."""

from __future__ import annotations

import selectors
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from helpers.nodes import REPO, watch_log
from helpers.polling import WAIT_SECONDS
from helpers.ports import free_port
from helpers.wampclient import connect, leave, publish_acked, subscribe
from twisted.internet import task

pytestmark = pytest.mark.slow


class ExampleServer:
    """One ``examples/clustered_server.py`` process."""

    def __init__(self, name: str, log_dir: Path) -> None:
        self.name = name
        self.wamp_port = free_port()
        self.psc_port = free_port()
        self.log = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[str] | None = None

    def start(self, peers: list[str]) -> None:
        """Start and wait for the ready line."""
        cmd = [
            sys.executable,
            str(REPO / "examples" / "clustered_server.py"),
            "--name",
            self.name,
            "--wamp",
            str(self.wamp_port),
            "--psc",
            str(self.psc_port),
        ]
        for peer in peers:
            cmd += ["--peer", peer]
        watch_log(self.log)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO)
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        assert sel.select(WAIT_SECONDS) and self.proc.stdout.readline(), self.log.read_text()


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[tuple[ExampleServer, ExampleServer]]:
    """Two federated example servers listing each other."""
    a, b = ExampleServer("a", tmp_path), ExampleServer("b", tmp_path)
    a.start([f"ws://127.0.0.1:{b.psc_port}/psc"])
    b.start([f"ws://127.0.0.1:{a.psc_port}/psc"])
    yield a, b
    for s in (a, b):
        assert s.proc is not None
        s.proc.terminate()
        s.proc.wait(WAIT_SECONDS)


@pytest_twisted.ensureDeferred
async def test_user_server_with_mixin_federates_publishes(two_servers: tuple[ExampleServer, ExampleServer]) -> None:
    """A publish on one mixed-in user server reaches a subscriber on the other, once."""
    from twisted.internet import reactor

    a, b = two_servers
    pub = await connect(f"ws://127.0.0.1:{a.wamp_port}/ws")
    sub = await connect(f"ws://127.0.0.1:{b.wamp_port}/ws")
    probes, _ = await subscribe(sub, "example.probe")
    rec, _ = await subscribe(sub, "example.topic")
    # The link and the interest are up once a probe gets through; the probe
    # loop stops on that event and is bounded by the recorder's timeout.
    prober = task.LoopingCall(lambda: pub.publish("example.probe", "probe"))
    prober.clock = reactor
    prober.start(0.05)
    try:
        await probes.wait_for(1)
    finally:
        prober.stop()
    for i in range(10):
        await publish_acked(pub, "example.topic", i)
    await publish_acked(pub, "example.topic", "end")
    await rec.wait_until(lambda r: "end" in r.args)
    assert rec.args == [*range(10), "end"]
    await leave(pub, sub)


@pytest_twisted.ensureDeferred
async def test_args_and_kwargs_cross_unchanged_between_mixin_servers_and_a_node(tmp_path: Path) -> None:
    """("hi", url) with k=1 published on a mixin server or a built-in node arrives as exactly that everywhere."""
    from helpers.nodes import NodeProcess
    from twisted.internet import reactor

    a, b = ExampleServer("a", tmp_path), ExampleServer("b", tmp_path)
    node = NodeProcess("n", tmp_path)
    psc = {"a": f"ws://127.0.0.1:{a.psc_port}/psc", "b": f"ws://127.0.0.1:{b.psc_port}/psc", "n": node.psc_url}
    node.peers = [psc["a"], psc["b"]]
    node.start()
    a.start([psc["b"], psc["n"]])
    b.start([psc["a"], psc["n"]])
    urls = {"a": f"ws://127.0.0.1:{a.wamp_port}/ws", "b": f"ws://127.0.0.1:{b.wamp_port}/ws", "n": node.wamp_url}
    sessions: dict[str, Any] = {}
    try:
        recs = {}
        for name, url in urls.items():
            sessions[name] = await connect(url)
            recs[name], _ = await subscribe(sessions[name], "example.args")
        for source in ("a", "n"):
            others = [name for name in urls if name != source]
            # Interest is up once a probe from the source reaches every other subscriber.
            probes = {}
            for name in others:
                probes[name], _ = await subscribe(sessions[name], f"example.probe.{source}")
            prober = task.LoopingCall(lambda s=source: sessions[s].publish(f"example.probe.{s}", "probe"))
            prober.clock = reactor
            prober.start(0.05)
            try:
                for name in others:
                    await probes[name].wait_for(1)
            finally:
                prober.stop()
            await publish_acked(sessions[source], "example.args", "hi", "ws://x/y", k=1, source=source)
            for name in others:
                await recs[name].wait_until(lambda r, s=source: any(kw.get("source") == s for _, kw in r.events))
                assert (("hi", "ws://x/y"), {"k": 1, "source": source}) in recs[name].events, (source, name)
    finally:
        for session in sessions.values():
            await leave(session)
        for server in (a, b):
            if server.proc is not None:
                server.proc.terminate()
                server.proc.wait(WAIT_SECONDS)
        node.stop()
