"""Helpers for raw WebSocket peers written with the independent ``websockets`` library."""

from __future__ import annotations

import time

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

#: Upper bound for one wait on a raw connection.
RECV_SECONDS = 5.0


def close_of(ws: ClientConnection, timeout: float = RECV_SECONDS) -> tuple[int | None, str | None]:
    """Read until the node closes; its close (code, reason), or (None, None) if it sent no close frame."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"the node did not close within {timeout} s")
        try:
            ws.recv(timeout=remaining)
        except TimeoutError:
            continue
        except ConnectionClosed as e:
            return (None, None) if e.rcvd is None else (e.rcvd.code, e.rcvd.reason)
