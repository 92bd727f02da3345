"""The System V wire: the C header and the Python codec agree, and decoding follows docs/sysv.md."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubclub.frontends.sysv.codec import (
    BODY_FORMAT,
    BODY_SIZE,
    MAX_DELIVERY_TEXT,
    MESSAGE_COUNT_BASE,
    MESSAGE_COUNT_MAX,
    SERVER_ID,
    STRUCT_FORMAT,
    Block,
    Connect,
    Login,
    Logout,
    Publish,
    Quit,
    RegisterChannel,
    Signal,
    Subscribe,
    SysVDecodeError,
    Unblock,
    Unsubscribe,
    decode_request,
    delivery,
    delivery_text,
    new_channel,
    next_count,
    pack,
    reply,
    unpack,
)

HEADER = Path(__file__).resolve().parent.parent / "examples" / "sysv" / "pubsubclub_sysv.h"
#: Every signal name of the spec (section 6 and the scenarios of section 8).
SPEC_SIGNALS = {
    "CONNECTION",
    "LOGIN",
    "LOGOUT",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "MESSAGE",
    "MSGREG",
    "BLOCK",
    "UNBLOCK",
    "QUIT",
    "OPERATION_SUCCESS",
    "INVALID_USERNAME",
    "SENDER_NOT_RECOGNIZED",
    "SERVER_OVERFLOW",
    "UNAVAILABLE",
    "NEW_CHANNEL",
    "NO_CHANNEL",
}
PID = 4242


def header_constants() -> dict[str, int]:
    """``#define NAME <integer>`` lines of the shipped header."""
    found = re.findall(r"^#define\s+([A-Z_]+)\s+(0x[0-9a-fA-F]+|\d+)\s*$", HEADER.read_text(), re.MULTILINE)
    return {name: int(value, 0) for name, value in found}


def request(type: int, short: bytes = b"", long: bytes = b"", sender: int = PID) -> bytes:
    """A client message as the C struct would carry it."""
    return pack(sender, type, short, long)


def strcpy_layout(name: bytes) -> tuple[bytes, bytes]:
    """shortText and longText after ``strcpy(m.shortText, name)`` into a zeroed struct."""
    raw = (name + b"\0").ljust(16 + 256, b"\0")
    return raw[:16], raw[16:]


# -- one source of truth ---------------------------------------------------------------------


def test_header_names_every_spec_signal_with_the_python_values() -> None:
    """The header defines exactly the spec's signal names, each with the Signal enum's value."""
    constants = header_constants()
    assert {s.name for s in Signal} == SPEC_SIGNALS
    for signal in Signal:
        assert constants.get(signal.name) == signal.value, signal.name
    assert constants["MESSAGE_COUNT_BASE"] == MESSAGE_COUNT_BASE
    assert constants["SERVER_ID"] == SERVER_ID
    assert constants["SHORT_TEXT_SIZE"] == 16 and constants["LONG_TEXT_SIZE"] == 256
    assert constants["PUBSUBCLUB_SYSV_KEY"] == 0x420


def test_every_signal_code_is_below_the_message_count_base() -> None:
    """Deliveries (type >= MESSAGE_COUNT_BASE) can never be taken for a signal."""
    assert all(0 < s < MESSAGE_COUNT_BASE for s in Signal)
    assert len({s.value for s in Signal}) == len(Signal)


def test_struct_layout_matches_the_compiled_header(tmp_path: Path) -> None:
    """sizeof, MESSAGE_SIZE and every field offset of the C struct equal the Python struct's."""
    assert shutil.which("gcc") is not None, "gcc is needed to compile the header (make test has it)"
    probe = tmp_path / "probe.c"
    probe.write_text(
        '#include <stdio.h>\n#include <stddef.h>\n#include "pubsubclub_sysv.h"\n'
        "int main(void) {\n"
        '  printf("%zu %zu %zu %zu %zu %zu %zu\\n", sizeof(struct message), MESSAGE_SIZE,\n'
        "    offsetof(struct message, receiver), offsetof(struct message, sender),\n"
        "    offsetof(struct message, type), offsetof(struct message, shortText),\n"
        "    offsetof(struct message, longText));\n"
        "  return 0;\n}\n"
    )
    binary = tmp_path / "probe"
    subprocess.run(
        ["gcc", "-std=c11", "-Wall", "-Werror", "-I", str(HEADER.parent), "-o", str(binary), str(probe)], check=True
    )
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout.split()
    size, message_size, *offsets = map(int, out)
    assert size == struct.calcsize(STRUCT_FORMAT)
    assert message_size == BODY_SIZE == struct.calcsize(BODY_FORMAT) == 280
    assert offsets == [0, *(struct.calcsize(f) for f in ("@l0i", "@li0i", "@lii0s", "@lii16s"))]


# -- decoding requests ------------------------------------------------------------------------


def test_each_client_signal_decodes_to_its_request() -> None:
    """Every scenario's client message decodes to its dataclass with the spec's fields."""
    assert decode_request(request(Signal.CONNECTION)) == Connect(PID)
    assert decode_request(request(Signal.LOGIN, b"alice")) == Login(PID, b"alice")
    assert decode_request(request(Signal.LOGOUT)) == Logout(PID)
    assert decode_request(request(Signal.SUBSCRIBE, b"news", b"5")) == Subscribe(PID, "news", 5)
    assert decode_request(request(Signal.SUBSCRIBE, b"news", b" -1 ")) == Subscribe(PID, "news", -1)
    assert decode_request(request(Signal.SUBSCRIBE, b"news")) == Subscribe(PID, "news", 0)
    assert decode_request(request(Signal.UNSUBSCRIBE, b"news")) == Unsubscribe(PID, "news")
    assert decode_request(request(Signal.MSGREG, b"news")) == RegisterChannel(PID, "news")
    text = "[news] [alice]: zażółć"
    assert decode_request(request(Signal.MESSAGE, b"news", text.encode())) == Publish(PID, "news", text)
    assert decode_request(request(Signal.BLOCK, b"bob")) == Block(PID, b"bob")
    assert decode_request(request(Signal.UNBLOCK, b"bob")) == Unblock(PID, b"bob")
    assert decode_request(request(Signal.QUIT)) == Quit(PID)


def test_nick_rules_with_c_layouts() -> None:
    """3 to 16 bytes; a 16-byte nick fills shortText unterminated; strcpy of 17+ spills into longText: invalid."""
    assert decode_request(request(Signal.LOGIN, b"abc")) == Login(PID, b"abc")
    assert decode_request(request(Signal.LOGIN, b"ab")) == Login(PID, None)
    assert decode_request(request(Signal.LOGIN, b"")) == Login(PID, None)
    sixteen = b"sixteen-chars-ok"
    assert len(sixteen) == 16
    assert decode_request(request(Signal.LOGIN, *strcpy_layout(sixteen))) == Login(PID, sixteen)
    assert decode_request(request(Signal.LOGIN, sixteen)) == Login(PID, sixteen)  # strncpy, zeroed struct
    for long_nick in (b"seventeen-chars-x", b"a-very-long-nickname-of-thirty-two"):
        assert decode_request(request(Signal.LOGIN, *strcpy_layout(long_nick))) == Login(PID, None)
    # BLOCK and UNBLOCK name users the same way.
    assert decode_request(request(Signal.BLOCK, *strcpy_layout(b"seventeen-chars-x"))) == Block(PID, None)
    assert decode_request(request(Signal.UNBLOCK, *strcpy_layout(sixteen))) == Unblock(PID, sixteen)


def test_channel_names() -> None:
    """1 to 16 bytes of UTF-8, not starting with '$'; where longText is used a 16-byte name is complete."""
    assert decode_request(request(Signal.MSGREG, b"")) == RegisterChannel(PID, None)
    assert decode_request(request(Signal.MSGREG, b"$tep.broadcast")) == RegisterChannel(PID, None)
    assert decode_request(request(Signal.MSGREG, b"\xff\xfe")) == RegisterChannel(PID, None)
    assert decode_request(request(Signal.MSGREG, *strcpy_layout(b"x" * 17))) == RegisterChannel(PID, None)
    assert decode_request(request(Signal.MSGREG, "kanał".encode())) == RegisterChannel(PID, "kanał")
    full = b"c" * 16
    assert decode_request(request(Signal.SUBSCRIBE, full, b"3")) == Subscribe(PID, "c" * 16, 3)
    assert decode_request(request(Signal.MESSAGE, full, b"hi")) == Publish(PID, "c" * 16, "hi")
    assert decode_request(request(Signal.UNSUBSCRIBE, *strcpy_layout(full))) == Unsubscribe(PID, "c" * 16)


def test_a_text_of_256_bytes_has_no_terminator_and_is_whole() -> None:
    """The spec allows 256 characters: longText full, no NUL."""
    assert decode_request(request(Signal.MESSAGE, b"news", b"x" * 256)) == Publish(PID, "news", "x" * 256)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "truncated"),
        (pack(PID, Signal.LOGIN, b"alice")[:100], "truncated"),
        (pack(PID, Signal.LOGIN, b"alice") + b"\0", "oversized"),
        (pack(1, Signal.LOGIN, b"alice"), "bad_sender"),
        (pack(0, Signal.LOGIN, b"alice"), "bad_sender"),
        (pack(-5, Signal.LOGIN, b"alice"), "bad_sender"),
        (pack(PID, 0), "unknown_type"),
        (pack(PID, 11), "unknown_type"),
        (pack(PID, Signal.OPERATION_SUCCESS), "unknown_type"),
        (pack(PID, MESSAGE_COUNT_BASE), "unknown_type"),
        (pack(PID, Signal.SUBSCRIBE, b"news", b"lots"), "bad_quantity"),
        (pack(PID, Signal.SUBSCRIBE, b"news", b"99999999999"), "bad_quantity"),
        (pack(PID, Signal.SUBSCRIBE, b"news", b"1_000"), "bad_quantity"),
        (pack(PID, Signal.MESSAGE, b"news", b"caf\xe9"), "bad_text"),
    ],
)
def test_unusable_messages_raise_one_error_type(data: bytes, reason: str) -> None:
    """Wrong size, impossible sender, unknown type, garbage quantity or text: SysVDecodeError with a reason."""
    with pytest.raises(SysVDecodeError) as caught:
        decode_request(data)
    assert caught.value.reason == reason


@settings(max_examples=500)
@given(st.binary(max_size=400))
def test_random_bytes_decode_or_raise_the_declared_error(data: bytes) -> None:
    """Anything at all: a request or SysVDecodeError, nothing else."""
    try:
        decode_request(data)
    except SysVDecodeError:
        pass


@settings(max_examples=500)
@given(st.integers(2, 2**31 - 1), st.integers(-(2**31), 2**31 - 1), st.binary(max_size=16), st.binary(max_size=256))
def test_random_messages_of_the_right_size_decode_or_raise_the_declared_error(
    sender: int, type: int, short: bytes, long: bytes
) -> None:
    """A well-sized message with any fields: a request or SysVDecodeError."""
    try:
        decoded = decode_request(pack(sender, type, short, long))
    except SysVDecodeError:
        return
    assert decoded.sender == sender


# -- the server's messages --------------------------------------------------------------------


def test_server_messages_have_sender_1_and_the_spec_size() -> None:
    """Replies, NEW_CHANNEL and deliveries: BODY_SIZE bytes, sender 1."""
    for signal in Signal:
        if signal > Signal.QUIT:
            assert unpack(reply(signal)) == unpack(pack(1, signal))
    announced = unpack(new_channel("news"))
    assert (announced.sender, announced.type, announced.short_text.rstrip(b"\0")) == (1, Signal.NEW_CHANNEL, b"news")
    sent = unpack(delivery(MESSAGE_COUNT_BASE + 7, "news", b"hello"))
    assert (sent.sender, sent.type, sent.short_text.rstrip(b"\0")) == (1, MESSAGE_COUNT_BASE + 7, b"news")
    assert sent.long_text == b"hello".ljust(256, b"\0")


def test_the_counter_wraps_to_the_base() -> None:
    """After the largest C int the counter starts again at MESSAGE_COUNT_BASE, never below."""
    assert next_count(MESSAGE_COUNT_BASE) == MESSAGE_COUNT_BASE + 1
    assert next_count(MESSAGE_COUNT_MAX) == MESSAGE_COUNT_BASE
    with pytest.raises(ValueError):
        delivery(Signal.NO_CHANNEL, "news", b"x")


def test_delivery_text_of_hub_payloads() -> None:
    """A string as itself, other JSON as compact JSON, bytes as a WAMP JSON string, not-JSON refused."""
    assert delivery_text("zażółć") == "zażółć".encode()
    assert delivery_text({"a": [1, 2], "b": None}) == b'{"a":[1,2],"b":null}'
    assert delivery_text(42) == b"42"
    assert delivery_text({"args": [1], "kwargs": {"k": "v"}}) == b'{"args":[1],"kwargs":{"k":"v"}}'
    assert delivery_text(b"\x01msgpack") == b'"\\u0000AW1zZ3BhY2s="'
    with pytest.raises(TypeError):
        delivery_text({1: "a MessagePack map with an integer key"})


@pytest.mark.parametrize("char", ["a", "ł", "€", "😀"])
def test_long_texts_are_cut_on_a_character_boundary(char: str) -> None:
    """At most 255 bytes, valid UTF-8, as many whole characters as fit; longText keeps a NUL."""
    text = "x" * 250 + char * 10
    data = delivery_text(text)
    assert len(data) <= MAX_DELIVERY_TEXT
    decoded = data.decode("utf-8")
    assert text.startswith(decoded)
    assert len(data) + len(char.encode()) > MAX_DELIVERY_TEXT
    assert unpack(delivery(MESSAGE_COUNT_BASE, "c", data)).long_text[-1:] == b"\0"
