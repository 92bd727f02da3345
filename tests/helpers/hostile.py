"""Hypothesis strategies for hostile input: what a client or peer can put on the wire to hurt a decoder.

Values reach past every bound of :mod:`pubsubclub.core.jsonbounds` (deep nesting,
integers beyond 64 bits, NaN and infinities, lone surrogates in values and
keys); :func:`json_text` writes them the way a hostile client can (Python's
json module: ``NaN``/``Infinity`` literals, ``\\ud800`` escapes, any integer).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

#: Integers at and around every edge that matters (64-bit signed and unsigned, 2**53).
edge_ints = st.sampled_from(
    [0, -1, 2**53, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, -(2**64), 10**30, -(10**30)]
)
#: Text with lone surrogates now and then.
hostile_text = st.text(st.characters(), max_size=6) | st.sampled_from(["a\ud800", "\udc00", "ok\udfffok", "x"])
hostile_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | edge_ints
    | st.floats()
    | st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308])
    | hostile_text
)


def _deep(levels: int, leaf: Any, objects: bool) -> Any:
    value = leaf
    for i in range(levels):
        value = {"k": value} if objects and i % 2 else [value]
    return value


#: One value nested 50 to 300 levels deep (arrays, or arrays and objects).
deep_values = st.builds(_deep, st.integers(50, 300), hostile_scalars, st.booleans())
#: Values breaking any of the bounds (or none), nested a little or a lot.
hostile_values = st.recursive(
    hostile_scalars | deep_values,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=12,
)


def json_text(value: Any) -> bytes:
    """``value`` as a hostile client writes it: NaN literals, surrogate escapes, any integer."""
    return json.dumps(value, allow_nan=True).encode()
