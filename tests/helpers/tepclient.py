"""A TEP client: the independent ``websockets`` library's sync client (its own threads), every wait bounded."""

from __future__ import annotations

import json
from typing import Any

from websockets.sync.client import ClientConnection, connect

from helpers.nodes import NodeProcess
from helpers.rawws import RECV_SECONDS, recv_json


def tep(node: NodeProcess) -> ClientConnection:
    """A TEP client connected to ``node``."""
    return connect(node.tep_url, open_timeout=5, close_timeout=2, compression=None, max_size=None, legacy=True)


def send(ws: ClientConnection, topic: str | None, payload: Any) -> None:
    """Send one TEP frame."""
    frame = {"payload": payload} if topic is None else {"topic": topic, "payload": payload}
    ws.send(json.dumps(frame))


def recv(ws: ClientConnection, timeout: float = RECV_SECONDS) -> Any:
    """The next frame from the node, decoded."""
    return recv_json(ws, timeout, "TEP frame")


def join(ws: ClientConnection, *channels: str) -> None:
    """Join ``channels`` and check they were all accepted."""
    send(ws, "join", list(channels))
    assert recv(ws) == {"topic": "@join", "payload": list(channels)}
