"""PSC 0.8 codec: retained events across the cluster (sans-IO: no Twisted, no sockets).

One message (docs/protocol.md, "Extension: version 0.8, retained events"):

- PSC501 ``[501, topic, message, {"o": origin, "t": time, "i": id, "w": 1, "b": 1, "p": {...}}]``
  (producer to consumer): ``message`` is the retained event of ``topic``
  (a hub topic) as published at node ``o`` at time ``t`` with message id
  ``i``. ``"o"``, ``"t"`` and ``"i"`` are required (they are the
  last-writer-wins stamp); ``"w"``, ``"b"`` and ``"p"`` mean what they mean
  in a 0.6 PSC301 (WAMP wrapper, binary carrier, routing object).

Decoding raises :class:`~pubsubclub.federation.psc.PSCDecodeError` (the one
decode error of PSC): :class:`~pubsubclub.federation.psc.PSCPayloadError`
when only the event's payload or routing object is at fault (the link drops
that one message, as for a PSC301), the plain error for anything else (the
link closes with 4400). Importing this module registers the decoder with
:func:`pubsubclub.federation.psc.decode`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from pubsubclub.core import binaryjson, jsonbounds
from pubsubclub.core.retained import RetainedEvent, payload_bytes
from pubsubclub.federation import psc
from pubsubclub.federation.psc import ExtensionMessage, Limits, PSCDecodeError, PSCPayloadError

RETAINED = 501
#: Longest origin node id or message id accepted in a PSC501, in characters.
MAX_ID_LENGTH = 256


@dataclass(frozen=True, slots=True)
class Retained(ExtensionMessage):
    """PSC501: the retained event of a hub topic, with its last-writer-wins stamp."""

    event: RetainedEvent

    def encode(self) -> bytes:
        """The bytes of this message (binary values in WAMP's JSON convention, flagged ``"b": 1``)."""
        event = self.event
        meta: dict[str, Any] = {"o": event.origin, "t": event.published_at, "i": event.message_id}
        if event.wamp_wrapped:
            meta["w"] = 1
        if event.options is not None:
            meta["p"] = event.options
        try:
            return orjson.dumps([RETAINED, event.topic, event.payload, meta])
        except TypeError:
            meta["b"] = 1
            return orjson.dumps([RETAINED, event.topic, binaryjson.to_json(event.payload), meta])


def _text(name: str, value: Any) -> str:
    if type(value) is not str or not value or len(value) > MAX_ID_LENGTH:
        raise PSCDecodeError(f"PSC501 {name} must be a string of 1 to {MAX_ID_LENGTH} characters")
    return value


def _retained(params: list[Any], limits: Limits, data: bytes | str) -> Retained:
    if len(params) != 3:
        raise PSCDecodeError(f"PSC501 takes 3 parameters, got {len(params)}")
    topic = psc._topic(params[0], limits)
    payload, meta = params[1], params[2]
    if type(meta) is not dict:
        raise PSCDecodeError("PSC501 metadata must be an object")
    origin = _text("'o' (origin)", meta.get("o"))
    message_id = _text("'i' (message id)", meta.get("i"))
    published_at: Any = meta.get("t")
    if type(published_at) not in (int, float) or not math.isfinite(published_at):
        raise PSCDecodeError("PSC501 metadata 't' (publish time) must be a number")
    if not 0.0 <= published_at <= psc.MAX_PUBLISH_TIME:
        raise PSCPayloadError(topic, f"publish time {published_at!r} is outside 0..{psc.MAX_PUBLISH_TIME:.0f}")
    flags = {}
    for key in ("w", "b"):
        value = meta.get(key)
        if value is not None and (type(value) is not int or value != 1):
            raise PSCDecodeError(f"PSC501 metadata '{key}' must be 1")
        flags[key] = value is not None
    unknown = set(meta) - {"o", "t", "i", "w", "b", "p"}
    if unknown:
        raise PSCDecodeError(f"PSC501 metadata has unknown key {sorted(unknown)[0][:20]!r}")
    try:
        jsonbounds.check_decoded(data, [RETAINED, *params], limits.json, wrapper_depth=1)
    except jsonbounds.BoundsError as e:
        raise PSCPayloadError(topic, str(e)) from None
    if flags["b"]:
        try:
            payload = binaryjson.from_json(payload)
        except binaryjson.BinaryDecodeError as e:
            raise PSCPayloadError(topic, str(e)) from None
    options = meta.get("p")
    if options is not None:
        problem = psc.routing_problem(options)
        if problem is not None:
            raise PSCPayloadError(topic, f"metadata 'p': {problem}")
    size = payload_bytes(payload)
    event = RetainedEvent(topic, payload, flags["w"], options, float(published_at), origin, message_id, size)
    return Retained(event)


psc.EXTENSION_DECODERS[RETAINED] = _retained
