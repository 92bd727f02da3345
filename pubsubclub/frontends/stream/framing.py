"""The stream protocol's framing: where a JSON header ends, and reading it (sans-IO).

The spec finds the end of a header "by counting brackets"; :class:`HeaderScanner`
does that while tracking JSON strings and their escapes, so a ``}`` or a quote
inside a topic, or a payload that begins with ``{``, never ends or starts a header
early. :func:`_parse_header` reads one header within the JSON bounds, accepting a
comma before a closing ``}`` or ``]`` (the spec's own ``Unsubscribe`` example has
one).
"""

from __future__ import annotations

import re
from typing import Any

from pubsubclub.core import jsonbounds
from pubsubclub.core.jsonbounds import BoundsError, JSONBounds
from pubsubclub.frontends.stream.messages import ErrorCode, StreamFramingError

# -- framing ---------------------------------------------------------------------------------------

_WHITESPACE = b" \t\r\n"
_OPEN = frozenset(b"{[")
_CLOSE = frozenset(b"}]")
_QUOTE = ord('"')
_BACKSLASH = ord("\\")
#: A comma, optional whitespace, then a closing bracket (only applied outside strings, see _lenient).
_TRAILING_COMMA = re.compile(rb",(\s*[}\]])")


class HeaderScanner:
    """Finds where a JSON header ends by counting brackets outside strings; incremental."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._buf = bytearray()
        self._depth = 0
        self._in_string = False
        self._escaped = False
        #: A comma outside strings was seen (the lenient retry is only worth it then).
        self.saw_comma = False

    def feed(self, data: bytes | bytearray | memoryview, start: int) -> int | None:
        """Scan ``data[start:]``; the index just past the header's end, or None when more is needed.

        Leading whitespace is skipped; the first other byte must be ``{``.
        """
        depth, in_string, escaped = self._depth, self._in_string, self._escaped
        buf = self._buf
        i, end = start, len(data)
        while i < end:
            byte = data[i]
            i += 1
            if not buf:
                if byte in _WHITESPACE:
                    continue
                if byte != 0x7B:  # "{"
                    raise StreamFramingError(
                        ErrorCode.BAD_REQUEST, f"expected a JSON header starting with '{{', got {bytes([byte])!r}"
                    )
            buf.append(byte)
            if in_string:
                if escaped:
                    escaped = False
                elif byte == _BACKSLASH:
                    escaped = True
                elif byte == _QUOTE:
                    in_string = False
            elif byte == _QUOTE:
                in_string = True
            elif byte in _OPEN:
                depth += 1
            elif byte in _CLOSE:
                depth -= 1
                if depth == 0:
                    self._depth, self._in_string, self._escaped = 0, False, False
                    return i
            elif byte == 0x2C:  # ","
                self.saw_comma = True
            if len(buf) > self._max:
                raise StreamFramingError(ErrorCode.TOO_LARGE, f"header longer than {self._max} bytes")
        self._depth, self._in_string, self._escaped = depth, in_string, escaped
        return None

    def take(self) -> bytes:
        """The header scanned so far (call after :meth:`feed` returned an index); resets the scanner."""
        header = bytes(self._buf)
        self._buf.clear()
        self.saw_comma = False
        return header

    @property
    def idle(self) -> bool:
        """No header is half read."""
        return not self._buf

    @property
    def pending(self) -> int:
        """Bytes of the header half read."""
        return len(self._buf)

    def clear(self) -> None:
        """Forget a half-read header."""
        self._buf.clear()
        self._depth, self._in_string, self._escaped = 0, False, False
        self.saw_comma = False


def _lenient(header: bytes) -> bytes:
    """``header`` without commas that directly precede a closing bracket, outside strings."""
    out = bytearray()
    in_string = escaped = False
    pending_comma = -1
    for byte in header:
        if in_string:
            if escaped:
                escaped = False
            elif byte == _BACKSLASH:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
            out.append(byte)
            continue
        if byte in _CLOSE and pending_comma >= 0:
            del out[pending_comma]
        if byte == 0x2C:
            pending_comma = len(out)
        elif byte not in _WHITESPACE:
            pending_comma = -1
        if byte == _QUOTE:
            in_string = True
        out.append(byte)
    return bytes(out)


def _parse_header(header: bytes, bounds: JSONBounds, lenient: bool) -> dict[str, Any]:
    try:
        value = jsonbounds.loads(header, bounds)
    except BoundsError as e:
        raise StreamFramingError(ErrorCode.BAD_REQUEST, f"header out of bounds: {e}") from None
    except ValueError:
        value = None
        if lenient:
            try:
                value = jsonbounds.loads(_lenient(header), bounds)
            except ValueError:
                value = None
        if value is None:
            raise StreamFramingError(ErrorCode.BAD_REQUEST, "header is not valid JSON") from None
    if not isinstance(value, dict):
        raise StreamFramingError(ErrorCode.BAD_REQUEST, "header is not a JSON object")
    return value
