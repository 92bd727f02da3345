"""Bounds on JSON-like values decoded from untrusted input (sans-IO, no dependencies but orjson).

Every decoder of client or peer input (PSC, WAMP JSON and MessagePack, NSD,
TEP) checks what it decoded against one :class:`JSONBounds`, so a value that
got past a decoder can be stored, re-encoded by any other wire format and
compared without surprises:

* **nesting depth** (arrays and objects, default 64): deep values blow up
  recursive encoders (orjson stops at 254 levels, Python's ``repr`` near
  1,000) far from where they came in;
* **integers** within signed 64 bits: what SQLite, MessagePack and orjson all
  carry exactly (orjson turns integer literals outside 64 bits into floats
  silently, and SQLite overflows above 2**63 - 1);
* **floats** finite: JSON has no NaN or Infinity, so they cannot cross a PSC
  link (MessagePack and Python's json module accept them);
* **strings** without lone surrogates (in values and keys): they are not
  valid UTF-8, so no UTF-8 encoder (orjson, SQLite, a WebSocket text frame)
  can send them on;
* only JSON types (plus ``bytes`` where the protocol has binary values).

:func:`check` is one iterative pass (no recursion, whatever the input);
:func:`loads` is ``orjson.loads`` plus the check, skipped when the raw text
cannot hold a violation (orjson already refuses lone surrogates and
non-finite numbers), so the common small message pays two ``bytes.count``
calls and one regular-expression search.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import orjson

__all__ = [
    "DEFAULT_BOUNDS",
    "BoundsError",
    "JSONBounds",
    "check",
    "check_decoded",
    "loads",
    "text_depth",
    "text_within",
]

#: Signed 64-bit integer range: what every store and wire format of the node carries exactly.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class JSONBounds:
    """Named limits on every value decoded from a client or a peer."""

    #: Most nested arrays/objects (the outermost counts as 1).
    max_depth: int = 64
    #: Smallest integer accepted.
    min_int: int = INT64_MIN
    #: Largest integer accepted.
    max_int: int = INT64_MAX

    def __post_init__(self) -> None:
        if type(self.max_depth) is not int or not 1 <= self.max_depth <= 1000:
            raise ValueError(f"JSONBounds.max_depth must be an int between 1 and 1000, not {self.max_depth!r}")
        if not (type(self.min_int) is int and type(self.max_int) is int and self.min_int <= 0 <= self.max_int):
            raise ValueError("JSONBounds.min_int <= 0 <= max_int must be ints")


DEFAULT_BOUNDS = JSONBounds()


class BoundsError(ValueError):
    """A decoded value breaks the bounds; the message says how (never the value itself)."""


_SURROGATE = re.compile("[\ud800-\udfff]")


def _string_problem(value: str) -> str | None:
    if value.isascii():
        return None
    found = _SURROGATE.search(value)
    if found is None:
        return None
    return f"a string holds a lone surrogate (U+{ord(found.group()):04X}), which is not valid Unicode text"


def _scalar_problem(value: Any, bounds: JSONBounds, binary: bool) -> str | None:
    """Why a non-container value is out of bounds, or None."""
    kind = type(value)
    if kind is str:
        return _string_problem(value)
    if kind is int:
        if bounds.min_int <= value <= bounds.max_int:
            return None
        return f"an integer of {value.bit_length()} bits is out of range (signed 64-bit at most)"
    if kind is float:
        return None if math.isfinite(value) else f"a non-finite number ({value}) is not JSON"
    if value is None or kind is bool:
        return None
    if binary and kind is bytes:
        return None
    return f"a value of type {kind.__name__} is not JSON"


def check(value: Any, bounds: JSONBounds = DEFAULT_BOUNDS, *, binary: bool = False) -> None:
    """Raise :class:`BoundsError` if ``value`` breaks ``bounds``; one iterative pass.

    ``binary`` also accepts ``bytes`` values (WAMP's binary payloads).
    """
    _check(value, bounds, binary, 1)


def _check(value: Any, bounds: JSONBounds, binary: bool, top_depth: int) -> None:
    """:func:`check`, with ``value`` itself at ``top_depth`` (below 1 for a protocol's wrapper levels)."""
    kind = type(value)
    if kind is not list and kind is not dict:
        problem = _scalar_problem(value, bounds, binary)
        if problem is not None:
            raise BoundsError(problem)
        return
    max_depth = bounds.max_depth
    lo, hi = bounds.min_int, bounds.max_int
    stack: list[tuple[Any, int]] = [(value, top_depth)]
    while stack:
        container, depth = stack.pop()
        if depth > max_depth:
            raise BoundsError(f"nested deeper than {max_depth} levels")
        if type(container) is dict:
            for key in container:
                # JSON keys are strings; MessagePack's may be any scalar.
                problem = _scalar_problem(key, bounds, binary)
                if problem is not None:
                    raise BoundsError(f"object key: {problem}")
            items = container.values()
        else:
            items = container
        for item in items:
            kind = type(item)
            # The common cases first, inline.
            if kind is str:
                if not item.isascii() and _SURROGATE.search(item):
                    raise BoundsError(_string_problem(item) or "lone surrogate")
            elif kind is int:
                if not lo <= item <= hi:
                    raise BoundsError(_scalar_problem(item, bounds, binary) or "integer out of range")
            elif kind is list or kind is dict:
                stack.append((item, depth + 1))
            else:
                problem = _scalar_problem(item, bounds, binary)
                if problem is not None:
                    raise BoundsError(problem)


def _int_literal(bounds: JSONBounds) -> Any:
    def parse(text: str) -> int:
        value = int(text)
        if not bounds.min_int <= value <= bounds.max_int:
            raise BoundsError(f"an integer of {value.bit_length()} bits is out of range (signed 64-bit at most)")
        return value

    return parse


def text_depth(raw: bytes, stop_above: int | None = None) -> int:
    """The deepest nesting of valid JSON text ``raw``, from its brackets outside strings.

    Every step runs in C (split, join, translate, accumulate), so it costs a
    fraction of a Python walk over the decoded value. With ``stop_above`` it
    returns as soon as the depth passes that value (hostile input stops early).
    """
    if b"\\" in raw:
        # Escaped backslashes first, then escaped quotes: what is left of '"' delimits strings.
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = b"".join(raw.split(b'"')[::2]).translate(None, _NOT_BRACKETS)
    step = _DEPTH_STEP.__getitem__
    deepest = depth = 0
    for start in range(0, len(brackets), _CHUNK):
        levels = list(accumulate(map(step, brackets[start : start + _CHUNK]), initial=depth))
        depth = levels[-1]
        deepest = max(deepest, max(levels))
        if stop_above is not None and deepest > stop_above:
            break
    return deepest


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_OPENERS = bytes(b for b in range(256) if b not in b"[{\n")
_DEPTH_STEP = [1 if chr(b) in "[{" else -1 if chr(b) in "]}" else 0 for b in range(256)]
#: Brackets looked at between two checks of ``stop_above``.
_CHUNK = 65_536
#: Maps ASCII digits to "1" and every other byte to "0": a run of 19 digits is then one ``find``.
_DIGIT_MASK = bytes(49 if 48 <= b <= 57 else 48 for b in range(256))
_LONG_RUN = b"1" * 19


def text_within(raw: bytes, bounds: JSONBounds = DEFAULT_BOUNDS, wrapper_depth: int = 0) -> bool:
    """True when no value ``orjson.loads`` reads from a line of ``raw`` can break ``bounds``: none needs a check.

    ``raw`` is one JSON text or several, one per line (a PSC batch frame), so
    one call stands for a :func:`check_decoded` of every line. True needs no
    run of 19 digits (the only way to an integer beyond 64 bits) and no line
    with more than ``max_depth + wrapper_depth`` opening brackets (a bound on
    its depth, whatever its strings hold). False says only that some line
    may break them: :func:`check_decoded` on each value tells.
    """
    if raw.translate(_DIGIT_MASK).find(_LONG_RUN) >= 0:
        return False
    if b"\n" not in raw:
        # One line (a lone message): its opening brackets counted in place, without the copies below.
        return raw.count(b"[") + raw.count(b"{") <= bounds.max_depth + wrapper_depth
    # Only each line's opening brackets are kept: all in C, a fraction of text_depth's cost.
    return max(map(len, raw.translate(None, _NOT_OPENERS).split(b"\n"))) <= bounds.max_depth + wrapper_depth


def check_decoded(
    data: bytes | str, value: Any, bounds: JSONBounds = DEFAULT_BOUNDS, *, wrapper_depth: int = 0
) -> None:
    """Check ``value``, which ``orjson.loads`` just read from ``data``; raise :class:`BoundsError`.

    orjson already refuses lone surrogates and non-finite numbers and reads
    only JSON types, so what is left is depth, measured on the text
    (:func:`text_depth`, only when it has enough brackets), and integers,
    which need 19 digits in a row to break the bounds (then the value is
    walked and the literals read again). ``wrapper_depth`` levels around the
    checked content (a protocol's own envelope array) do not count toward
    ``max_depth``.
    """
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    limit = bounds.max_depth + wrapper_depth
    if raw.translate(_DIGIT_MASK).find(_LONG_RUN) < 0:
        if raw.count(b"[") + raw.count(b"{") > limit and text_depth(raw, limit) > limit:
            raise BoundsError(f"nested deeper than {bounds.max_depth} levels")
        return
    _check(value, bounds, False, 1 - wrapper_depth)
    # orjson reads integer literals outside 64 bits as floats: find them in
    # the text. Rare (19+ digits in a row), so the slower parser is fine
    # here; the depth is already bounded, so it cannot recurse too far.
    try:
        json.loads(raw, parse_int=_int_literal(bounds))
    except BoundsError:
        raise
    except (ValueError, RecursionError) as e:  # orjson read it; should not happen
        raise BoundsError(f"number not readable: {type(e).__name__}") from None


def loads(data: bytes | str, bounds: JSONBounds = DEFAULT_BOUNDS) -> Any:
    """``orjson.loads(data)`` checked against ``bounds``.

    Raises ``orjson.JSONDecodeError`` for text that is not JSON (lone
    surrogates and non-finite numbers included) and :class:`BoundsError` for
    JSON beyond the bounds; both are ``ValueError``.
    """
    value = orjson.loads(data)
    check_decoded(data, value, bounds)
    return value
