"""WAMP PUBLISH on the broker: checks, publish options, publisher disclosure, EVENT bytes (sans-IO).

Payloads
    A PUBLISH with exactly one positional argument and no keyword arguments
    becomes an envelope whose payload is that argument, so WAMP, the cluster
    and the other front-ends all see the plain value. Any other shape
    becomes ``{"args": [...], "kwargs": {...}}`` with
    ``Envelope.wamp_wrapped`` set. On delivery a wrapped envelope is unpacked
    back into EVENT args/kwargs; anything else is sent as ``args=[payload]``.

Publish options (the Advanced Profile's subscriber black- and whitelisting)
    ``eligible``/``exclude`` (session ids), ``eligible_authid``/``exclude_authid``
    and ``eligible_authrole``/``exclude_authrole`` become the envelope's
    *routing object* (``Envelope.options``), a small JSON object that crosses
    PSC 0.6 links as the PSC301 metadata item ``"p"`` (docs/protocol.md,
    "Publish options"). Each node applies it to its own subscribers
    (:func:`admits`): a subscriber receives only if it is in every ``eligible*``
    list given and in no ``exclude*`` list. Session ids are cluster-unique
    (random in 1..2**53: :mod:`pubsubclub.frontends.wamp.uris`), so a list names
    sessions of any node. ``exclude_me`` (default true) is the publisher's own
    node's business: the hub skips the publishing session.

Publisher disclosure
    The router's ``disclose_publisher`` setting: ``never``, ``on-request``
    (the default: a PUBLISH with ``disclose_me: true``) or ``always``. A
    disclosed publisher's ``publisher``, ``publisher_authid`` and
    ``publisher_authrole`` travel in the routing object (``"d"``) and become
    the EVENT's details on every node; an undisclosed publisher's identity
    never leaves its node.

Hot path
    A plain PUBLISH (no routing options, no ``disclose_me``) has no routing
    object: ``Envelope.options`` is None and a subscriber's delivery pays one
    attribute test. Subscription ids are broker-wide per hub topic, so one
    EVENT serves every recipient of an envelope: its bytes are encoded once
    per wire format and subscription id, memoised in ``envelope.wire`` under
    ``(serializer name, subscription id)`` (:func:`event_bytes`). Options
    or disclosure do not change that: they are the same for every recipient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from autobahn.wamp import message
from twisted.logger import Logger

from pubsubclub.core.counters import DropReason, Kind, Source
from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.core.metrics import payload_size
from pubsubclub.core.retained import RetainedEvent, payload_bytes
from pubsubclub.frontends.wamp.auth import NOT_AUTHORIZED
from pubsubclub.frontends.wamp.codec import (
    _NO_DETAILS,
    DISCLOSED,
    EVENT,
    PUBLISH,
    ROUTING_KEYS,
    PublishRequest,
    event_message,
)
from pubsubclub.frontends.wamp.uris import URI_CACHE_SIZE

if TYPE_CHECKING:
    from pubsubclub.frontends.wamp.broker import BrokerSession

__all__ = [
    "DISCLOSE_ALWAYS",
    "DISCLOSE_NEVER",
    "DISCLOSE_ON_REQUEST",
    "DISCLOSURES",
    "PAYLOAD_SIZE_EXCEEDED",
    "PUBLICATION",
    "RETAINED",
    "TOO_MANY_RETAINED",
    "admits",
    "event_arguments",
    "event_bytes",
    "publish",
    "publish_plain",
    "wamp_envelope",
]

log = Logger()

#: ``envelope.wire`` key of the WAMP publication id, drawn once per envelope.
PUBLICATION = "wamp.publication"
#: ``envelope.wire`` key of the routing object made into sets, once per envelope and node.
_ELIGIBILITY = "wamp.eligibility"
#: ``envelope.wire`` key marking a retained event sent after SUBSCRIBED (``details.retained``).
RETAINED = "wamp.retained"
#: ERROR for a retaining PUBLISH past ``[wamp] max-retained-topics`` or ``max-retained-bytes``.
TOO_MANY_RETAINED = "pubsubclub.error.too_many_retained"
INVALID_URI = "wamp.error.invalid_uri"
INVALID_ARGUMENT = "wamp.error.invalid_argument"
#: ERROR for a PUBLISH that could not reach other nodes for its size (docs/protocol.md, "Message sizes").
PAYLOAD_SIZE_EXCEEDED = "wamp.error.payload_size_exceeded"
_WAMP = Source.WAMP
#: Taken as a PUBLISH's size when its transport did not measure it: always checked.
_UNMEASURED = 1 << 62

#: ``[wamp] disclose-publisher``: never disclose, only on ``disclose_me``, or always.
DISCLOSE_NEVER = "never"
DISCLOSE_ON_REQUEST = "on-request"
DISCLOSE_ALWAYS = "always"
DISCLOSURES = (DISCLOSE_NEVER, DISCLOSE_ON_REQUEST, DISCLOSE_ALWAYS)

class _Eligibility:
    """A routing object's lists as sets, made once per envelope on each node (only when it has lists)."""

    __slots__ = ("eligible", "eligible_authid", "eligible_authrole", "exclude", "exclude_authid", "exclude_authrole")

    def __init__(self, options: dict[str, Any]) -> None:
        get = options.get
        self.eligible = _set(get("e"))
        self.exclude = _set(get("x"))
        self.eligible_authid = _set(get("ea"))
        self.exclude_authid = _set(get("xa"))
        self.eligible_authrole = _set(get("er"))
        self.exclude_authrole = _set(get("xr"))

    def admits(self, session_id: int | None, authid: str | None, authrole: str | None) -> bool:
        if self.eligible is not None and session_id not in self.eligible:
            return False
        if self.exclude is not None and session_id in self.exclude:
            return False
        if self.eligible_authid is not None and authid not in self.eligible_authid:
            return False
        if self.exclude_authid is not None and authid in self.exclude_authid:
            return False
        if self.eligible_authrole is not None and authrole not in self.eligible_authrole:
            return False
        return not (self.exclude_authrole is not None and authrole in self.exclude_authrole)


def _set(values: Any) -> frozenset[Any] | None:
    return None if values is None else frozenset(values)


#: The answer for a routing object with no lists (only a disclosed publisher): everyone is eligible.
_EVERYONE: Any = None


def admits(envelope: Envelope, session_id: int | None, authid: str | None, authrole: str | None) -> bool:
    """May a subscriber with this identity receive ``envelope``? Only called when it has a routing object."""
    wire = envelope.wire
    eligibility = wire.get(_ELIGIBILITY, False)
    if eligibility is False:
        options = envelope.options or {}
        has_lists = any(key in options for key in ROUTING_KEYS.values())
        eligibility = wire[_ELIGIBILITY] = _Eligibility(options) if has_lists else _EVERYONE
    return eligibility is _EVERYONE or eligibility.admits(session_id, authid, authrole)  # type: ignore[no-any-return]


def event_arguments(envelope: Envelope) -> tuple[list[Any], dict[str, Any] | None]:
    """EVENT ``(args, kwargs)`` for ``envelope`` (see module docstring)."""
    payload = envelope.payload
    if envelope.wamp_wrapped and isinstance(payload, dict):
        args = payload.get("args")
        kwargs = payload.get("kwargs")
        if isinstance(args, list) and isinstance(kwargs, dict):
            return args, kwargs or None
    return [payload], None


def wamp_envelope(
    hub: Hub,
    topic: str,
    args: Sequence[Any] | None,
    kwargs: dict[str, Any] | None,
    size: int | None = None,
    options: dict[str, Any] | None = None,
) -> Envelope:
    """A new envelope for a WAMP publish of ``args``/``kwargs`` (the inverse of :func:`event_arguments`).

    ``size``: the message's bytes as received, if known; ``options``: its routing object, if any.
    """
    if args is not None and len(args) == 1 and not kwargs:
        return hub.envelope(topic, args[0], size=size, options=options)
    wrapped = {"args": list(args or []), "kwargs": dict(kwargs or {})}
    return hub.envelope(topic, wrapped, wamp_wrapped=True, size=size, options=options)


def event_bytes(
    envelope: Envelope, subscription: int, serializer: Any, new_id: Callable[[], int], topic: str | None
) -> bytes:
    """The EVENT for ``envelope`` on ``subscription`` as ``serializer`` encodes it; once per format and id.

    ``topic`` is the concrete WAMP topic for a pattern subscription's EVENT
    (``details.topic``), else None. The publication id is the one every
    subscription of this message sees; a disclosed publisher is in the details.
    """
    wire = envelope.wire
    key = (serializer.NAME, subscription)
    if not wire and topic is None and envelope.options is None and not envelope.wamp_wrapped:
        # The first EVENT made of a plain publish (a remote one's usual case): nothing memoised, no id
        # drawn, not retained (that is in ``wire``): the plain EVENT below, without its three dict.get calls.
        first = wire[PUBLICATION] = new_id()
        data = wire[key] = serializer.serialize([EVENT, subscription, first, _NO_DETAILS, [envelope.payload]])
        return data  # type: ignore[no-any-return]
    data = wire.get(key)
    if data is None:
        publication = wire.get(PUBLICATION)
        if publication is None:
            publication = wire[PUBLICATION] = new_id()
        options = envelope.options
        if topic is None and options is None and not envelope.wamp_wrapped and wire.get(RETAINED) is None:
            # A plain publish of one value to an exact subscription: what event_message makes of it.
            data = wire[key] = serializer.serialize([EVENT, subscription, publication, _NO_DETAILS, [envelope.payload]])
            return data  # type: ignore[no-any-return]
        args, kwargs = event_arguments(envelope)
        details: dict[str, Any] | None = None if topic is None else {"topic": topic}
        if options is not None:
            disclosed = options.get(DISCLOSED)
            if disclosed is not None:
                # An anonymous publisher has no authid: the detail is left out, not null
                # (Autobahn-Python refuses an EVENT whose publisher_authid is not a string).
                details = {**{k: v for k, v in disclosed.items() if v is not None}, **(details or {})}
        if wire.get(RETAINED) is not None:
            details = {**(details or {}), "retained": True}
        data = wire[key] = serializer.serialize(event_message(subscription, publication, args, kwargs, details))
    return data  # type: ignore[no-any-return]


def publish(session: BrokerSession, msg: PublishRequest) -> message.Message | None:
    """Carry out one PUBLISH of ``session``: the answer to send (PUBLISHED or ERROR), or None.

    Refused (bad URI, reserved topic, payload transparency, role, too large for
    the links): nothing is delivered or forwarded, and the publisher hears of
    it only when it asked for an acknowledgement.
    """
    # The session's attributes, not its properties: three calls fewer per PUBLISH.
    router = session._router
    acknowledge = msg.acknowledge is True
    realm = session._realm
    known = router.publish_topics
    topic = known.get((realm, msg.topic))
    if topic is None or msg.payload is not None:
        checked = _checked_topic(session, msg, acknowledge)
        if type(checked) is not str:
            return checked  # type: ignore[return-value]
        topic = checked
    role = session._role
    if role is not None and not role.may_publish(topic):
        log.debug("WAMP session {session}: role {role} may not publish to {topic}", session=session.session_id,
                  role=role.name, topic=topic)  # fmt: skip
        text = f"role {role.name!r} may not publish to {msg.topic!r}"
        return message.Error(PUBLISH, msg.request, NOT_AUTHORIZED, args=[text]) if acknowledge else None
    routing = msg.routing
    policy = router.disclose_publisher
    if policy == DISCLOSE_ALWAYS or (msg.disclose_me is True and policy == DISCLOSE_ON_REQUEST):
        routing = dict(routing or {})
        routing[DISCLOSED] = {
            "publisher": session.session_id,
            "publisher_authid": session.authid,
            "publisher_authrole": session.authrole,
        }
    hub = router.hub
    args = msg.args
    if args is not None and len(args) == 1 and not msg.kwargs:  # wamp_envelope's common case, without its call
        envelope = hub.envelope(topic, args[0], size=msg.size, options=routing)
    else:
        envelope = wamp_envelope(hub, topic, args, msg.kwargs, size=msg.size, options=routing)
    too_large = hub.refusal(envelope, _UNMEASURED if msg.size is None else msg.size)
    if too_large is not None:
        # Refused before anyone gets it, here or on other nodes: one outcome everywhere.
        log.debug("WAMP session {session}: publish refused: {problem}", session=session.session_id, problem=too_large)
        hub.metrics.count(
            topic, Source.WAMP, Kind.DROPPED, 1, payload_size(envelope), reason=DropReason.TOO_LARGE_FOR_LINKS
        )
        return message.Error(PUBLISH, msg.request, PAYLOAD_SIZE_EXCEEDED, args=[too_large]) if acknowledge else None
    if msg.retain:
        refused = _retain(session, envelope)
        if refused is not None:
            return message.Error(PUBLISH, msg.request, TOO_MANY_RETAINED, args=[refused[0]],
                                 kwargs={"limit": refused[1], "max": refused[2]}) if acknowledge else None  # fmt: skip
    # The publication id: drawn here only for the PUBLISHED answer; else by the first EVENT made
    # (event_bytes), so a publish no local client receives draws none. One id per publication either way.
    publication = 0
    if acknowledge:
        publication = envelope.wire[PUBLICATION] = router.new_id()
    size = msg.size
    hub.metrics.count(topic, Source.WAMP, Kind.PUBLISHED, 1, payload_size(envelope) if size is None else size)
    hub.publish(envelope, exclude=None if msg.exclude_me is False else session)
    return message.Published(msg.request, publication) if acknowledge else None


def publish_plain(session: BrokerSession, request: int, wamp_topic: str, value: Any, size: int) -> None:
    """:func:`publish` of a plain PUBLISH ``[16, request, {}, wamp_topic, [value]]`` (``size`` bytes): no answer.

    The plain case (topic known good, the role allows it, no disclosure, small enough to need no size check)
    without the :class:`PublishRequest` and the option tests; anything else goes to :func:`publish` itself, so
    every refusal is its own.
    """
    router = session._router
    topic = router.publish_topics.get((session._realm, wamp_topic))
    role = session._role
    hub = router.hub
    if (
        topic is None
        or (role is not None and not role.may_publish(topic))
        or router.disclose_publisher == DISCLOSE_ALWAYS
        or size >= hub.checked_from
    ):
        publish(session, PublishRequest(request, wamp_topic, [value], None, None, None, None, size))
        return
    # hub.metrics.count(topic, WAMP, PUBLISHED, 1, size), then hub.publish(hub.envelope(...)), in one call.
    hub.publish_plain(topic, value, size, session, _WAMP)


def _checked_topic(session: BrokerSession, msg: PublishRequest, acknowledge: bool) -> str | message.Message | None:
    """The hub topic of ``msg``'s WAMP topic, remembered per realm once found good; else the answer refusing it.

    The URI check, the reserved prefix and payload transparency: what :func:`publish` asks
    only of a topic it has not seen yet (or of a payload-transparency PUBLISH).
    """
    router = session.router
    problem = router.uri_problem(msg.topic)
    if problem is None and msg.topic.startswith("wamp."):
        problem = "topics starting with 'wamp.' are reserved"
    if problem is None and msg.payload is not None:
        problem = "payload transparency (encrypted or passthru payloads) is not supported"
        error_uri = INVALID_ARGUMENT
    else:
        error_uri = INVALID_URI
    if problem is not None:
        log.debug("WAMP session {session}: publish refused: {problem}", session=session.session_id, problem=problem)
        # Without acknowledge the publisher expects no answer at all.
        return message.Error(PUBLISH, msg.request, error_uri, args=[problem]) if acknowledge else None
    realm = session.realm
    assert realm is not None
    topic = router.hub_topic(realm, msg.topic)
    known = router.publish_topics
    if len(known) >= URI_CACHE_SIZE:
        del known[next(iter(known))]
    known[(realm, msg.topic)] = topic
    return topic

def _retain(session: BrokerSession, envelope: Envelope) -> tuple[str, str, int] | None:
    """Keep ``envelope`` as its topic's retained event (the cluster's, core/retained.py); why not, if refused."""
    router = session.router
    assert envelope.origin is not None and envelope.published_at is not None and envelope.message_id is not None
    event = RetainedEvent(
        envelope.topic,
        envelope.payload,
        envelope.wamp_wrapped,
        envelope.options,
        envelope.published_at,
        envelope.origin,
        envelope.message_id,
        payload_bytes(envelope.payload),
    )
    refused = router.retained.retain(event)
    if refused is not None:
        log.debug("WAMP session {session}: retain refused: {problem}", session=session.session_id, problem=refused[0])
        router.refused(TOO_MANY_RETAINED.rsplit(".", 1)[-1])
    return refused
