"""Node A's paced plain PUBLISH (slice pacedA): what its path must not do per message."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import pytest

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
