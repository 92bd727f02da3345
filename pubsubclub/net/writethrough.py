"""Write-through: an idle connection's first bytes of a turn go to its socket at once, the rest at the turn's end.

Part of the connection layer (:mod:`pubsubclub.net`). Twisted's
``FileDescriptor.write`` queues the bytes, asks epoll for writability (an
``epoll_ctl``), sends when epoll answers in a later turn and stops asking
(another ``epoll_ctl``). For a message relayed at a steady pace that is one
more ``epoll_wait`` and two ``epoll_ctl`` per hop, on the message's path
(measured: docs/benchmarks.md "The tail, decomposed").

:func:`install` gives one Twisted TCP or Unix connection another way: the
first write of a reactor turn to a connection with nothing queued goes to
``socket.send`` in the call; the connection is then *corked* until the end of
the turn: later writes gather in Twisted's buffer (not registered with
epoll) and leave in one ``send`` when the turn ends (the node's reactor's
end-of-turn hook, :mod:`pubsubclub.net.reactor`; ``callLater(0)`` elsewhere). What the socket does not
take (or any error) is left to Twisted as usual (``startWriting``), so
ordering, producers, the pending-bytes rule and error handling are Twisted's.
A publish fanned out to many subscribers, or the replies to many requests
read together, cost at most two ``send`` per connection and turn, never one
per write (sending every write in its call cost the fan-out bench 37 % of
its deliveries per second). A turn that wrote each connection once (a paced
message's) asks only for the set of written-through connections to be
emptied at its end (the set's C ``clear``: no Python call); the flush is
asked for by the first write that gathers.

Not written through: a connection with a producer registered (Twisted Web
serving a file, a front-end pacing itself by producer calls: Twisted's
doWrite is what resumes them), a connection closing or half-closed, one switched to TLS with
``startTLS`` (its ``write`` encrypts; TLS listeners wrap the protocol, so
their TCP connection carries ciphertext and is corked like any other), and a
Unix connection with descriptors queued for ``sendmsg``.
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet import tcp
from twisted.logger import Logger

from pubsubclub.net.reactor import TurnReactor, at_turn_end

log = Logger()

#: The connection classes whose ``socket`` can be written directly (Unix connections derive from these).
_DIRECT = (tcp.Connection,)
#: Twisted's sockets' class and its ``send``, taken from it once.
_SOCKET = socket.socket
_SOCKET_SEND = socket.socket.send


class _Turn:
    """The connections with bytes gathered in this reactor turn, and the one call that sends for them all."""

    __slots__ = ("corked", "due")

    def __init__(self) -> None:
        #: The connections that gathered bytes (written after their write-through) in this turn.
        self.corked: list[_WriteThrough] = []
        #: A flush is asked for at this turn's end.
        self.due = False

    def flush(self) -> None:
        """The end of the turn: one send per connection that gathered bytes; what is left goes to epoll.

        Each connection's release is done here, not in a call per connection
        and turn. One that raises (its producer's ``resumeProducing``) is
        logged; the others are still released (none is left corked).
        """
        self.due = False
        corked, self.corked = self.corked, []
        for through in corked:
            # Send what this turn wrote to the connection, in one send; anything the socket did not take waits
            # for epoll.
            through.corked = False
            conn = through._conn
            if not conn.connected or conn.disconnecting or not conn._tempDataLen:
                # Closed meanwhile, or loseConnection() asked Twisted to flush and close: Twisted's.
                if conn.connected and conn._tempDataLen:
                    conn.startWriting()
                continue
            pending = conn._tempDataBuffer
            data = pending[0] if len(pending) == 1 else b"".join(pending)
            conn._tempDataBuffer = []
            conn._tempDataLen = 0
            try:
                sock = through._sock
                sent = _SOCKET_SEND(sock, data) if type(sock) is _SOCKET else sock.send(data)
            except OSError:
                sent = 0  # EAGAIN, or an error Twisted's own write path finds again and closes on
            if sent == len(data):
                producer = conn.producer
                if producer is not None and (not conn.streamingProducer or conn.producerPaused):
                    # As Twisted's doWrite does when its buffer drains: the producer may go on.
                    conn.producerPaused = False
                    try:
                        producer.resumeProducing()
                    except Exception:
                        log.failure("a producer failed to resume after a write-through send")
                continue
            conn.dataBuffer = data[sent:]
            conn.offset = 0
            conn.startWriting()


_turn = _Turn()
#: Its flush, bound once (asked for at the end of a turn in which a connection wrote after its write-through).
_flush = _turn.flush
#: The connections written through in this reactor turn: a later write of the turn gathers for its end. Emptied at
#: the turn's end by its C ``clear`` (no Python call for the usual turn: one write per connection, nothing gathered).
_through: set[_WriteThrough] = set()
_uncork = _through.clear


class _WriteThrough:
    """The ``write`` of one connection (an instance attribute shadowing the class method)."""

    __slots__ = ("_conn", "_sock", "_write", "corked", "_guard")

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        #: The connection's guard (net/edge.py's EdgeConnection) when this is its ``write`` too (:func:`guard`):
        #: nothing is written once it is closing, and what queues past its cap drops the connection.
        self._guard: Any = None
        self._sock = conn.socket
        #: Twisted's own (the class's: on a connection switched to TLS with startTLS it encrypts).
        self._write = type(conn).write
        #: Bytes of this turn, written after its write-through, wait in Twisted's buffer for the turn's end
        #: (:meth:`_Turn.flush`). Written through in this turn (a later write gathers): in ``_through``.
        self.corked = False

    def __call__(self, data: bytes) -> None:
        conn = self._conn
        guard = self._guard
        if guard is not None and guard.closing:
            return  # EdgeConnection.write's first rule
        if self.corked or self in _through:
            # Written through in this turn already: gather for one send at its end.
            if type(data) is bytes and conn.connected and not conn.disconnecting:
                if data:
                    conn._tempDataBuffer.append(data)
                    conn._tempDataLen += len(data)
                    conn._maybePauseProducer()
                    if not self.corked:
                        self.corked = True
                        turn = _turn
                        turn.corked.append(self)
                        if not turn.due:
                            turn.due = True
                            at_turn_end(conn.reactor, _flush)
                    if guard is not None:
                        guard.check_cap()  # EdgeConnection.write's second rule
                return
        elif (
            conn.connected
            and not conn.disconnecting
            and not conn._writeDisconnected
            and not conn.TLS
            and conn.producer is None
            and not getattr(conn, "_sendmsgQueue", None)
            and not conn._tempDataLen
            and conn.offset == len(conn.dataBuffer)
            and type(data) is bytes
            and data
        ):
            try:
                # sock.send(data), without looking ``send`` up on a socket (its type's __getattribute__ slot: a few
                # hundred instructions); what is not a plain socket (a test's double) is asked as usual.
                sock = self._sock
                sent = _SOCKET_SEND(sock, data) if type(sock) is _SOCKET else sock.send(data)
            except OSError:
                sent = 0  # EAGAIN, or an error Twisted's own write path finds again and closes on
            if sent < len(data):
                self._write(conn, data[sent:] if sent else data)  # the rest: Twisted's, through epoll
                if guard is not None:
                    guard.check_cap()  # EdgeConnection.write's second rule
                return
            # The first write of the turn left at once; the turn's later ones gather for one send.
            if not _through:
                reactor = conn.reactor
                if type(reactor) is TurnReactor:
                    # at_turn_end(reactor, _uncork) on the node's reactor, without its calls (turn_end_hook's
                    # append; no reference to the reactor kept here).
                    reactor._turn_end.append(_uncork)
                else:
                    at_turn_end(reactor, _uncork)
            _through.add(self)
            return  # all sent: nothing queued, never past a cap
        self._write(conn, data)
        if guard is not None:
            guard.check_cap()  # EdgeConnection.write's second rule


def install(transport: Any) -> bool:
    """Make ``transport`` (a Twisted TCP or Unix connection) write through; False if it is not one."""
    if not isinstance(transport, _DIRECT) or getattr(transport, "socket", None) is None:
        return False
    if isinstance(transport.__dict__.get("write"), _WriteThrough):
        return True
    transport.write = _WriteThrough(transport)  # type: ignore[method-assign]
    return True


def guard(transport: Any, edge: Any) -> Any:
    """``transport``'s write-through made its guard's ``write`` too (None when it has none): one call per write.

    ``edge`` (net/edge.py's ``EdgeConnection`` wrapping ``transport`` itself,
    no TLS between) writes through it: the same rules as its own ``write``
    (nothing once closing; past ``_cap`` pending bytes, its ``check_cap()`` drops it),
    without the call around the write-through. The guard keeps the answer as
    its ``write`` and lets go of it with the connection (:func:`uninstall`).
    """
    through = vars(transport).get("write")
    if not isinstance(through, _WriteThrough):
        return None
    through._guard = edge
    return through


def uninstall(transport: Any) -> None:
    """Give ``transport`` its class's ``write`` back (a closed connection: its write-through and it form a cycle).

    A turn's pending :meth:`_Turn.flush` still holds the write-through and finds the connection closed.
    """
    through = vars(transport).get("write")
    if isinstance(through, _WriteThrough):
        through._guard = None
        del transport.write
