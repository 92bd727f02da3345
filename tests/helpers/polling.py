"""Waiting for a condition, always bounded: on the reactor (:func:`until`) or blocking (:func:`wait_until`)."""

from __future__ import annotations

import time
from collections.abc import Callable

#: Upper bound for any single wait on a node (start, a condition, a process exit).
WAIT_SECONDS = 20.0


async def until(predicate: Callable[[], bool], what: str, timeout: float = WAIT_SECONDS, every: float = 0.02) -> None:
    """:func:`wait_until` for tests that run on the reactor: polls with the reactor, never blocks it."""
    from twisted.internet import reactor, task

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await task.deferLater(reactor, every, lambda: None)


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT_SECONDS) -> None:
    """Poll a node-side condition (over /stats) until it holds; fail after ``timeout``.

    Blocking is deliberate: the condition lives in other processes, and the
    bound keeps a broken node from hanging the suite.
    """
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
