"""TCP_NODELAY on every connection a node accepts or makes.

A pub/sub message is one small write. With Nagle's algorithm on, a write
made while an earlier one is still unacknowledged waits in the kernel for
that ACK, and a peer that delays its ACK (Linux: up to 40 ms) holds it that
long: measured as 40-46 ms stalls on single messages at 1,000 msgs/s
(docs/benchmarks.md, "Where the latency tail came from").

Autobahn means to set the option on its WebSocket connections, but its
``connectionMade`` asks before the protocol has copied ``tcpNoDelay`` from
its factory and swallows the AttributeError: on a client connection it never
takes effect (server connections get it). So the node sets it itself on the
plain TCP protocols (WAMP RawSocket, NSD, stream), on the PSC links it dials
and on a bridge's connection to its router.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import ITCPTransport


def set_no_delay(transport: Any) -> None:
    """Turn Nagle's algorithm off under ``transport`` (through TLS wrappers); a no-op off TCP."""
    while transport is not None and not ITCPTransport.providedBy(transport):
        # A TLS client connection is a protocol wrapper whose own transport is the TCP one.
        transport = getattr(transport, "transport", None)
    if transport is not None:
        transport.setTcpNoDelay(True)
