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
its deliveries per second).

Not written through: a connection with a producer registered (Twisted Web
serving a file, a front-end pacing itself by producer calls: Twisted's
doWrite is what resumes them), a connection closing or half-closed, one switched to TLS with
``startTLS`` (its ``write`` encrypts; TLS listeners wrap the protocol, so
their TCP connection carries ciphertext and is corked like any other), and a
Unix connection with descriptors queued for ``sendmsg``.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import tcp
from twisted.logger import Logger

from pubsubclub.net.reactor import TurnReactor, at_turn_end

log = Logger()

#: The connection classes whose ``socket`` can be written directly (Unix connections derive from these).
_DIRECT = (tcp.Connection,)


class _Turn:
    """The connections corked in this reactor turn, and the one call that sends for them all."""

    __slots__ = ("corked", "due")

    def __init__(self) -> None:
        self.corked: list[_WriteThrough] = []
        #: A flush is asked for at this turn's end.
        self.due = False

    def flush(self) -> None:
        """The end of the turn: one send per corked connection; what is left goes to epoll.

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
                sent = through._sock.send(data)
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
#: Its flush, bound once (asked for at the end of every turn that corked a connection).
_flush = _turn.flush


class _WriteThrough:
    """The ``write`` of one connection (an instance attribute shadowing the class method)."""

    __slots__ = ("_conn", "_sock", "_write", "corked")

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._sock = conn.socket
        #: Twisted's own (the class's: on a connection switched to TLS with startTLS it encrypts).
        self._write = type(conn).write
        #: Bytes of this turn wait in Twisted's buffer for the turn's end (:meth:`_Turn.flush`).
        self.corked = False

    def __call__(self, data: bytes) -> None:
        conn = self._conn
        if self.corked:
            if type(data) is bytes and conn.connected and not conn.disconnecting:
                if data:
                    conn._tempDataBuffer.append(data)
                    conn._tempDataLen += len(data)
                    conn._maybePauseProducer()
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
                sent = self._sock.send(data)
            except OSError:
                sent = 0  # EAGAIN, or an error Twisted's own write path finds again and closes on
            if sent < len(data):
                self._write(conn, data[sent:] if sent else data)  # the rest: Twisted's, through epoll
                return
            # The first write of the turn left at once; the turn's later ones gather for one send.
            self.corked = True
            turn = _turn
            turn.corked.append(self)
            if not turn.due:
                turn.due = True
                reactor = conn.reactor
                if type(reactor) is TurnReactor:
                    # at_turn_end(reactor, turn.flush) on the node's reactor, without its calls or a bound method
                    # made (turn_end_hook's append; no reference to the reactor kept here).
                    reactor._turn_end.append(_flush)
                else:
                    at_turn_end(reactor, _flush)
            return
        self._write(conn, data)


def install(transport: Any) -> bool:
    """Make ``transport`` (a Twisted TCP or Unix connection) write through; False if it is not one."""
    if not isinstance(transport, _DIRECT) or getattr(transport, "socket", None) is None:
        return False
    if isinstance(transport.__dict__.get("write"), _WriteThrough):
        return True
    transport.write = _WriteThrough(transport)  # type: ignore[method-assign]
    return True


def uninstall(transport: Any) -> None:
    """Give ``transport`` its class's ``write`` back (a closed connection: its write-through and it form a cycle).

    A turn's pending :meth:`_Turn.flush` still holds the write-through and finds the connection closed.
    """
    if isinstance(vars(transport).get("write"), _WriteThrough):
        del transport.write
