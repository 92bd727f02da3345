"""A plain-socket NSD client for tests: one JSON object per line."""

from __future__ import annotations

import json
import socket
from typing import Any

TIMEOUT = 10.0


class NSDClient:
    """One TCP connection to a node's NSD listener."""

    def __init__(self, port: int, identity: str | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self._buffer = b""
        self.identity = identity

    def close(self) -> None:
        """Close the connection."""
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        """Send bytes as they are."""
        self.sock.sendall(data)

    def read_line(self) -> bytes:
        """The next response line (bounded by the socket timeout)."""
        while b"\n" not in self._buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed by the node; buffered: {self._buffer[:200]!r}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def request(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Send one request object and return the response object."""
        self.send_raw(json.dumps(obj).encode() + b"\n")
        return dict(json.loads(self.read_line()))

    # The spec's five requests, with this client's identity.

    def open(self) -> dict[str, Any]:
        """OpenRequest."""
        return self.request({"_class": "OpenRequest", "identity": self.identity})

    def publish(self, body: str, **extra: Any) -> dict[str, Any]:
        """PublishRequest with a message from this identity."""
        message = {"_class": "Message", "from": self.identity, "when": 0, "body": body, **extra}
        return self.request({"_class": "PublishRequest", "identity": self.identity, "message": message})

    def subscribe(self, channel: str) -> dict[str, Any]:
        """SubscribeRequest."""
        return self.request({"_class": "SubscribeRequest", "identity": self.identity, "channel": channel})

    def unsubscribe(self, channel: str) -> dict[str, Any]:
        """UnsubscribeRequest."""
        return self.request({"_class": "UnsubscribeRequest", "identity": self.identity, "channel": channel})

    def get(self, after: int = 0) -> list[dict[str, Any]]:
        """GetRequest; the messages of the MessageListResponse."""
        response = self.request({"_class": "GetRequest", "identity": self.identity, "after": after})
        assert response["_class"] == "MessageListResponse", response
        return list(response["messages"])


SUCCESS = {"_class": "SuccessResponse"}


def error(text: str) -> dict[str, Any]:
    """An ErrorResponse with ``text``."""
    return {"_class": "ErrorResponse", "error": text}


#: Any sane ``when`` (microseconds since the epoch) is far below this.
SANE_WHEN = 2**62
