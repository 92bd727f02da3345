"""The node's reactor: Twisted's epoll reactor with a plain event dispatch and an end-of-turn hook.

Part of the connection layer (:mod:`pubsubclub.net`). Two costs of the stock
``EPollReactor`` sit on every relayed message's path, and at a steady pace
(every process waking cold for each message) each Python call there counts
(docs/benchmarks.md "The tail, decomposed"):

* Each ready descriptor is dispatched through ``log.callWithLogger``: the
  connection's ``logPrefix()``, a context dictionary copied and pushed for
  the legacy log "system" prefix, four calls deep. :class:`TurnReactor`
  calls ``_doReadOrWrite`` itself, catching and logging what escapes it as
  ``callWithLogger`` does; what the legacy log prefix said is all that
  changes (the node logs through ``twisted.logger`` with its own namespaces).
* Work that belongs "at the end of this turn" (the link batch frame of a
  turn's messages, the corked writes of :mod:`pubsubclub.net.writethrough`)
  had only ``callLater(0)``: a ``DelayedCall`` object, a heap push and pop,
  and one more pass through the main loop per turn. :func:`at_turn_end`
  runs it right after the turn's events were dispatched, and before the
  reactor blocks (for what timers queued), in the order asked; a callback
  may ask again (a flushed batch writing to a corked connection) and runs
  in the same turn.

* A TCP connection that is only readable (a relayed message's usual event)
  is read by :meth:`TurnReactor.doPoll` itself: ``recv`` into the
  protocol's ``dataReceived``, what Twisted's ``_doReadOrWrite`` ->
  ``Connection.doRead`` -> ``_dataReceived`` do, without their three calls
  (a failed ``recv`` loses the connection, an empty one closes it, half-close
  included, and what the protocol raises is logged and drops it, as there).
  The connection layer's guard (:func:`read_past`: every listener's
  connection) is read past too: its ``heard`` set and its protocol's
  ``dataReceived`` called, what the guard's own ``dataReceived`` does,
  without that call. Any other event, descriptor or a connection whose
  ``doRead`` was replaced (connecting, aborted) goes to ``_doReadOrWrite``.

On any other reactor (tests' memory reactors, a user's own reactor under
the mixin) :func:`at_turn_end` falls back to ``callLater(0)``: the same
order, one main-loop pass later; reads are Twisted's.
"""

from __future__ import annotations

import errno
import select
import socket
import sys
from collections.abc import Callable
from typing import Any

from twisted.internet import epollreactor, tcp
from twisted.internet.main import CONNECTION_DONE, CONNECTION_LOST
from twisted.logger import Logger, LogLevel
from twisted.python import log as legacy_log

log = Logger()


class TurnReactor(epollreactor.EPollReactor):  # type: ignore[misc]
    """``EPollReactor`` dispatching without the legacy log context, with :meth:`at_turn_end`."""

    def __init__(self) -> None:
        super().__init__()
        #: Callbacks for the end of the current turn, in the order asked. Never replaced (turn_end_hook).
        self._turn_end: list[Callable[[], None]] = []

    def at_turn_end(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once this turn's events are dispatched (or before the reactor next blocks)."""
        self._turn_end.append(fn)

    def _end_turn(self) -> None:
        # The list itself stays (its ``append`` is handed out by turn_end_hook): the calls run from a copy
        # and the list is emptied, so what they ask for lands in it and runs in this turn's next pass.
        queue = self._turn_end
        while queue:
            pending = queue[:]
            queue.clear()
            for fn in pending:
                try:
                    fn()
                except Exception:
                    log.failure("an end-of-turn call failed")

    def doPoll(self, timeout: float | None) -> None:  # noqa: N802 - Twisted API
        """Wait for events (at most ``timeout`` seconds), dispatch them, then end the turn."""
        if self._turn_end:
            # What timers queued leaves before the reactor blocks; they may
            # have scheduled calls of their own (an aborted connection's
            # connectionLost): look again at once rather than block past them.
            self._end_turn()
            timeout = 0
        if timeout is None:
            timeout = -1
        try:
            events = self._poller.poll(timeout, len(self._selectables))
        except OSError as err:
            if err.errno == errno.EINTR:
                return
            raise
        selectables = self._selectables
        dispatch = self._doReadOrWrite
        guard: Any = _guard
        for fd, event in events:
            selectable = selectables.get(fd)
            if selectable is None:
                continue
            try:
                if (
                    event == _READABLE
                    and type(selectable) in _TCP_CONNECTIONS
                    and "doRead" not in selectable.__dict__
                    and selectable.fileno() != -1  # first: a lost connection has no socket left
                    and type(sock := selectable.socket) is _SOCKET
                ):
                    # A TCP connection's read (most events: each relayed message's), without the three calls of
                    # _doReadOrWrite -> Connection.doRead -> _dataReceived, doing what they do: a failed recv
                    # is a lost connection (but EWOULDBLOCK), no bytes a closed one, and what the protocol
                    # raises is logged and drops the connection.
                    why: Any = None
                    try:
                        data = _RECV(sock, selectable.bufferSize)  # sock.recv, without looking it up on the socket
                    except OSError as err:
                        if err.args[0] != errno.EWOULDBLOCK:
                            why = CONNECTION_LOST
                    else:
                        if data:
                            protocol: Any = selectable.protocol
                            try:
                                if type(protocol) is guard:
                                    # The guard's dataReceived, without its call (every listener's connection).
                                    protocol.heard = True
                                    protocol.wrappedProtocol.dataReceived(data)
                                else:
                                    protocol.dataReceived(data)
                            except BaseException as err:
                                legacy_log.err()
                                self._disconnectSelectable(selectable, err, False)
                                continue
                        else:
                            why = CONNECTION_DONE
                    if why:
                        self._disconnectSelectable(selectable, why, True)
                    continue
                dispatch(selectable, fd, event)
            except KeyboardInterrupt:
                raise
            except BaseException:
                # What _doReadOrWrite lets escape (a failing connectionLost):
                # logged, as callWithLogger does, and the loop goes on.
                legacy_log.err()
        queue = self._turn_end
        while queue:
            # _end_turn, without its call (once per turn that asked for its end: each relayed message's).
            pending = queue[:]
            queue.clear()
            for fn in pending:
                try:
                    fn()
                except Exception:
                    log.failure("an end-of-turn call failed")

    doIteration = doPoll

    def mainLoop(self) -> None:  # noqa: N802 - Twisted API
        """Twisted's main loop (timers, then wait for events and dispatch them), its timer work done inline.

        Each turn Twisted calls ``runUntilCurrent`` and ``timeout`` (each
        inserting new timers first) inside a context manager that logs what
        escapes: six Python calls per turn, on every relayed message's path
        at a steady pace. Here ``runUntilCurrent`` (Twisted's) is called only
        when it has something to do: a call from a thread, a timer new since
        the last turn, one due, cancelled timers to sweep (Twisted's
        threshold) or a stop; the wait is Twisted's ``timeout`` computed
        inline when no timer is new (else its own). What escapes a turn is
        logged as critical and the loop goes on, as Twisted's does. A
        Twisted without the timer attributes read here gets its own loop.
        """
        if not all(hasattr(self, name) for name in _TIMER_STATE):
            super().mainLoop()
            return
        while self._started:
            try:
                pending = self._pendingTimedCalls  # read each turn: Twisted replaces it when it sweeps
                if (
                    self.threadCallQueue
                    or self._newTimedCalls
                    or self._justStopped
                    or self._cancellations > _CANCELLATIONS_KEPT
                    or (pending and pending[0].time <= self.seconds())
                ):
                    self.runUntilCurrent()
                    pending = self._pendingTimedCalls
                if self._newTimedCalls:
                    wait = self.timeout()
                elif pending:
                    # Never in the past, never longer than epoll_wait's millisecond int takes (Twisted's bounds):
                    # max(0, min(_LONGEST_WAIT, ...)), without the builtins' calls (about 800 instructions each).
                    wait = pending[0].time - self.seconds()
                    if wait > _LONGEST_WAIT:
                        wait = _LONGEST_WAIT
                    elif not wait > 0:
                        wait = 0
                else:
                    wait = None
                self.doIteration(self.running and wait)
            except BaseException:
                log.failure("Unexpected error in main loop", level=LogLevel.critical)
        log.info("Main loop terminated.")


#: Twisted's TCP connections whose reads doPoll makes itself (their doRead and _dataReceived are Connection's).
_TCP_CONNECTIONS = (tcp.Server, tcp.Client)
#: The event of a descriptor that is only readable (no hang-up or error, not writable).
_READABLE = select.EPOLLIN
#: Twisted's TCP sockets' class, and its ``recv`` taken from it once (an attribute looked up on a socket goes
#: through its type's ``__getattribute__``, a slot wrapper call: a few hundred instructions each time).
_SOCKET = socket.socket
_RECV = socket.socket.recv
#: The guard class whose reads doPoll takes past its dataReceived (read_past); None: none.
_guard: type | None = None
#: The attributes of Twisted's ReactorBase that mainLoop reads (private: checked before it relies on them).
_TIMER_STATE = ("threadCallQueue", "_newTimedCalls", "_pendingTimedCalls", "_cancellations", "_justStopped")
#: Twisted's runUntilCurrent sweeps cancelled timers out once more than this many are held (and half the heap).
_CANCELLATIONS_KEPT = 50
#: The longest wait Twisted's ``timeout`` gives: 2**31 ms as seconds (epoll_wait's timeout is a C int of ms).
_LONGEST_WAIT = 2147483


def read_past(guard: type) -> None:
    """Have the node's reactor read a TCP connection whose protocol is exactly a ``guard`` past its ``dataReceived``.

    A ``guard`` is a protocol wrapper whose ``dataReceived(data)`` is exactly
    ``self.heard = True; self.wrappedProtocol.dataReceived(data)`` (the
    connection layer's :class:`~pubsubclub.net.edge.EdgeConnection`, which
    registers itself): :meth:`TurnReactor.doPoll` does those two lines
    itself for every read of such a connection (a subclass keeps its own
    ``dataReceived``). One guard class per process; another reactor reads
    through the guard's ``dataReceived`` as usual.
    """
    global _guard
    _guard = guard


def install() -> bool:
    """Install :class:`TurnReactor` as Twisted's reactor; False when a reactor is already installed."""
    if "twisted.internet.reactor" in sys.modules:
        return False
    from twisted.internet.main import installReactor

    installReactor(TurnReactor())
    return True


def at_turn_end(reactor: Any, fn: Callable[[], None]) -> None:
    """Run ``fn`` at the end of ``reactor``'s current turn (``callLater(0)`` on other reactors)."""
    hook = getattr(reactor, "at_turn_end", None)
    if hook is not None:
        hook(fn)
    else:
        reactor.callLater(0, fn)


def turn_end_hook(reactor: Any) -> Callable[[Callable[[], None]], None]:
    """:func:`at_turn_end` bound to ``reactor``, to ask for the end of a turn without a Python call.

    On a :class:`TurnReactor` it is its end-of-turn list's ``append`` (a C
    method: asking costs no Python frame, once per message on a link or a
    connection written through); on another reactor, ``at_turn_end`` itself.
    Kept by whoever asks often (a link, a connection), made once.
    """
    if getattr(type(reactor), "at_turn_end", None) is TurnReactor.at_turn_end:
        return reactor._turn_end.append  # type: ignore[no-any-return]
    return lambda fn: at_turn_end(reactor, fn)
