"""The shared JSON bounds: depth, 64-bit integers, finite floats, no lone surrogates, JSON types only."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsubclub.core import jsonbounds
from pubsubclub.core.jsonbounds import BoundsError, JSONBounds, check, check_decoded, loads, text_depth


def nested(depth: int, leaf: Any = 0) -> Any:
    """``depth`` arrays around ``leaf``, built without recursion."""
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


# -- the reference: a plain recursive statement of the rules ---------------------


def violates(value: Any, depth: int = 0, max_depth: int = 64) -> bool:
    """True when ``value`` breaks the default bounds (small inputs only: recursive)."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int):
        return not -(2**63) <= value <= 2**63 - 1
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return depth + 1 > max_depth or any(violates(v, depth + 1, max_depth) for v in value)
    if isinstance(value, dict):
        return (
            depth + 1 > max_depth
            or any(violates(k, depth + 1, max_depth) for k in value)
            or any(violates(v, depth + 1, max_depth) for v in value.values())
        )
    return True


#: Any text, lone surrogates included.
any_text = st.text(st.characters(), max_size=8)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64])
    | st.floats()
    | any_text
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=20,
)


# -- exact edges -------------------------------------------------------------------


def test_depth_edge_is_exact() -> None:
    """64 nested containers pass, 65 do not; a tighter bound moves the edge."""
    check(nested(64))
    with pytest.raises(BoundsError, match="nested deeper than 64 levels"):
        check(nested(65))
    check(nested(3), JSONBounds(max_depth=3))
    with pytest.raises(BoundsError, match="deeper than 3"):
        check(nested(4), JSONBounds(max_depth=3))


def test_very_deep_values_raise_bounds_error_not_recursion_error() -> None:
    """The walk is iterative: 100,000 levels are refused like 65."""
    with pytest.raises(BoundsError):
        check(nested(100_000))


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (2**63 - 1, True),
        (-(2**63), True),
        (2**63, False),
        (-(2**63) - 1, False),
        (2**64 - 1, False),
        (10**400, False),
        (True, True),
        (1.5e308, True),
        (math.inf, False),
        (-math.inf, False),
        (math.nan, False),
        ("plain", True),
        ("astral \U0001f600 ok", True),
        ("a\ud800", False),
        ("\udfff", False),
        (None, True),
        (b"raw", False),
        ((1, 2), False),
        ({1, 2}, False),
    ],
)
def test_scalars_and_types(value: Any, ok: bool) -> None:
    """Each rule on its own, at the top level and nested in an array and an object."""
    for wrapped in (value, [value], {"k": [value]}):
        if ok:
            check(wrapped)
        else:
            with pytest.raises(BoundsError):
                check(wrapped)


def test_keys_are_checked_like_values() -> None:
    """Object keys with lone surrogates (or non-finite MessagePack keys) are refused."""
    with pytest.raises(BoundsError, match="object key: a string holds a lone surrogate"):
        check({"a\ud800": 1})
    with pytest.raises(BoundsError, match="object key"):
        check({math.nan: 1})


def test_bytes_only_where_the_protocol_has_binary() -> None:
    """``binary=True`` (WAMP) accepts bytes values; JSON protocols do not."""
    check({"blob": b"\x00\xff"}, binary=True)
    with pytest.raises(BoundsError, match="type bytes is not JSON"):
        check({"blob": b"\x00\xff"})


def test_messages_name_the_problem_never_the_value() -> None:
    """An error text is short and safe: no 2**1000-digit number, no repr of a deep value."""
    with pytest.raises(BoundsError) as info:
        check([2**1000])
    assert str(info.value) == "an integer of 1001 bits is out of range (signed 64-bit at most)"


@pytest.mark.parametrize(
    "text",
    [
        b"18446744073709551616",  # 2**64: orjson reads it as a float
        b"-9223372036854775809",  # -2**63 - 1: likewise
        b"[1, 9223372036854775808]",  # 2**63: orjson keeps it as an int
        b'{"n": 123456789012345678901234567890}',
    ],
)
def test_loads_refuses_integer_literals_beyond_64_bits(text: bytes) -> None:
    """Integer literals outside signed 64 bits are refused even where orjson would read a float."""
    with pytest.raises(BoundsError, match="out of range"):
        loads(text)


def test_loads_keeps_long_digit_strings_and_big_floats() -> None:
    """Long digit runs inside strings, and float literals, are not integers."""
    assert loads(b'["12345678901234567890123", 1.8446744073709552e19]') == [
        "12345678901234567890123",
        1.8446744073709552e19,
    ]


@pytest.mark.parametrize("text", [b"NaN", b"[Infinity]", b"1e400", b'"a\\ud800"', b'{"\\udc00": 1}'])
def test_loads_refuses_what_json_cannot_say(text: bytes) -> None:
    """Non-finite numbers and lone surrogate escapes are not JSON (orjson's error, a ValueError)."""
    with pytest.raises(orjson.JSONDecodeError):
        loads(text)


def test_check_decoded_allows_for_the_protocol_wrapper() -> None:
    """``wrapper_depth`` levels of the protocol's own array do not count against the payload."""
    frame = [301, "t", nested(64)]
    text = orjson.dumps(frame)
    check_decoded(text, frame, wrapper_depth=1)
    deeper = [301, "t", nested(65)]
    with pytest.raises(BoundsError):
        check_decoded(orjson.dumps(deeper), deeper, wrapper_depth=1)


def test_bounds_are_validated() -> None:
    """A depth outside 1..1000 or an integer range not around 0 is refused."""
    for kwargs in ({"max_depth": 0}, {"max_depth": 1001}, {"min_int": 1}, {"max_int": -1}):
        with pytest.raises(ValueError, match="JSONBounds"):
            JSONBounds(**kwargs)
    assert jsonbounds.DEFAULT_BOUNDS == JSONBounds(64, -(2**63), 2**63 - 1)


# -- properties ----------------------------------------------------------------------


@given(values)
def test_check_agrees_with_the_rules(value: Any) -> None:
    """The iterative walk refuses exactly what the recursive statement of the rules refuses."""
    if violates(value):
        with pytest.raises(BoundsError):
            check(value)
    else:
        check(value)


@given(values, st.integers(1, 5))
def test_depth_bound_agrees_with_the_rules(value: Any, max_depth: int) -> None:
    """With a small depth bound the walk still agrees with the rules."""
    if violates(value, max_depth=max_depth):
        with pytest.raises(BoundsError):
            check(value, JSONBounds(max_depth=max_depth))
    else:
        check(value, JSONBounds(max_depth=max_depth))


@given(values)
def test_loads_of_any_encodable_value(value: Any) -> None:
    """Whatever orjson can write, loads reads back within the bounds or refuses with a ValueError."""
    try:
        text = orjson.dumps(value)
    except TypeError:
        return  # not encodable (surrogates, integers beyond 64 bits, too deep)
    try:
        decoded = loads(text)
    except BoundsError:
        assert violates(value)
        return
    check(decoded)


@given(st.binary(max_size=200) | st.text(max_size=100).map(str.encode))
def test_loads_of_any_bytes_raises_only_value_errors(data: bytes) -> None:
    """Random bytes give a value within the bounds or a ValueError, nothing else."""
    try:
        value = loads(data)
    except ValueError:
        return
    check(value)


def depth_of(value: Any) -> int:
    """Nesting depth of a decoded value (small inputs only: recursive)."""
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


#: Text that looks like JSON structure from inside a string.
tricky_text = st.text(st.sampled_from('[]{}"\\\\ax\u00e9'), max_size=8)


@given(
    st.recursive(
        st.none() | st.integers(-5, 5) | tricky_text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3),
        max_leaves=25,
    )
)
def test_text_depth_matches_the_decoded_depth(value: Any) -> None:
    """Depth measured on the text equals the value's depth, whatever brackets, quotes or backslashes strings hold."""
    assert text_depth(orjson.dumps(value)) == depth_of(value)
    assert text_depth(json_text_spaced(value)) == depth_of(value)


def json_text_spaced(value: Any) -> bytes:
    """``value`` as indented JSON with escaped non-ASCII (other spellings of the same document)."""
    import json

    return json.dumps(value, indent=1, ensure_ascii=True).encode()


# -- one check for a PSC batch frame ---------------------------------------------------


def test_text_within_passes_only_frames_whose_every_line_passes() -> None:
    """A frame is within the bounds when each line is; one deep line or one long number makes it not."""
    good = [orjson.dumps([301, "t", nested(63)]), orjson.dumps([301, "t", {"n": -(10**18 - 1)}])]
    assert jsonbounds.text_within(b"\n".join(good * 100), wrapper_depth=1)
    for bad in (orjson.dumps([301, "t", nested(65)]), b'[301,"t",18446744073709551616]'):
        with pytest.raises(BoundsError):
            check_decoded(bad, orjson.loads(bad), wrapper_depth=1)
        assert not jsonbounds.text_within(b"\n".join([*good, bad, *good]), wrapper_depth=1)


@given(st.lists(values, min_size=1, max_size=6), st.integers(1, 6))
def test_a_frame_within_the_bounds_holds_only_lines_within_them(lines: list[Any], max_depth: int) -> None:
    """Whenever the whole frame passes, each line passes check_decoded on its own: the batch shortcut is safe."""
    bounds = JSONBounds(max_depth=max_depth)
    texts = []
    for value in lines:
        try:
            texts.append(orjson.dumps([301, value]))
        except TypeError:
            return  # not encodable: no such frame
    if jsonbounds.text_within(b"\n".join(texts), bounds, wrapper_depth=1):
        for text in texts:
            check_decoded(text, orjson.loads(text), bounds, wrapper_depth=1)


_LINES = st.binary(max_size=80) | st.lists(values, max_size=4).map(lambda v: json.dumps(v).encode())


@given(_LINES, st.integers(1, 6), st.integers(0, 2))
def test_a_lone_line_is_judged_as_the_frame_scan_judges_it(raw: bytes, max_depth: int, wrapper: int) -> None:
    """text_within's one-line count (no copies) answers what the per-line scan answers, for any bytes."""
    bounds = JSONBounds(max_depth=max_depth)
    scan = raw.translate(jsonbounds._DIGIT_MASK).find(jsonbounds._LONG_RUN) < 0 and max(
        map(len, raw.translate(None, jsonbounds._NOT_OPENERS).split(b"\n"))
    ) <= max_depth + wrapper
    assert jsonbounds.text_within(raw, bounds, wrapper_depth=wrapper) is scan
    assert jsonbounds.text_within(raw + b"\n" + raw, bounds, wrapper_depth=wrapper) is scan
