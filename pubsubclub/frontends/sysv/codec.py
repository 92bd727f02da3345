"""System V queue protocol codec (sans-IO: no Twisted, no queue).

Every message on the queue is the spec's ``struct message`` (docs/specs/sysv-protocol.pl.md,
our choices in docs/sysv.md)::

    struct message { long receiver; int sender; int type; char shortText[16]; char longText[256]; };

``receiver`` is the System V message type (``mtype``), given to ``msgsnd`` and
chosen by ``msgrcv``; the bytes on the queue are the rest of the struct,
:data:`BODY_SIZE` (280) bytes in the machine's native layout. This module turns
those bytes into frozen dataclasses and back:

* :func:`decode_request` turns a client's message into one of the request
  classes and raises :class:`SysVDecodeError` - the only error it raises - for
  a message the server cannot act on (wrong size, unknown type, impossible
  sender, garbage quantity or text).
* :func:`reply`, :func:`new_channel` and :func:`delivery` build the server's
  messages; :func:`delivery_text` maps a hub payload to the text of a delivery.
* :func:`pack` and :func:`unpack` are the raw struct, for clients (tests).

Names (nicks, channels) are C strings in ``shortText``. A 16-character name
fills ``shortText`` without a terminator; where ``longText`` is unused, a
C client's ``strcpy`` of a longer name spills its 17th character on into
``longText``, so for those requests the name continues there and is too long.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any, Union

from pubsubclub.core import binaryjson

__all__ = [
    "BODY_FORMAT",
    "BODY_SIZE",
    "CLIENT_SIGNALS",
    "LONG_TEXT_SIZE",
    "MAX_CHANNEL_BYTES",
    "MAX_DELIVERY_TEXT",
    "MAX_NICK_BYTES",
    "MESSAGE_COUNT_BASE",
    "MESSAGE_COUNT_MAX",
    "MIN_NICK_BYTES",
    "SERVER_ID",
    "SHORT_TEXT_SIZE",
    "STRUCT_FORMAT",
    "Block",
    "Connect",
    "Login",
    "Logout",
    "Publish",
    "Quit",
    "RawMessage",
    "RegisterChannel",
    "Request",
    "Signal",
    "Subscribe",
    "SysVDecodeError",
    "Unblock",
    "Unsubscribe",
    "c_string",
    "channel_name",
    "decode_request",
    "delivery",
    "delivery_text",
    "new_channel",
    "next_count",
    "nick_name",
    "pack",
    "reply",
    "unpack",
]

#: ``receiver`` of every message to the server; ``sender`` of every server message.
SERVER_ID = 1
SHORT_TEXT_SIZE = 16
LONG_TEXT_SIZE = 256
#: The whole ``struct message``, native alignment (``long`` first).
STRUCT_FORMAT = f"@lii{SHORT_TEXT_SIZE}s{LONG_TEXT_SIZE}s"
#: What follows ``receiver``: the bytes ``msgsnd``/``msgrcv`` carry.
BODY_FORMAT = f"@ii{SHORT_TEXT_SIZE}s{LONG_TEXT_SIZE}s"
#: ``sizeof(struct message) - sizeof(long)``: the size of every message, both ways.
BODY_SIZE = struct.calcsize(BODY_FORMAT)
_BODY = struct.Struct(BODY_FORMAT)

#: Nick length in bytes (C chars), inclusive bounds (spec section 7).
MIN_NICK_BYTES = 3
MAX_NICK_BYTES = SHORT_TEXT_SIZE
#: A channel name is 1 to 16 bytes of UTF-8 (it must fit ``shortText``).
MAX_CHANNEL_BYTES = SHORT_TEXT_SIZE
#: Bytes of text in a delivery: ``longText`` keeps its terminator.
MAX_DELIVERY_TEXT = LONG_TEXT_SIZE - 1
#: A subscription quantity is a C int.
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1


class Signal(enum.IntEnum):
    """The spec's signal codes, with the values of examples/sysv/pubsubclub_sysv.h."""

    #: Client: connect (always answered OPERATION_SUCCESS).
    CONNECTION = 1
    #: Client: log in with the nick in shortText.
    LOGIN = 2
    #: Client: log out.
    LOGOUT = 3
    #: Client: subscribe to the channel in shortText; longText is the quantity.
    SUBSCRIBE = 4
    #: Client: unsubscribe from the channel in shortText.
    UNSUBSCRIBE = 5
    #: Client: publish longText on the channel in shortText.
    MESSAGE = 6
    #: Client: register the channel in shortText.
    MSGREG = 7
    #: Client: stop receiving messages from the nick in shortText.
    BLOCK = 8
    #: Client: receive messages from the nick in shortText again.
    UNBLOCK = 9
    #: Client: the client is closing (no reply).
    QUIT = 10
    #: Server: the operation succeeded.
    OPERATION_SUCCESS = 20
    #: Server: the nick is not valid, or (BLOCK/UNBLOCK) no logged-in user has it.
    INVALID_USERNAME = 21
    #: Server: the sender is not logged in.
    SENDER_NOT_RECOGNIZED = 22
    #: Server: no room (users; also channels, subscriptions and blocks, docs/sysv.md).
    SERVER_OVERFLOW = 23
    #: Server: already done, taken, or not possible (docs/sysv.md lists each case).
    UNAVAILABLE = 24
    #: Server, unasked: a channel was registered (its name in shortText).
    NEW_CHANNEL = 25
    #: Server: no such channel.
    NO_CHANNEL = 26


#: A delivery's type is its counter, from here up to :data:`MESSAGE_COUNT_MAX`, then here again.
MESSAGE_COUNT_BASE = 1000
MESSAGE_COUNT_MAX = _INT_MAX
assert max(Signal) < MESSAGE_COUNT_BASE

#: The signals a client may send.
CLIENT_SIGNALS = frozenset(s for s in Signal if s <= Signal.QUIT)


class SysVDecodeError(ValueError):
    """A client message the server cannot act on; ``reason`` is its short name for counters."""

    def __init__(self, reason: str, detail: str, sender: int | None = None) -> None:
        super().__init__(detail)
        #: One word for counters and logs: truncated, oversized, bad_sender, unknown_type, bad_quantity, bad_text.
        self.reason = reason
        #: The claimed sender, when the message was long enough to have one.
        self.sender = sender


# -- requests ---------------------------------------------------------------------------
#
# ``channel`` is None when shortText cannot name a channel (empty, over 16
# bytes, not UTF-8, or reserved: starting with ``$``); ``nick`` is None when it
# breaks the nick rules. The server answers those per request (docs/sysv.md).


@dataclass(frozen=True, slots=True)
class Connect:
    """a) CONNECTION."""

    sender: int


@dataclass(frozen=True, slots=True)
class Login:
    """b) LOGIN with a nick."""

    sender: int
    nick: bytes | None


@dataclass(frozen=True, slots=True)
class Logout:
    """c) LOGOUT."""

    sender: int


@dataclass(frozen=True, slots=True)
class Subscribe:
    """d) SUBSCRIBE: ``quantity`` > 0 is that many messages, else durable."""

    sender: int
    channel: str | None
    quantity: int


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """e) UNSUBSCRIBE."""

    sender: int
    channel: str | None


@dataclass(frozen=True, slots=True)
class RegisterChannel:
    """f) MSGREG."""

    sender: int
    channel: str | None


@dataclass(frozen=True, slots=True)
class Publish:
    """g) MESSAGE: ``text`` is longText up to its terminator."""

    sender: int
    channel: str | None
    text: str


@dataclass(frozen=True, slots=True)
class Block:
    """i) BLOCK a nick."""

    sender: int
    nick: bytes | None


@dataclass(frozen=True, slots=True)
class Unblock:
    """j) UNBLOCK a nick."""

    sender: int
    nick: bytes | None


@dataclass(frozen=True, slots=True)
class Quit:
    """k) QUIT (no reply)."""

    sender: int


Request = Union[Connect, Login, Logout, Subscribe, Unsubscribe, RegisterChannel, Publish, Block, Unblock, Quit]


@dataclass(frozen=True, slots=True)
class RawMessage:
    """A ``struct message`` without its receiver, texts as the raw arrays."""

    sender: int
    type: int
    short_text: bytes
    long_text: bytes


# -- the raw struct ---------------------------------------------------------------------


def pack(sender: int, type: int, short_text: bytes = b"", long_text: bytes = b"") -> bytes:
    """The :data:`BODY_SIZE` bytes of a message; texts are NUL-padded (too long: ValueError)."""
    if len(short_text) > SHORT_TEXT_SIZE or len(long_text) > LONG_TEXT_SIZE:
        raise ValueError("shortText holds 16 bytes, longText 256")
    return _BODY.pack(sender, type, short_text, long_text)


def unpack(data: bytes) -> RawMessage:
    """The fields of a :data:`BODY_SIZE`-byte message (other sizes: ValueError)."""
    if len(data) != BODY_SIZE:
        raise ValueError(f"a message has {BODY_SIZE} bytes, not {len(data)}")
    sender, type_, short_text, long_text = _BODY.unpack(data)
    return RawMessage(sender, type_, short_text, long_text)


def c_string(data: bytes) -> bytes:
    """``data`` up to its first NUL (all of it when there is none)."""
    end = data.find(b"\0")
    return data if end < 0 else data[:end]


def _spilled_name(short_text: bytes, long_text: bytes) -> bytes:
    """The C string that starts in shortText, continuing into longText as ``strcpy`` lays it out."""
    if b"\0" in short_text:
        return c_string(short_text)
    return short_text + c_string(long_text)


# -- decoding requests ------------------------------------------------------------------


def nick_name(name: bytes) -> bytes | None:
    """``name`` if it is a valid nick (3 to 16 bytes), else None."""
    return name if MIN_NICK_BYTES <= len(name) <= MAX_NICK_BYTES else None


def channel_name(name: bytes) -> str | None:
    """The channel ``name`` names (1 to 16 bytes of UTF-8, not starting with ``$``), else None."""
    if not 1 <= len(name) <= MAX_CHANNEL_BYTES:
        return None
    try:
        channel = name.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if channel.startswith("$") else channel


def _quantity(long_text: bytes, sender: int) -> int:
    text = c_string(long_text).strip()
    if not text:
        return 0  # no quantity given: durable
    try:
        # int() also takes "1_000" and non-ASCII digits; a C client sends sprintf("%d").
        if not text.lstrip(b"+-").isdigit():
            raise ValueError(text)
        value = int(text)
    except ValueError:
        raise SysVDecodeError("bad_quantity", f"quantity {text[:32]!r} is not an integer", sender) from None
    if not _INT_MIN <= value <= _INT_MAX:
        raise SysVDecodeError("bad_quantity", f"quantity {value} does not fit a C int", sender)
    return value


def _text(long_text: bytes, sender: int) -> str:
    raw = c_string(long_text)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SysVDecodeError("bad_text", f"message text is not UTF-8 ({e.reason} at byte {e.start})", sender) from None


def decode_request(data: bytes) -> Request:
    """The request in one message a client sent to the server; SysVDecodeError if unusable."""
    if len(data) != BODY_SIZE:
        sender = struct.unpack_from("@i", data)[0] if len(data) >= 4 else None
        reason = "truncated" if len(data) < BODY_SIZE else "oversized"
        raise SysVDecodeError(reason, f"a message has {BODY_SIZE} bytes, this one {len(data)}", sender)
    sender, type_, short_text, long_text = _BODY.unpack(data)
    if sender <= SERVER_ID:
        # Replies go to msgrcv type `sender`: 1 is the server itself, <= 0 is no client.
        raise SysVDecodeError("bad_sender", f"sender {sender} cannot be a client PID", sender)
    if type_ not in CLIENT_SIGNALS:
        raise SysVDecodeError("unknown_type", f"type {type_} is not a client signal", sender)
    signal = Signal(type_)
    if signal is Signal.CONNECTION:
        return Connect(sender)
    if signal is Signal.LOGIN:
        return Login(sender, nick_name(_spilled_name(short_text, long_text)))
    if signal is Signal.LOGOUT:
        return Logout(sender)
    if signal is Signal.SUBSCRIBE:
        # longText holds the quantity, so a name cannot spill into it.
        return Subscribe(sender, channel_name(c_string(short_text)), _quantity(long_text, sender))
    if signal is Signal.UNSUBSCRIBE:
        return Unsubscribe(sender, channel_name(_spilled_name(short_text, long_text)))
    if signal is Signal.MESSAGE:
        return Publish(sender, channel_name(c_string(short_text)), _text(long_text, sender))
    if signal is Signal.MSGREG:
        return RegisterChannel(sender, channel_name(_spilled_name(short_text, long_text)))
    if signal is Signal.BLOCK:
        return Block(sender, nick_name(_spilled_name(short_text, long_text)))
    if signal is Signal.UNBLOCK:
        return Unblock(sender, nick_name(_spilled_name(short_text, long_text)))
    return Quit(sender)


# -- encoding the server's messages -----------------------------------------------------

_REPLIES = {signal: _BODY.pack(SERVER_ID, signal, b"", b"") for signal in Signal if signal > Signal.QUIT}


def reply(signal: Signal) -> bytes:
    """A reply: sender 1, type ``signal``, empty texts (built once per signal)."""
    return _REPLIES[signal]


def new_channel(channel: str) -> bytes:
    """NEW_CHANNEL with the channel's name in shortText."""
    return _BODY.pack(SERVER_ID, Signal.NEW_CHANNEL, channel.encode("utf-8"), b"")


def delivery(count: int, channel: str, text: bytes) -> bytes:
    """h) A delivered message: type = ``count``, the channel in shortText, ``text`` and a NUL in longText."""
    if not MESSAGE_COUNT_BASE <= count <= MESSAGE_COUNT_MAX:
        raise ValueError(f"message counter {count} out of range")
    name = channel.encode("utf-8")
    if len(name) > SHORT_TEXT_SIZE:
        name = b""  # a foreign topic that is no SysV channel name: none given
    return _BODY.pack(SERVER_ID, count, name, text[:MAX_DELIVERY_TEXT])


def next_count(count: int) -> int:
    """The counter after ``count``, wrapping from the largest C int back to the base."""
    return MESSAGE_COUNT_BASE if count >= MESSAGE_COUNT_MAX else count + 1


def delivery_text(payload: Any) -> bytes:
    """The longText of a hub payload: a string as itself, other JSON as compact JSON; cut to fit.

    The cut keeps at most :data:`MAX_DELIVERY_TEXT` bytes and never splits a
    UTF-8 character. Raises TypeError for a payload that is not JSON.
    """
    if isinstance(payload, str):
        data = payload.encode("utf-8", "replace")  # a lone surrogate becomes "?"
    else:
        data = binaryjson.dumps(payload)  # bytes as WAMP JSON's "\u0000" + base64 string
    if len(data) <= MAX_DELIVERY_TEXT:
        return data
    cut = MAX_DELIVERY_TEXT
    # Back up over continuation bytes (10xxxxxx) to the start of the cut character.
    while cut > 0 and data[cut] & 0xC0 == 0x80:
        cut -= 1
    return data[:cut]
