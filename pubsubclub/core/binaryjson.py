"""Binary values in JSON, as WAMP writes them: ``"\\0"`` + base64 (sans-IO: no Twisted).

A message a WAMP client published with MessagePack ``bytes`` (or with JSON's
``"\\0"`` + base64 strings, which the broker decodes to bytes) is not JSON.
Two uses of the convention live here:

- :func:`to_json` / :func:`from_json`: the exact carrier on PSC links (0.6,
  metadata ``"b": 1``; docs/protocol.md, "Binary payloads"). ``bytes`` become
  ``"\\0"`` + base64; a *string* that itself starts with NUL gets the marker
  ``"\\0!"`` in front of the rest (``"!"`` is not a base64 character), so every
  value comes back exactly, strings and bytes alike.
- :func:`dumps`: a rendering for front-ends that have no binary type (TEP,
  NSD, SysV, stream JSON text): bytes as ``"\\0"`` + base64 strings, the form
  Autobahn's JSON serializer reads back as bytes. Strings are left alone
  (WAMP JSON's own rule: a string starting with NUL reads as binary).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

__all__ = ["BinaryDecodeError", "dumps", "from_json", "rendered", "to_json", "wamp_default"]

#: What starts a binary value in WAMP JSON.
PREFIX = "\x00"
#: What starts a carried string that began with NUL (never a base64 character).
_STRING_MARK = "\x00!"


class BinaryDecodeError(ValueError):
    """A ``"\\0"`` string in a binary-flagged value is not valid base64."""


def to_json(value: Any) -> Any:
    """``value`` with bytes as ``"\\0"`` + base64 and NUL-led strings marked; JSON if the rest is.

    A copy of the containers; scalars are shared. Non-string keys stay as
    they are (orjson then still refuses them).
    """
    kind = type(value)
    if kind is str:
        return _STRING_MARK + value[1:] if value.startswith(PREFIX) else value
    if kind is list or kind is tuple:
        return [to_json(v) for v in value]
    if kind is dict:
        return {k: to_json(v) for k, v in value.items()}
    if kind is bytes or kind is bytearray or kind is memoryview:
        return PREFIX + base64.b64encode(value).decode("ascii")
    return value


def from_json(value: Any) -> Any:
    """The inverse of :func:`to_json`; raises :class:`BinaryDecodeError` for a ``"\\0"`` string that is not base64."""
    kind = type(value)
    if kind is str:
        if not value.startswith(PREFIX):
            return value
        if value.startswith(_STRING_MARK):
            return PREFIX + value[2:]
        try:
            return base64.b64decode(value[1:], validate=True)
        except (binascii.Error, ValueError):
            raise BinaryDecodeError("a binary value (a string starting with NUL) is not valid base64") from None
    if kind is list:
        return [from_json(v) for v in value]
    if kind is dict:
        return {k: from_json(v) for k, v in value.items()}
    return value


def rendered(value: Any) -> Any:
    """``value`` with its bytes as WAMP JSON's ``"\\0"`` + base64 strings, strings as they are (a front-end's view)."""
    kind = type(value)
    if kind is list or kind is tuple:
        return [rendered(v) for v in value]
    if kind is dict:
        return {k: rendered(v) for k, v in value.items()}
    if kind is bytes or kind is bytearray or kind is memoryview:
        return PREFIX + base64.b64encode(value).decode("ascii")
    return value


def wamp_default(value: Any) -> Any:
    """orjson ``default=``: bytes as WAMP JSON's ``"\\0"`` + base64 string; anything else stays refused."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return PREFIX + base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(value: Any, option: int | None = None) -> bytes:
    """``value`` as compact JSON, bytes written as WAMP does (raises TypeError for anything else not JSON)."""
    return orjson.dumps(value, default=wamp_default, option=option)
