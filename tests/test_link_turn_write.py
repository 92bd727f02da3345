"""A link's frame at the turn's end (federation/transport.py ``_turn_ended``): its inline write against _write_frame."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pubsubclub.federation.transport import _LinkProtocolBase
from pubsubclub.net import wsframes
from pubsubclub.net.edge import DropReason, EdgeConnection, EdgeLimits
from pubsubclub.net.reactor import TurnReactor


class _Stats:
    """Autobahn's outgoing traffic counters."""

    def __init__(self) -> None:
        self.outgoingWebSocketMessages = self.outgoingOctetsAppLevel = self.outgoingOctetsWebSocketLevel = 0
        self.outgoingWebSocketFrames = self.outgoingOctetsWireLevel = 0

    def snapshot(self) -> dict[str, int]:
        return dict(vars(self))


class _Wire:
    """The TCP connection beneath the guard: records writes; keeps ``unsent`` of each as Twisted's buffer would."""

    def __init__(self, take: int | None) -> None:
        self.writes: list[bytes] = []
        self.dataBuffer = b""
        self.offset = 0
        self._tempDataLen = 0
        #: How many bytes of each write the socket takes (None: all).
        self.take = take
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        if self.take is not None:
            self._tempDataLen += max(0, len(data) - self.take)

    def abortConnection(self) -> None:  # noqa: N802 - Twisted API
        self.aborted = True


class _Listener:
    """The guard's factory: its limits, and the drops it is told of."""

    def __init__(self, cap: int) -> None:
        self.limits = EdgeLimits(max_pending_bytes=cap)
        self.drops: list[tuple[str, str]] = []

    def dropped(self, connection: Any, reason: DropReason, detail: str) -> None:
        self.drops.append((str(reason), detail))


class _Federation:
    """What the link asks of the federation when it writes: the cap, the overflow."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.asked: list[Any] = []

    def queue_cap(self, session: Any) -> int:
        self.asked.append(("cap", session))
        return self.cap

    def link_overflow(self, session: Any, queued: int) -> None:
        self.asked.append(("overflow", queued))


class _Factory:
    isServer = True

    def __init__(self, federation: _Federation) -> None:
        self.federation = federation
        self.reactor = TurnReactor.__new__(TurnReactor)
        self.reactor._turn_end = []


class _Backlog:
    def __init__(self, paused: bool) -> None:
        self.paused = paused
        self.since_pause = 0


class _Seal:
    def seal(self, data: bytes) -> bytes:
        return b"sealed:" + data


class _Link(_LinkProtocolBase):
    """A listener's link protocol (open, server side, plain) with Autobahn's attributes that sending reads."""

    state = wsframes._OPEN
    maskServerFrames = False
    _perMessageCompress: Any = None
    trackedTimings = False
    logFrames = False
    autoFragmentSize = 0
    session: Any = "session"

    def __init__(self) -> None:
        self.trafficStats = _Stats()
        self.send_queue: Any = None
        self.dropped: Any = None
        self.autobahn: list[tuple[bytes, bool]] = []

    def dropConnection(self, abort: bool) -> None:  # noqa: N802 - Autobahn API
        self.dropped = abort

    def sendMessage(self, payload: bytes, binary: bool) -> None:  # noqa: N802 - Autobahn API
        self.autobahn.append((payload, binary))


def _guarded_link(
    queued: int = 0, take: int | None = None, cap: int = 1 << 20, link_cap: int = 1 << 20, paused: bool = False
) -> tuple[_Link, EdgeConnection, _Wire, _Listener, _Federation]:
    """A link on a listener's guarded connection, ``queued`` bytes already waiting in its TCP buffer."""
    wire = _Wire(take)
    wire._tempDataLen = queued
    listener = _Listener(cap)
    edge = EdgeConnection.__new__(EdgeConnection)
    edge.factory = listener  # type: ignore[assignment]
    edge.transport = wire  # type: ignore[assignment]
    edge._buffer, edge.closing, edge._cap = wire, False, cap
    edge.address = "127.0.0.1"
    federation = _Federation(link_cap)
    link = _Link()
    link.factory = _Factory(federation)
    link.transport = edge  # type: ignore[attr-defined]
    link._backlog = _Backlog(paused)  # type: ignore[assignment]
    return link, edge, wire, listener, federation


def _outcome(
    inline: bool, batch: list[bytes], setup: Callable[[_Link, EdgeConnection, _Wire], None] | None = None, **kw: Any
) -> dict[str, Any]:
    """Everything a turn's end changes, sent by ``_turn_ended`` (inline) or by _write_frame (the general route)."""
    link, edge, wire, listener, federation = _guarded_link(**kw)
    if setup is not None:
        setup(link, edge, wire)
    link._batch = list(batch)
    link._batch_bytes = sum(len(b) for b in batch) + len(batch) - 1
    link._batch_due = True
    if inline:
        link._turn_ended()
    else:
        link._batch_due = False
        link._flush_batch()  # the batch frame through _write_frame, send_message, EdgeConnection.write
    assert link._batch is None and link._batch_bytes == 0 and not link._batch_due
    backlog: Any = link._backlog
    return {
        "wire": wire.writes,
        "aborted": wire.aborted,
        "stats": link.trafficStats.snapshot(),
        "since_pause": None if backlog is None else backlog.since_pause,
        "drops": listener.drops,
        "closing": edge.closing,
        "asked": federation.asked,
        "dropped": link.dropped,
        "overflowed": link._overflowed,
        "autobahn": link.autobahn,
    }


def _hold(link: _Link, edge: EdgeConnection, wire: _Wire) -> None:
    """A hold of frames (a remote batch's delivery) with a frame held for this link: it must leave first."""
    wsframes._held = {link: [4, [b"held"]]}


_CASES: dict[str, tuple[list[bytes], dict[str, Any]]] = {
    "one message": ([b"[301]"], {}),
    "a batch": ([b"[301,1]", b"[301,2]", b"[301,3]"], {}),
    "a 126-byte frame": ([b"x" * 126], {}),
    "a 70000-byte frame": ([b"x" * 70000], {}),
    "a 125-byte frame": ([b"x" * 125], {}),
    "a 65535-byte frame": ([b"x" * 65535], {}),
    "bytes queued under the link cap": ([b"m"], {"queued": 10}),
    "bytes queued over the link cap": ([b"m"], {"queued": 10, "link_cap": 5}),
    "the frame crosses the guard's cap": ([b"y" * 300], {"take": 0, "cap": 100}),
    "the frame leaves some unsent": ([b"y" * 300], {"take": 200, "cap": 1000}),
    "backlog paused": ([b"m", b"n"], {"paused": True}),
    "guard closing": ([b"m"], {"setup": lambda link, edge, wire: setattr(edge, "closing", True)}),
    "overflowed": ([b"m"], {"setup": lambda link, edge, wire: setattr(link, "_overflowed", True)}),
    "sealed": ([b"m"], {"setup": lambda link, edge, wire: setattr(link, "_seal", _Seal())}),
    "no backlog": ([b"m"], {"setup": lambda link, edge, wire: setattr(link, "_backlog", None)}),
    "no TCP buffer": ([b"m"], {"setup": lambda link, edge, wire: setattr(edge, "_buffer", None)}),
    "client side": ([b"m"], {"setup": lambda link, edge, wire: setattr(link.factory, "isServer", False)}),
    "masking": ([b"m"], {"setup": lambda link, edge, wire: setattr(link, "maskServerFrames", True)}),
    "compression": ([b"m"], {"setup": lambda link, edge, wire: setattr(link, "_perMessageCompress", object())}),
    "timings": ([b"m"], {"setup": lambda link, edge, wire: setattr(link, "trackedTimings", True)}),
    "frame logging": ([b"m"], {"setup": lambda link, edge, wire: setattr(link, "logFrames", True)}),
    "Autobahn queue": ([b"m"], {"setup": lambda link, edge, wire: setattr(link, "send_queue", [b"q"])}),
    "fragmenting": ([b"m" * 10], {"setup": lambda link, edge, wire: setattr(link, "autoFragmentSize", 4)}),
    "fragment size above": ([b"m" * 10], {"setup": lambda link, edge, wire: setattr(link, "autoFragmentSize", 40)}),
    "writes held": ([b"m"], {"setup": _hold}),
    "not open": ([b"m"], {"setup": lambda link, edge, wire: setattr(link, "state", wsframes._CLOSED)}),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_a_links_turn_end_writes_what_write_frame_writes(case: str) -> None:
    """The turn's end writes the batch frame inline exactly as _write_frame (send_message, the guard's write) would:
    the same bytes, counters, backlog, caps asked, slow-consumer and overflow drops, Autobahn's route where it is."""
    batch, kw = _CASES[case]
    try:
        inline = _outcome(True, batch, **kw)
        wsframes._held = None
        general = _outcome(False, batch, **kw)
    finally:
        wsframes._held = None
    assert inline == general


def test_a_links_usual_frame_leaves_in_one_call_from_the_turns_end() -> None:
    """The usual frame (a listener's plain link, nothing queued) reaches the TCP connection's write from _turn_ended
    with no Python call between (no _write_frame, send_message or guard write)."""
    import sys

    link, edge, wire, _, _ = _guarded_link()
    link._batch, link._batch_bytes, link._batch_due = [b"[301]"], 5, True
    calls: list[str] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)

    sys.setprofile(hook)
    try:
        link._turn_ended()
    finally:
        sys.setprofile(None)
    assert len(wire.writes) == 1 and calls == ["_turn_ended", "write"]
