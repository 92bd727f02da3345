"""Node A's paced plain PUBLISH (slice pacedA): what its path must not do per message."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubclub.federation.forwarding import Forwarding
from pubsubclub.frontends.wamp import transport


def _bytes_membership_tests(function: Any) -> list[str]:
    """The ``b"..." in x`` / ``not in`` comparisons in ``function``'s source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
        and isinstance(node.left, ast.Constant)
        and isinstance(node.left.value, bytes)
    ]


@pytest.mark.parametrize(
    "function",
    [
        transport.feed_message,
        transport._BoundedJsonObjectSerializer.unserialize,
        Forwarding.local_published_plain,
        Forwarding.local_published,
    ],
    ids=lambda f: f.__qualname__,
)
def test_the_publish_path_searches_bytes_without_in(function: Any) -> None:
    """The PUBLISH path's byte searches use find: bytes ``in`` raises and clears a TypeError per check in CPython."""
    assert _bytes_membership_tests(function) == []


def test_bytes_in_raises_and_clears_an_error_that_find_does_not() -> None:
    """Why: ``b"x" in data`` tries b"x" as an integer first (the TypeError is made, then dropped); find only searches.

    Seen from Python as the error a bytes subclass of int-likeness would give: the operand is first asked for
    ``__index__``, which a plain find never asks.
    """
    asked: list[str] = []

    class Needle(bytes):
        def __index__(self) -> int:
            asked.append("__index__")
            raise TypeError("not an integer")

    data = b'[16,1,{},"t",["v"]]'
    assert (Needle(b"t") in data) is True and asked == ["__index__"]
    asked.clear()
    assert data.find(Needle(b"t")) >= 0 and asked == []


@given(st.binary(max_size=200) | st.text(alphabet="0123456789[]{}\",x", max_size=120).map(str.encode))
@settings(max_examples=400, deadline=None)
def test_one_translate_finds_the_long_digit_runs_and_the_openers_as_before(payload: bytes) -> None:
    """feed_message's one-pass pre-check (_SHAPE_MASK) decides as the digit mask plus two counts did."""
    from pubsubclub.core.jsonbounds import _DIGIT_MASK, _LONG_RUN

    before = (payload.translate(_DIGIT_MASK).find(_LONG_RUN) >= 0, payload.count(b"[") + payload.count(b"{"))
    shape = payload.translate(transport._SHAPE_MASK)
    assert (shape.find(_LONG_RUN) >= 0, shape.count(b"[")) == before


def test_the_plain_publish_pre_check_reads_the_payload_in_one_translate_and_no_count() -> None:
    """The plain PUBLISH's bounds pre-check is one translate (no count of the payload itself)."""
    source = inspect.getsource(transport.feed_message)
    assert "payload.translate(_SHAPE_MASK)" in source and "payload.count(" not in source


def test_a_reads_last_whole_frame_ends_the_read_without_another_pass() -> None:
    """A read holding one whole frame is delivered and the read ends there: the connection's state is looked at once
    (no second pass of the frame loop to find nothing left); a read of two frames still delivers both."""
    from test_wsread import DirectServer, open_server

    class Counting(DirectServer):  # type: ignore[misc, valid-type]
        looks = 0

        @property
        def failedByMe(self) -> bool:  # noqa: N802 - Autobahn's name
            type(self).looks += 1
            return bool(self.__dict__.get("_failed", False))

        @failedByMe.setter
        def failedByMe(self, value: bool) -> None:  # noqa: N802 - Autobahn's name
            self.__dict__["_failed"] = value

    def frame(text: bytes) -> bytes:
        mask = b"\x01\x02\x03\x04"
        return bytes((0x81, 0x80 | len(text))) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(text))

    protocol, _, _ = open_server(Counting)
    Counting.looks = 0
    protocol.dataReceived(frame(b'[16,1,{},"t",["v"]]'))
    assert protocol.events == [("message", b'[16,1,{},"t",["v"]]', False)] and Counting.looks == 1
    Counting.looks = 0
    protocol.dataReceived(frame(b"one") + frame(b"two"))
    assert protocol.events[1:] == [("message", b"one", False), ("message", b"two", False)] and Counting.looks == 2
    assert protocol.data == b""
