"""PSC codec of failed logins between the processes of one node (sans-IO: no Twisted, no sockets).

Spoken only on the links between a node's primary worker and its other
workers (docs/protocol.md, "Failed logins between a node's workers";
federation/logins.py), never between nodes: a node accepts them on no other
link (4400 "unexpected"). Two messages, producer to consumer, on a 0.7+ link:

- PSC601 ``[601, source]``: one wrong credential from ``source`` (a key of
  :func:`pubsubclub.core.loginthrottle.source_key`: an address, or an IPv6
  /64) seen by the sender or relayed by the primary.
- PSC602 ``[602, [[source, count, age, left], ...]]``: rows of the sender's
  failed-login table (a link coming up): ``count`` failures, the last one
  ``age`` seconds ago, ``left`` seconds of lockout to run. At most
  :data:`MAX_ROWS` rows per message.

Decoding raises :class:`~pubsubclub.federation.psc.PSCDecodeError` for
anything else (the link closes with 4400). Importing this module registers
the decoders with :func:`pubsubclub.federation.psc.decode`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from pubsubclub.federation import psc
from pubsubclub.federation.psc import ExtensionMessage, Limits, PSCDecodeError

FAILED_LOGIN = 601
LOGIN_TABLE = 602
#: Longest source key accepted, in characters (an IPv6 /64 is at most 43).
MAX_SOURCE_LENGTH = 64
#: Most rows in one PSC602 (about 60 bytes each).
MAX_ROWS = 500
#: Largest failure count accepted in a row.
MAX_COUNT = 2**31
#: Largest age or lockout accepted in a row, in seconds (a year; the settings' own maxima are below).
MAX_SECONDS = 366 * 86_400.0

Row = tuple[str, int, float, float]


@dataclass(frozen=True, slots=True)
class FailedLogin(ExtensionMessage):
    """PSC601: one wrong credential from ``source``."""

    source: str

    def encode(self) -> bytes:
        """The bytes of this message."""
        return orjson.dumps([FAILED_LOGIN, self.source])


@dataclass(frozen=True, slots=True)
class LoginTable(ExtensionMessage):
    """PSC602: rows of a failed-login table, ``(source, count, age, left)``."""

    rows: tuple[Row, ...]

    def encode(self) -> bytes:
        """The bytes of this message."""
        return orjson.dumps([LOGIN_TABLE, [list(row) for row in self.rows]])


def _source(name: str, value: Any) -> str:
    if type(value) is not str or not value or len(value) > MAX_SOURCE_LENGTH:
        raise PSCDecodeError(f"{name} source must be a string of 1 to {MAX_SOURCE_LENGTH} characters")
    return value


def _seconds(value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= MAX_SECONDS:
        raise PSCDecodeError(f"PSC602 row times must be numbers of seconds in 0..{MAX_SECONDS:.0f}")
    return float(value)


def _failed_login(params: list[Any], limits: Limits, data: bytes | str) -> FailedLogin:
    if len(params) != 1:
        raise PSCDecodeError(f"PSC601 takes 1 parameter, got {len(params)}")
    return FailedLogin(_source("PSC601", params[0]))


def _login_table(params: list[Any], limits: Limits, data: bytes | str) -> LoginTable:
    if len(params) != 1 or type(params[0]) is not list:
        raise PSCDecodeError("PSC602 takes 1 parameter, a list of rows")
    rows = params[0]
    if len(rows) > MAX_ROWS:
        raise PSCDecodeError(f"PSC602 with {len(rows)} rows is over the limit of {MAX_ROWS}")
    parsed = []
    for row in rows:
        if type(row) is not list or len(row) != 4:
            raise PSCDecodeError("PSC602 rows are [source, count, age, left]")
        count = row[1]
        if type(count) is not int or not 1 <= count <= MAX_COUNT:
            raise PSCDecodeError(f"PSC602 row count must be an integer in 1..{MAX_COUNT}")
        parsed.append((_source("PSC602", row[0]), count, _seconds(row[2]), _seconds(row[3])))
    return LoginTable(tuple(parsed))


psc.EXTENSION_DECODERS[FAILED_LOGIN] = _failed_login
psc.EXTENSION_DECODERS[LOGIN_TABLE] = _login_table
