"""The WAMP JSON codec on the hot path (orjson) against Autobahn's: same bytes, same values, same refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from autobahn.wamp.serializer import JsonObjectSerializer
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubclub.jsonbounds import JSONBounds
from pubsubclub.wamp.transport import _BoundedJsonObjectSerializer

OURS = _BoundedJsonObjectSerializer(JSONBounds())
THEIRS = JsonObjectSerializer()

#: JSON values as WAMP carries them: int64 integers, finite floats, text without lone surrogates, and bytes.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    # A string starting with NUL *is* the binary convention (Autobahn reads it as base64 too).
    | st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20).filter(lambda t: t[:1] != "\x00")
    | st.binary(max_size=20)
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8), children, max_size=4),
    max_leaves=20,
)
#: Message-shaped lists: a type code, a request id, options, a URI, args, kwargs.
messages = st.tuples(
    st.sampled_from([1, 16, 32, 36, 6]),
    st.integers(min_value=0, max_value=2**53),
    st.dictionaries(st.text(max_size=8), scalars, max_size=3),
    st.text(alphabet="abc.", min_size=1, max_size=20),
    st.lists(values, max_size=3),
    st.dictionaries(st.text(max_size=8), values, max_size=3),
).map(list)


@settings(max_examples=400)
@given(messages)
def test_encoding_reads_back_as_autobahns(message: list[Any]) -> None:
    """Every message encodes to JSON that any reader (Python's, Autobahn's) reads as Autobahn's encoding.

    The bytes are Autobahn's too, except that a float may be written in another
    valid form of the same double (orjson: ``0.00001``, Python: ``1e-05``).
    """
    ours, theirs = OURS.serialize(message), THEIRS.serialize(message)
    assert json.loads(ours) == json.loads(theirs)
    assert THEIRS.unserialize(ours) == THEIRS.unserialize(theirs)


@settings(max_examples=400)
@given(messages)
def test_decoding_gives_autobahns_values(message: list[Any]) -> None:
    """Decoding Autobahn's bytes gives the same values (bytes included) as Autobahn's decoder."""
    data = THEIRS.serialize(message)
    assert OURS.unserialize(data) == THEIRS.unserialize(data)


def _outcome(serializer: Any, data: bytes) -> Any:
    try:
        return ("ok", serializer.unserialize(data))
    except Exception:
        return "refused"


@settings(max_examples=400)
@given(st.binary(max_size=40) | st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_junk_is_refused_where_autobahn_refuses_it(data: bytes) -> None:
    """Random input: both refuse it, or both read the same value (ours then also checks the bounds)."""
    ours, theirs = _outcome(OURS, data), _outcome(THEIRS, data)
    if theirs == "refused":
        assert ours == "refused"
    elif ours != "refused":
        assert ours == theirs


@pytest.mark.parametrize(
    "data",
    [b'[16,1,{},"t",["\\u0000AQI="]]', b'[16,1,{"\\u0000k":1},"t",[]]', b'[16,1,{},"t",[1.5e300,-0.0,1e-7]]'],
)
def test_binary_convention_and_floats_as_autobahn(data: bytes) -> None:
    """NUL-prefixed strings become bytes in values (not in keys); floats read the same."""
    assert OURS.unserialize(data) == THEIRS.unserialize(data)
