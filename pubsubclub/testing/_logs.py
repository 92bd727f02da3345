"""Failing a test on any error logged while it ran."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from twisted.logger import ILogObserver, formatEvent, globalLogPublisher
from zope.interface import provider


@contextmanager
def no_logged_errors() -> Iterator[None]:
    """Raise ``AssertionError`` at the end if anything logged an error or a failure within."""
    errors: list[dict[str, Any]] = []

    @provider(ILogObserver)
    def observe(event: dict[str, Any]) -> None:
        if event.get("log_failure") is not None or event.get("isError"):
            errors.append(event)

    globalLogPublisher.addObserver(observe)
    try:
        yield
    finally:
        globalLogPublisher.removeObserver(observe)
    assert [formatEvent(e) + str(e.get("log_failure", "")) for e in errors] == []
