"""A LinkOwner that records every call a LinkSession makes of it (the link differential tests' owner)."""

from __future__ import annotations

from typing import Any

from pubsubclub.federation import psc
from pubsubclub.federation.session import LinkSession


class RecordingOwner:
    """Every call, in order; a batch as its messages one by one, a lone PSC301 read as its fields as a message."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def link_received(self, session: LinkSession, message: psc.Publish) -> None:
        self.calls.append(("received", message, session.last_size))

    def link_received_batch(self, session: LinkSession, messages: list[psc.Publish], sizes: list[int]) -> None:
        self.calls += [("received", m, size) for m, size in zip(messages, sizes, strict=True)]

    def link_received_plain(self, session: LinkSession, topic: str, message: Any, *fields: Any) -> None:
        *meta, size = fields
        self.calls.append(("received", psc.Publish(topic, message, psc.Meta(*meta)), size))

    def link_dropped(self, session: LinkSession, error: psc.PSCPayloadError) -> None:
        self.calls.append(("dropped", str(error), session.last_size))

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("link_"):
            raise AttributeError(name)
        return lambda *args: self.calls.append((name, *args[1:]))
