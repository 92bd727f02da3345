"""Pacing the latency runs' Autobahn clients: one message when it is due, not two back to back.

A latency run sends ``--rate`` messages per second and measures each one. Its
clients used to sleep a fixed interval after each send and then send what had
come due: epoll rounds a timer up to the next millisecond, so at 1,000/s the
wake-ups drift late and about one message in ten left right behind another
(measured: 270 pairs in 2,730 wake-ups) and waited for it at every hop. That
is a burst the run does not claim to send, and it made most of the p99.

Now the clients run on Twisted's select reactor, whose timers wake to the
microsecond (two sockets: select costs nothing here), and sleep until the
next message's own due time (measured: 1 pair in 3,000 wake-ups).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator


def install_precise_reactor() -> None:
    """Install Twisted's select reactor (call before anything imports ``twisted.internet.reactor``)."""
    from twisted.internet import selectreactor

    selectreactor.install()


def until_due(start: float, sent: int, interval: float, now: float) -> float:
    """Seconds from ``now`` until message number ``sent`` (counted from 0) is due; 0 if it is late."""
    return max(0.0, start + sent * interval - now)


def paced(
    start: float,
    count: int,
    rate: float,
    deadline: float,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[int]:
    """Message numbers 0 to ``count`` - 1, each yielded when it is due (``sleep`` until then).

    The blocking clients' pacing (the lean latency publisher, the hop probe's
    sender): number ``i`` is due at ``start + i / rate``; a late one is yielded
    at once, so a stall is followed by the messages it held up, not skipped.
    The deadline is checked before each wait: a number whose wait began before
    ``deadline`` is still yielded (at most one interval after it).
    """
    interval = 1.0 / rate
    sent = 0
    while sent < count and now() < deadline:
        wait = until_due(start, sent, interval, now())
        if wait > 0:
            sleep(wait)
        yield sent
        sent += 1
