"""Events for a WAMP subscriber whose WebSocket is closing are dropped quietly (issue 18, finding 10).

Autobahn keeps a WAMP session attached until the TCP connection is gone,
but refuses to send from the moment a close frame went out ("Attempt to
send on a closed protocol"). The broker used to log that with a traceback
for every event published to such a subscriber. A real node, a bare
WebSocket client that makes the node close (an oversize frame) and then
never answers the close, and an Autobahn publisher.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from helpers.nodes import NodeProcess
from helpers.rawws import SocketWebSocket
from helpers.wampclient import connect, leave, publish_acked, subscribe

pytestmark = pytest.mark.slow

LIMIT = 65536


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    """One node with a 64 KiB message limit."""
    n = NodeProcess("closing", tmp_path, extra=("--max-message-size", str(LIMIT))).start()
    yield n
    n.stop()


@pytest_twisted.ensureDeferred
async def test_events_for_a_closing_subscriber_are_dropped_without_a_traceback(node: NodeProcess) -> None:
    """A subscriber in its closing handshake gets no event and the node logs no error; others still get theirs."""
    raw = SocketWebSocket(node.wamp_port, "/ws", protocol="wamp.2.json")
    raw.send_text(json.dumps([1, "realm1", {"roles": {"subscriber": {}}}]))
    assert json.loads(raw.recv_text())[0] == 2  # WELCOME
    raw.send_text(json.dumps([32, 1, {}, "closing.topic"]))
    assert json.loads(raw.recv_text())[0] == 33  # SUBSCRIBED
    # A frame header over the limit: the node answers close 1009 and waits for our close, which never comes.
    raw.sock.sendall(struct.pack("!BBQ", 0x81, 0x80 | 127, LIMIT * 4) + b"\0\0\0\0")
    other = await connect(node.wamp_url)
    rec, _ = await subscribe(other, "closing.topic")
    pub = await connect(node.wamp_url)
    for i in range(5):
        await publish_acked(pub, "closing.topic", i)
    await rec.wait_for(5)
    assert rec.args == [0, 1, 2, 3, 4]
    await leave(pub, other)
    raw.close()
    log = node.log_path.read_text()
    assert "Attempt to send on a closed protocol" not in log
    assert "cannot send event" not in log
