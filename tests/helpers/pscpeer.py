"""A raw PSC peer: the ``websockets`` sync client speaking the federation protocol by hand."""

from __future__ import annotations

import json

from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from helpers.nodes import NodeProcess
from helpers.rawws import RECV_SECONDS


def psc_producer(node: NodeProcess) -> ClientConnection:
    """A raw producer link to ``node`` (which listens as consumer): handshake done, its PSC201 read."""
    ws = ws_connect(node.psc_url, subprotocols=["pubsubclub"], open_timeout=5, close_timeout=2, legacy=True)
    hello = json.loads(ws.recv(timeout=RECV_SECONDS))
    assert hello[0] == 101
    ws.send(json.dumps([102, [0, 2]]))
    return ws
