"""Write-through: bytes for an idle connection go to its socket at once.

Part of the connection layer (:mod:`pubsubclub.net`). Twisted's
``FileDescriptor.write`` never sends: it queues the bytes, asks epoll for
writability (an ``epoll_ctl``), and sends in a later reactor turn, after which
it stops asking (another ``epoll_ctl``). For a message relayed at a steady
pace that is one more reactor turn, one more ``epoll_wait`` and two
``epoll_ctl`` per hop, on the message's path (measured: docs/benchmarks.md
"The tail"). asyncio does it the other way: a write to a connection with
nothing queued tries the socket first.

:func:`install` gives one Twisted TCP or Unix connection that behaviour: a
write when nothing is queued goes to ``socket.send`` right away; what the
socket does not take (or any write while something is queued, or any error)
goes through Twisted's own ``write``, so ordering, producers, slow-consumer
accounting and error handling are Twisted's. The bytes written are the final
ones (under TLS, the connection beneath the TLS layer carries ciphertext), so
a TLS connection is served the same way; a connection switched to TLS with
``startTLS`` (whose ``write`` encrypts) and a Unix connection with file
descriptors queued to pass (sent with the bytes by ``sendmsg``) are not
written directly.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import tcp

#: The connection classes whose ``socket`` can be written directly (Unix connections derive from these).
_DIRECT = (tcp.Connection,)


class _WriteThrough:
    """The ``write`` of one connection (an instance attribute shadowing the class method)."""

    __slots__ = ("_conn", "_sock", "_write")

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._sock = conn.socket
        #: Twisted's own (the class's: on a connection switched to TLS with startTLS it encrypts).
        self._write = type(conn).write

    def __call__(self, data: bytes) -> None:
        conn = self._conn
        if (
            conn.connected
            and not conn.disconnecting
            and not conn._writeDisconnected
            and not conn.TLS
            and not getattr(conn, "_sendmsgQueue", None)
            and not conn._tempDataLen
            and conn.offset == len(conn.dataBuffer)
            and type(data) is bytes
        ):
            try:
                sent = self._sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                # Twisted's own write finds the error again and closes the connection its way.
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        self._write(conn, data)


def install(transport: Any) -> bool:
    """Make ``transport`` (a Twisted TCP or Unix connection) write through; False if it is not one."""
    if not isinstance(transport, _DIRECT) or getattr(transport, "socket", None) is None:
        return False
    if isinstance(transport.__dict__.get("write"), _WriteThrough):
        return True
    transport.write = _WriteThrough(transport)  # type: ignore[method-assign]
    return True
