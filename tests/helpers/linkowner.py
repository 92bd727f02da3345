"""A LinkOwner that records every call a LinkSession makes of it (the link differential tests' owner)."""

from __future__ import annotations

from typing import Any

from pubsubclub.federation import psc
from pubsubclub.federation.session import LinkSession, Role


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


def outcome(session: LinkSession, owner: RecordingOwner, take: Any, frame: bytes) -> tuple[Any, ...]:
    """What ``take(frame)`` did to ``session``: its error (type, code, text) or None, the owner's calls, the state."""
    try:
        take(frame)
        error = None
    except Exception as e:  # noqa: BLE001 - compared, whatever it is
        error = (type(e), getattr(e, "code", None), str(e))
    return error, owner.calls, session.state, session.last_size, session.resumed


#: Every PSC version up to 0.8, oldest first: a consumer of ``version`` offers those up to it.
UP_TO_0_8 = (psc.V0_1, psc.V0_2, psc.V0_3, psc.V0_4, psc.V0_5, psc.V0_6, psc.V0_7, psc.V0_8)


def open_consumer(version: psc.Version, position: bool, plain: bool = True) -> tuple[LinkSession, RecordingOwner]:
    """A consumer session on ``version`` (resumed at a position if ``position``), its owner's calls cleared.

    ``plain`` False takes away the lone-PSC301 read, so every frame goes through the batch reader.
    """
    owner = RecordingOwner()
    versions = tuple(v for v in UP_TO_0_8 if v <= version)
    session = LinkSession(Role.CONSUMER, lambda data: None, owner, "peer", versions=versions)  # type: ignore[arg-type]
    if not plain:
        session._received_plain = None
    session.start()
    session.receive(psc.encode(psc.ChooseVersion(version)))
    if position:
        session.receive(b'[104,"e",0,0]')
    owner.calls.clear()
    return session, owner
